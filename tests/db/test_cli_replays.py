"""``jobs replay`` and the replays ``jobs show`` lists, against a real PostgreSQL."""

from __future__ import annotations

import json

import pytest

import runledger_sync as rl
from tests.db.test_cli_admin import EMAIL, UNKNOWN_ID, dead_lettered, succeeded
from tests.support import define, event_types, scalar


@pytest.fixture
def db(engine):
    define(engine, EMAIL, max_attempts=3)
    return engine


def replays(db) -> int:
    return scalar(db, "SELECT count(*) FROM job_replays")


def test_jobs_replay_requeues_and_records_the_replay_once_per_key(db, run):
    job = dead_lettered(db)
    argv = ("jobs", "replay", str(job.id), "--key", "INC-42", "--reason", "mailbox fixed", "--actor", "alice")

    code, out, _ = run(*argv)

    assert code == 0 and out.strip() == f"job {job.id} replayed: run 2"
    after = rl.get_job(db, job.id)
    assert (after.status, after.run_number, after.status_reason) == (rl.JobStatus.PENDING, 2, "mailbox fixed")
    [replay] = rl.list_replays(db, job.id)
    assert (replay.replay_key, replay.actor, replay.reason, replay.run_number) == ("INC-42", "alice", "mailbox fixed", 2)

    rl.cancel_job(db, job.id)
    code, out, _ = run(*argv)  # the script ran twice: the job is not run a third time

    assert code == 0 and out.strip() == f"job {job.id} was already replayed with this key: run 2, nothing requeued"
    assert rl.get_job(db, job.id).status is rl.JobStatus.CANCELED
    assert replays(db) == 1 and event_types(db, job.id).count("REQUEUED") == 1


def test_jobs_replay_json_prints_the_replay(db, run):
    job = succeeded(db)

    code, out, _ = run("jobs", "replay", str(job.id), "--key", "k", "--reason", "again", "--expect-status", "succeeded",
                       "--expect-run", "1", "--json")

    assert code == 0
    shown = json.loads(out)
    assert shown["job_id"] == str(job.id) and shown["disposition"] == "created"
    assert (shown["expected_status"], shown["expected_run_number"], shown["run_number"]) == ("SUCCEEDED", 1, 2)


@pytest.mark.parametrize(("argv", "exit_code", "code"), [
    (("--key", " ", "--reason", "why"), 2, "job.replay_key_blank"),
    (("--key", "k" * 256, "--reason", "why"), 2, "job.replay_key_too_long"),
    (("--key", "k", "--reason", ""), 2, "job.replay_reason_blank"),
    (("--key", "k", "--reason", "why", "--expect-status", "dead_lettered"), 1, "job.requeue_expectation_failed"),
])
def test_jobs_replay_refusals_print_their_code_and_change_nothing(db, run, argv, exit_code, code):
    job = succeeded(db)

    status, _, err = run("jobs", "replay", str(job.id), *argv)

    assert status == exit_code
    assert err.startswith(f"error: {code}: ")
    assert rl.get_job(db, job.id).run_number == 1 and replays(db) == 0


def test_jobs_replay_with_the_key_of_another_request_is_a_conflict(db, run):
    job = succeeded(db)
    assert run("jobs", "replay", str(job.id), "--key", "k", "--reason", "first")[0] == 0
    rl.cancel_job(db, job.id)

    code, _, err = run("jobs", "replay", str(job.id), "--key", "k", "--reason", "second")

    assert code == 1 and err.startswith("error: job.replay_idempotency_conflict: ")
    assert rl.get_job(db, job.id).status is rl.JobStatus.CANCELED and replays(db) == 1


def test_jobs_replay_needs_a_key_and_a_reason_and_a_known_job(db, run):
    code, _, err = run("jobs", "replay", UNKNOWN_ID, "--reason", "why")
    assert code == 2 and "the following arguments are required: --key" in err
    code, _, err = run("jobs", "replay", UNKNOWN_ID, "--key", "k", "--reason", "why")
    assert code == 1 and err.startswith("error: job.not_found: ")


def test_jobs_show_lists_the_jobs_replays(db, run):
    job = dead_lettered(db)
    rl.replay_job(db, job.id, replay_key="INC-42", reason="mailbox fixed", actor="alice",
                  expected_status="DEAD_LETTERED", expected_run_number=1)

    code, out, _ = run("jobs", "show", str(job.id))

    assert code == 0
    section = out.split("replays (1):\n", 1)[1].splitlines()
    assert section[0].split() == ["created_at", "run", "actor", "key", "expected", "reason"]
    assert section[1].split()[2:] == ["2", "alice", "INC-42", "DEAD_LETTERED", "1", "mailbox", "fixed"]

    code, out, _ = run("jobs", "show", str(job.id), "--json")
    assert [(r["replay_key"], r["actor"], r["run_number"]) for r in json.loads(out)["replays"]] == [("INC-42", "alice", 2)]
