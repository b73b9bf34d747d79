"""The operator commands (enqueue, jobs, dead-letters, stats) against a real PostgreSQL.

Each test runs ``cli.main([...])`` in-process, then checks both what it printed
and the rows it left behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import runledger_sync as rl
from runledger_sync import cli, testing
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.store.claim.claim import claim_jobs
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success
from tests.support import define, event_types, rows, scalar

EMAIL = "cli.email"
REPORT = "cli.report"
UNKNOWN_ID = "00000000-0000-7000-8000-000000000000"
# Jobs driven past PENDING are enqueued at the top priority so the claim that
# follows picks exactly them.
TOP = 1_000_000
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def db(engine):
    define(engine, EMAIL, max_attempts=3)
    define(engine, REPORT, max_attempts=1)
    return engine


def _finish(db, job: rl.JobRecord, *, fail: bool) -> rl.JobRecord:
    claimed = claim_jobs(db, worker_id="cli-worker", lease_ttl_seconds=60, limit=1, job_types=[job.job_type])
    assert [c.id for c in claimed] == [job.id]
    identity = LeaseIdentity.of(claimed[0]).keywords()
    if fail:
        failure = rl.JobFailure.terminal("cli.bad_input", "cannot be processed")
        return complete_job_failure(db, **identity, failure=failure, retry_delay_ms=None)
    return complete_job_success(db, **identity, completion=rl.JobCompletion.success())


def dead_lettered(db, job_type: str = EMAIL) -> rl.JobRecord:
    return _finish(db, rl.enqueue(db, job_type, {"n": 1}, priority=TOP), fail=True)


def succeeded(db, job_type: str = EMAIL) -> rl.JobRecord:
    return _finish(db, rl.enqueue(db, job_type, {"n": 1}, priority=TOP), fail=False)


def json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


# -- enqueue -------------------------------------------------------------------------


def test_enqueue_prints_the_new_jobs_id_and_stores_every_option(db, run):
    code, out, err = run("enqueue", EMAIL, '{"to": "a@b.c"}', "--priority", "7", "--delay-seconds", "60",
                         "--org", "org-1", "--idempotency-key", "k-1", "--max-attempts", "2")

    assert code == 0, err
    job = rl.get_job(db, out.strip())
    assert job is not None and str(job.id) == out.strip()
    assert (job.payload, job.priority, job.organization_id, job.idempotency_key, job.max_attempts) == (
        {"to": "a@b.c"}, 7, "org-1", "k-1", 2)
    assert job.status is rl.JobStatus.PENDING
    assert job.next_run_at > datetime.now(timezone.utc) + timedelta(seconds=30)


@pytest.mark.parametrize(("level", "logged"), [(None, []), ("full", ["ENQUEUED"]), ("transitions", [])])
def test_enqueue_writes_the_enqueued_row_at_the_event_log_level_of_the_environment(db, run, monkeypatch, level, logged):
    monkeypatch.delenv("JOBS_EVENT_LOG", raising=False)
    if level is None:
        monkeypatch.delenv("RUNLEDGER_EVENT_LOG", raising=False)
    else:
        monkeypatch.setenv("RUNLEDGER_EVENT_LOG", level)

    code, out, err = run("enqueue", EMAIL, "{}")

    assert code == 0, err
    assert event_types(db, out.strip()) == logged


def test_enqueue_stores_meta_given_as_key_value_pairs(db, run):
    code, out, err = run("enqueue", EMAIL, "{}", "--meta", "tenant=acme", "--meta", "query=a=b")

    assert code == 0, err
    assert rl.get_job(db, out.strip()).meta == {"tenant": "acme", "query": "a=b"}


@pytest.mark.parametrize(("argv", "problem"), [
    (("--meta", "s3cret"), "--meta must be KEY=VALUE, got an argument without '='"),
    (("--meta", "k=s3cret", "--meta", "k=other"), "--meta must be each key once, got 'k' twice"),
    (("--meta", "=s3cret"), "meta keys must be non-blank, got a blank key"),
])
def test_enqueue_bad_meta_is_usage_error_and_writes_nothing(db, run, argv, problem):
    code, out, err = run("enqueue", EMAIL, "{}", *argv)

    assert code == 2 and out == ""
    assert err.splitlines()[0] == f"error: job.invalid_meta: {problem}"
    assert "s3cret" not in err
    assert rl.count_jobs(db) == 0


def test_enqueue_puts_the_job_in_the_queue_and_under_the_concurrency_key_given(db, run):
    rl.configure_queue(db, "bulk")

    code, out, err = run("enqueue", EMAIL, "{}", "--queue", "bulk", "--concurrency-key", "customer:42")

    assert code == 0, err
    job = rl.get_job(db, out.strip())
    assert (job.queue, job.concurrency_key) == ("bulk", "customer:42")
    assert rows(db, "SELECT queue, execution_resource_key FROM job_queue")[0] == ("bulk", "customer:42")


@pytest.mark.parametrize(("argv", "exit_code", "code"), [
    (("--queue", "nowhere"), 1, "queue.not_found"),
    (("--queue", "   "), 2, "queue.invalid_name"),
    (("--queue", "q" * 129), 2, "queue.invalid_name"),
    (("--concurrency-key", ""), 2, "job.invalid_execution_resource_key"),
    (("--concurrency-key", "k" * 513), 2, "job.invalid_execution_resource_key"),
])
def test_enqueue_refuses_a_bad_queue_or_concurrency_key_with_its_code_and_writes_nothing(db, run, argv, exit_code,
                                                                                         code):
    got, out, err = run("enqueue", EMAIL, '{"secret": "s3cret"}', *argv)

    lines = err.splitlines()
    assert (got, out) == (exit_code, "") and lines[0].startswith(f"error: {code}: "), err
    assert lines[1].startswith("hint: ") and "s3cret" not in err
    assert rl.count_jobs(db) == 0


def test_enqueue_with_the_same_idempotency_key_prints_the_same_id(db, run):
    first = run("enqueue", EMAIL, '{"n": 1}', "--idempotency-key", "once")
    second = run("enqueue", EMAIL, '{"n": 1}', "--idempotency-key", "once")

    assert first[0] == second[0] == 0
    assert first[1] == second[1]
    assert rl.count_jobs(db) == 1


def test_enqueue_bad_json_is_usage_error_and_writes_nothing(db, run):
    code, out, err = run("enqueue", EMAIL, "{to: a}")

    assert code == 2 and out == ""
    lines = err.splitlines()
    assert lines[0].startswith("error: job.invalid_payload: ") and "valid JSON" in lines[0]
    assert lines[1].startswith("hint: ")
    assert rl.count_jobs(db) == 0


def test_enqueue_unknown_type_fails_with_its_code(db, run):
    code, out, err = run("enqueue", "no.such.type", "{}")

    assert code == 1 and out == ""
    assert err.startswith("error: job.definition_not_found_or_disabled: ")
    assert "Traceback" not in err


def test_enqueue_out_of_range_option_is_usage_error(db, run):
    code, _, err = run("enqueue", EMAIL, "{}", "--max-attempts", "0")

    assert code == 2
    assert err.startswith("error: job.invalid_argument: ")
    assert rl.count_jobs(db) == 0


# -- jobs list / show -------------------------------------------------------------------


def test_jobs_list_prints_an_aligned_table_filtered_by_status_type_and_org(db, run):
    pending = rl.enqueue(db, EMAIL, {}, organization_id="org-1")
    rl.enqueue(db, REPORT, {}, organization_id="org-2")
    dead = dead_lettered(db, REPORT)

    code, out, _ = run("jobs", "list")
    header, *lines = out.splitlines()
    assert code == 0
    assert header.split() == ["id", "type", "status", "attempt", "stage", "next_run_at", "last_error_code"]
    assert len(lines) == 3
    assert {line.index(" ") for line in lines} == {36}  # the ids fill one fixed-width column
    column = header.index("status")
    assert sorted(line[column:].split()[0] for line in lines) == ["DEAD_LETTERED", "PENDING", "PENDING"]

    _, out, _ = run("jobs", "list", "--status", "dead_lettered")
    assert [line.split()[0] for line in out.splitlines()[1:]] == [str(dead.id)]
    assert "1/1" in out and "cli.bad_input" in out

    _, out, _ = run("jobs", "list", "--type", EMAIL, "--org", "org-1")
    assert [line.split()[0] for line in out.splitlines()[1:]] == [str(pending.id)]


def test_jobs_list_json_prints_one_object_per_line_newest_first(db, run):
    older = rl.enqueue(db, EMAIL, {"n": 1})
    newer = rl.enqueue(db, EMAIL, {"n": 2})

    code, out, _ = run("jobs", "list", "--json", "--limit", "5")

    assert code == 0
    records = json_lines(out)
    assert [r["id"] for r in records] == [str(newer.id), str(older.id)]
    assert records[0]["status"] == "PENDING" and records[0]["payload"] == {"n": 2}
    assert datetime.fromisoformat(records[0]["next_run_at"]).tzinfo is not None


def test_jobs_list_and_show_json_name_the_concurrency_key_as_the_api_does(db, run):
    job = rl.enqueue(db, EMAIL, {}, concurrency_key="customer:42")

    [listed] = json_lines(run("jobs", "list", "--json")[1])
    shown = json.loads(run("jobs", "show", str(job.id), "--json")[1])["job"]

    for record in (listed, shown):
        assert record["concurrency_key"] == "customer:42" and "execution_resource_key" not in record
    assert "concurrency_key:     customer:42" in run("jobs", "show", str(job.id))[1]


def test_jobs_list_on_an_empty_queue_prints_only_the_header(db, run):
    code, out, _ = run("jobs", "list")

    assert code == 0
    assert len(out.splitlines()) == 1


def test_jobs_show_prints_the_row_attempts_and_events(db, run):
    job = dead_lettered(db)

    code, out, _ = run("jobs", "show", str(job.id))

    assert code == 0
    assert f"id:                  {job.id}" in out
    assert "status:              DEAD_LETTERED" in out
    assert "attempts (1):" in out and "TERMINAL" in out
    assert "events (3):" in out
    for event in ("ENQUEUED", "FAILED", "DEAD_LETTERED"):
        assert event in out


def test_jobs_show_lists_enqueued_first_from_the_job_row_at_the_transitions_level(db, run):
    job = succeeded(db)
    assert event_types(db, job.id) == ["SUCCEEDED"]

    code, out, _ = run("jobs", "show", str(job.id))
    listed = out.split("events (2):", 1)[1].splitlines()[2:]
    json_code, json_out, _ = run("jobs", "show", str(job.id), "--json")
    shown = json.loads(json_out)

    assert code == json_code == 0
    # occurred_at (a date and a time), run, attempt, then the event.
    assert [line.split()[4] for line in listed] == ["ENQUEUED", "SUCCEEDED"]
    assert [event["event_type"] for event in shown["events"]] == ["ENQUEUED", "SUCCEEDED"]
    enqueued = shown["events"][0]
    assert (enqueued["run_number"], enqueued["attempt"], enqueued["payload"]) == (1, None, {"job_type": EMAIL})
    assert enqueued["occurred_at"] == shown["job"]["created_at"]


def dead_lettered_by_its_handler(db) -> rl.JobRecord:
    """A job whose handler raised on its one attempt, run the worker's way: it stopped at stage running."""
    registry = rl.JobRegistry()

    @registry.job("cli.crash", max_attempts=1)
    def crash(ctx: rl.JobContext, payload: dict) -> None:
        raise KeyError("to")

    registry.sync_definitions(db)
    return testing.run_job(db, registry, "cli.crash", {})


def test_jobs_show_and_list_say_a_dead_lettered_jobs_final_stage(db, run):
    job = dead_lettered_by_its_handler(db)
    assert rl.get_job(db, job.id).stage is rl.JobStage.RUNNING  # the column keeps where it stopped

    _, shown, _ = run("jobs", "show", str(job.id))
    _, shown_json, _ = run("jobs", "show", str(job.id), "--json")
    _, listed, _ = run("jobs", "list", "--status", "DEAD_LETTERED")
    _, listed_json, _ = run("jobs", "list", "--status", "DEAD_LETTERED", "--json")

    assert "stage:               completed" in shown.splitlines()
    assert "running" not in shown.split("\nattempts (", 1)[0]
    assert (json.loads(shown_json)["job"]["stage"], json.loads(shown_json)["job"]["stage_shown"]) == (
        "running", "completed")
    assert listed.splitlines()[1].split()[4] == "completed"
    assert [(j["stage"], j["stage_shown"]) for j in json_lines(listed_json)] == [("running", "completed")]


def test_jobs_show_json_holds_the_job_its_attempts_and_events(db, run):
    job = dead_lettered(db)

    code, out, _ = run("jobs", "show", str(job.id), "--json")

    assert code == 0
    shown = json.loads(out)
    assert shown["job"]["id"] == str(job.id) and shown["job"]["status"] == "DEAD_LETTERED"
    assert [a["outcome"] for a in shown["attempts"]] == ["TERMINAL"]
    # ENQUEUED is drawn from the job row: at the default level it has no event row.
    assert [e["event_type"] for e in shown["events"]] == ["ENQUEUED", *event_types(db, job.id)]


def test_jobs_show_prints_the_jobs_metadata(db, run):
    job = rl.enqueue(db, EMAIL, {}, meta={"tenant": "acme"})

    code, out, _ = run("jobs", "show", str(job.id))
    _, shown, _ = run("jobs", "show", str(job.id), "--json")

    assert code == 0
    assert 'meta:                {"tenant": "acme"}' in out
    assert json.loads(shown)["job"]["meta"] == {"tenant": "acme"}


def test_jobs_show_unknown_id_is_not_found(db, run):
    code, out, err = run("jobs", "show", UNKNOWN_ID)

    assert code == 1 and out == ""
    assert err.splitlines()[0] == f"error: job.not_found: job {UNKNOWN_ID} was not found"
    assert "jobs list" in err.splitlines()[1]


# -- jobs retry / cancel ----------------------------------------------------------------


def test_jobs_retry_requeues_a_finished_job_as_a_new_run(db, run):
    job = succeeded(db)

    code, out, _ = run("jobs", "retry", str(job.id), "--reason", "operator asked")

    assert code == 0
    assert out.strip() == f"job {job.id} requeued: PENDING, run 2"
    after = rl.get_job(db, job.id)
    assert (after.status, after.run_number, after.attempt, after.status_reason) == (
        rl.JobStatus.PENDING, 2, 0, "operator asked")
    assert event_types(db, job.id)[-1] == "REQUEUED"


def test_jobs_retry_of_a_pending_job_is_an_invalid_transition(db, run):
    job = rl.enqueue(db, EMAIL, {})

    code, _, err = run("jobs", "retry", str(job.id))

    assert code == 1
    assert err.startswith("error: job.invalid_state_transition: ")
    assert rl.get_job(db, job.id).run_number == 1


def test_jobs_retry_with_expectations_requeues_only_the_job_still_as_seen(db, run):
    job = succeeded(db)

    code, _, err = run("jobs", "retry", str(job.id), "--expect-status", "dead_lettered", "--expect-run", "1")
    assert code == 1
    assert err.startswith("error: job.requeue_expectation_failed: ")
    assert rl.get_job(db, job.id).run_number == 1

    code, out, _ = run("jobs", "retry", str(job.id), "--expect-status", "succeeded", "--expect-run", "1")
    assert code == 0 and out.strip() == f"job {job.id} requeued: PENDING, run 2"


def test_jobs_cancel_cancels_with_the_reason_given(db, run):
    job = rl.enqueue(db, EMAIL, {})

    code, out, _ = run("jobs", "cancel", str(job.id), "--reason", "duplicate")

    assert code == 0
    assert out.strip() == f"job {job.id} canceled: duplicate"
    after = rl.get_job(db, job.id)
    assert (after.status, after.status_reason) == (rl.JobStatus.CANCELED, "duplicate")
    assert event_types(db, job.id)[-1] == "CANCELED"


def test_jobs_cancel_of_a_finished_job_fails_and_changes_nothing(db, run):
    job = succeeded(db)

    code, _, err = run("jobs", "cancel", str(job.id))

    assert code == 1
    assert err.startswith("error: job.invalid_state_transition: ")
    assert rl.get_job(db, job.id).status is rl.JobStatus.SUCCEEDED


@pytest.mark.parametrize("action", ["retry", "cancel"])
def test_jobs_action_on_an_unknown_id_is_not_found(db, run, action):
    code, _, err = run("jobs", action, UNKNOWN_ID)

    assert code == 1
    assert err.startswith("error: job.not_found: ")


# -- dead letters -------------------------------------------------------------------------


def test_dead_letters_list_filters_by_type_and_since(db, run):
    email = dead_lettered(db, EMAIL)
    report = dead_lettered(db, REPORT)

    code, out, _ = run("dead-letters", "list")
    assert code == 0
    assert out.splitlines()[0].split()[:3] == ["job_id", "type", "failed_at"]
    assert {line.split()[0] for line in out.splitlines()[1:]} == {str(email.id), str(report.id)}

    _, out, _ = run("dead-letters", "list", "--type", REPORT, "--json")
    assert [(r["job_id"], r["error_code"], r["replayed"]) for r in json_lines(out)] == [
        (str(report.id), "cli.bad_input", False)]

    future = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    _, out, _ = run("dead-letters", "list", "--since", future)
    assert len(out.splitlines()) == 1


def test_dead_letters_replay_requeues_every_match_once(db, run):
    first, second = dead_lettered(db, EMAIL), dead_lettered(db, EMAIL)
    other = dead_lettered(db, REPORT)

    code, out, _ = run("dead-letters", "replay", "--type", EMAIL)

    assert code == 0
    assert out.strip() == "requeued 2 dead-lettered job(s)"
    statuses = {row.id: row.status for row in rows(db, "SELECT id, status FROM job_queue")}
    assert statuses == {first.id: "PENDING", second.id: "PENDING", other.id: "DEAD_LETTERED"}
    assert rl.get_job(db, first.id).status_reason == "DEAD_LETTER_REPLAY"

    # The dead-letter rows stay, but their jobs are no longer dead: nothing to replay twice.
    _, out, _ = run("dead-letters", "replay", "--type", EMAIL)
    assert out.strip() == "requeued 0 dead-lettered job(s)"
    assert scalar(db, "SELECT max(run_number) FROM job_queue") == 2
    _, out, _ = run("dead-letters", "list", "--type", EMAIL)
    header, *lines = out.splitlines()
    assert [line[header.index("state"):].split()[0] for line in lines] == ["replayed", "replayed"]


def test_dead_letters_replay_dry_run_changes_nothing(db, run):
    job = dead_lettered(db)

    code, out, _ = run("dead-letters", "replay", "--dry-run")

    assert code == 0
    assert out.splitlines() == [f"would requeue {job.id}", "1 dead-lettered job(s) would be requeued (dry run)"]
    assert rl.get_job(db, job.id).status is rl.JobStatus.DEAD_LETTERED


def test_dead_letters_replay_since_the_future_matches_nothing(db, run):
    job = dead_lettered(db)

    code, out, _ = run("dead-letters", "replay", "--since", "2999-01-01T00:00:00Z")

    assert code == 0
    assert out.strip() == "requeued 0 dead-lettered job(s)"
    assert rl.get_job(db, job.id).status is rl.JobStatus.DEAD_LETTERED


def failed_with(db, code: str, error_type: str) -> rl.JobRecord:
    job = rl.enqueue(db, EMAIL, {"n": 1}, priority=TOP)
    [claimed] = claim_jobs(db, worker_id="cli-worker", lease_ttl_seconds=60, limit=1, job_types=[EMAIL])
    assert claimed.id == job.id
    return complete_job_failure(db, **LeaseIdentity.of(claimed).keywords(), failure=rl.JobFailure.terminal(code, "no"),
                                retry_delay_ms=None, error_type=error_type)


def test_dead_letters_list_and_replay_by_error_code_and_exception_type(db, run):
    timeout = failed_with(db, "http.timeout", "TimeoutError")
    refused = failed_with(db, "http.timeout", "ConnectionRefusedError")
    declined = failed_with(db, "card.declined", "TimeoutError")

    _, out, _ = run("dead-letters", "list", "--code", "http.timeout", "--json")
    assert [r["job_id"] for r in json_lines(out)] == [str(refused.id), str(timeout.id)]
    _, out, _ = run("dead-letters", "replay", "--code", "http.timeout", "--error-type", "TimeoutError", "--dry-run")
    assert out.splitlines() == [f"would requeue {timeout.id}", "1 dead-lettered job(s) would be requeued (dry run)"]

    # The module-qualified spelling of a builtin finds the same failures.
    code, out, _ = run("dead-letters", "replay", "--code", "http.timeout", "--error-type", "builtins.TimeoutError")

    assert (code, out.strip()) == (0, "requeued 1 dead-lettered job(s)")
    assert [rl.get_job(db, job.id).status.value for job in (timeout, refused, declined)] == [
        "PENDING", "DEAD_LETTERED", "DEAD_LETTERED"]


def test_dead_letters_since_without_an_offset_is_taken_as_utc(db, run):
    dead_lettered(db)
    an_hour_ago = (datetime.now(timezone.utc) - timedelta(hours=1)).replace(tzinfo=None).isoformat()

    _, out, _ = run("dead-letters", "list", "--since", an_hour_ago)

    assert len(out.splitlines()) == 2


# -- stats ------------------------------------------------------------------------------


def test_stats_prints_counts_by_status_and_type(db, run):
    rl.enqueue(db, EMAIL, {})
    rl.enqueue(db, EMAIL, {})
    dead_lettered(db, REPORT)

    code, out, _ = run("stats")

    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["status", "count"]
    assert ["PENDING", "2"] in [line.split() for line in lines]
    assert [EMAIL, "2", "0", "0", "0", "0"] in [line.split() for line in lines]
    assert [REPORT, "0", "0", "0", "1", "0"] in [line.split() for line in lines]
    assert any(line.startswith("due now: 2, oldest due: ") and line.endswith(" s ago") for line in lines)
    assert "scheduled for later: 0" in lines
    assert "expired leases: 0" in lines


def test_stats_json_and_an_empty_queue(db, run):
    code, out, _ = run("stats", "--json")

    assert code == 0
    stats = json.loads(out)
    assert stats["by_status"]["PENDING"] == 0 and stats["by_type"] == {}
    assert stats["oldest_pending_age_seconds"] is None and stats["expired_leases"] == 0
    assert (stats["due_now"], stats["oldest_due_age_seconds"]) == (0, None)
    assert (stats["scheduled_for_later"], stats["next_scheduled_at"]) == (0, None)
    _, out, _ = run("stats")
    assert out.splitlines()[-3:] == ["due now: 0", "scheduled for later: 0", "expired leases: 0"]


def test_stats_tells_jobs_due_now_from_jobs_scheduled_for_later(db, run):
    rl.enqueue(db, EMAIL, {})
    soon = rl.enqueue(db, EMAIL, {}, delay_seconds=600)
    rl.enqueue(db, REPORT, {}, delay_seconds=3600)

    code, out, _ = run("stats")
    _, json_out, _ = run("stats", "--json")

    assert code == 0
    lines = out.splitlines()
    assert any(line.startswith("due now: 1, oldest due: ") and line.endswith(" s ago") for line in lines), out
    assert f"scheduled for later: 2, next at {soon.next_run_at.astimezone(timezone.utc):%Y-%m-%d %H:%M:%SZ}" in lines
    stats = json.loads(json_out)
    assert (stats["by_status"]["PENDING"], stats["due_now"], stats["scheduled_for_later"]) == (3, 1, 2)
    assert datetime.fromisoformat(stats["next_scheduled_at"]) == soon.next_run_at
    assert 0 <= stats["oldest_due_age_seconds"] < 120


def test_stats_with_only_scheduled_jobs_does_not_say_none_are_pending(db, run):
    rl.enqueue(db, EMAIL, {}, delay_seconds=60)
    rl.enqueue(db, EMAIL, {}, delay_seconds=60)

    _, out, _ = run("stats")

    assert "due now: 0" in out.splitlines()
    assert any(line.startswith("scheduled for later: 2, next at ") for line in out.splitlines())


def test_jobs_show_names_a_success_and_a_running_attempt(db, run):
    done = succeeded(db)
    running = rl.enqueue(db, EMAIL, {}, priority=TOP)
    claim_jobs(db, worker_id="cli-worker", lease_ttl_seconds=60, limit=1, job_types=[EMAIL])

    _, done_out, _ = run("jobs", "show", str(done.id))
    _, running_out, _ = run("jobs", "show", str(running.id))

    assert attempt_outcomes(done_out) == ["SUCCEEDED"]
    assert attempt_outcomes(running_out) == ["running"]


def attempt_outcomes(out: str) -> list[str]:
    section = out.split("\nattempts (", 1)[1].split("\nevents (", 1)[0]
    header, *lines = section.splitlines()[1:]
    column = header.index("outcome")
    return [line[column:].split()[0] for line in lines]


@pytest.mark.parametrize("argv", [["stats"], ["jobs", "list", "--limit", "400"]], ids=["small", "large"])
def test_a_closed_stdout_ends_the_command_quietly_with_141(db, fresh_database, argv):
    # `runledger-sync stats | head -4` once the reader has gone: no error line, no traceback.
    rl.enqueue_many(db, [rl.JobSpec(EMAIL, {"n": n}) for n in range(400)])
    process = subprocess.Popen([sys.executable, "-m", "runledger_sync.cli", "--database-url", fresh_database, *argv],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()

    _, err = process.communicate(timeout=60)

    assert process.returncode == cli.EXIT_BROKEN_PIPE == 141
    assert err == ""

