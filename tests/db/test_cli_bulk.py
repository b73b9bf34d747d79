"""The bulk job commands (jobs cancel|retry|delete|update by filter, jobs list --meta, operations list) in-process."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

import runledger_sync as rl
from tests.db.test_cli_admin import EMAIL, REPORT, dead_lettered, json_lines, succeeded
from tests.support import define, scalar


@pytest.fixture
def db(engine):
    define(engine, EMAIL, max_attempts=3)
    define(engine, REPORT, max_attempts=1)
    return engine


def acme(db, n: int = 1, **options) -> list[rl.JobRecord]:
    return [rl.enqueue(db, EMAIL, {"n": i}, meta={"tenant": "acme", "region": "eu"}, **options) for i in range(n)]


def test_jobs_cancel_by_meta_dry_run_counts_then_cancels_and_operations_list_shows_who(db, run):
    jobs = acme(db, 3)
    other = rl.enqueue(db, EMAIL, {}, meta={"tenant": "globex"})

    code, out, err = run("jobs", "cancel", "--meta", "tenant=acme", "--reason", "offboarding", "--dry-run")
    assert code == 0, err
    assert out.strip() == "dry run: cancel would take 3 job(s); nothing changed"
    assert scalar(db, "SELECT count(*) FROM job_queue WHERE status = 'CANCELED'") == 0

    code, out, err = run("jobs", "cancel", "--meta", "tenant=acme", "--meta", "region=eu", "--reason", "offboarding",
                         "--actor", "alice", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert (result["action"], result["matched"], result["changed"], result["dry_run"]) == ("cancel", 3, 3, False)
    assert {rl.get_job(db, job.id).status for job in jobs} == {rl.JobStatus.CANCELED}
    assert rl.get_job(db, other.id).status is rl.JobStatus.PENDING

    code, out, err = run("operations", "list", "--json")
    assert code == 0, err
    [operation] = json_lines(out)
    assert (operation["id"], operation["actor"], operation["reason"], operation["filter"]) == (
        result["operation_id"], "alice", "offboarding", {"meta": {"tenant": "acme", "region": "eu"}})
    code, out, err = run("operations", "list")
    assert "alice" in out and "cancel" in out and "SUCCEEDED" in out


def test_jobs_cancel_with_an_id_still_cancels_that_one_job(db, run):
    job = acme(db)[0]
    code, out, err = run("jobs", "cancel", str(job.id), "--reason", "just this one", "--json")
    assert code == 0, err
    assert (json.loads(out)["id"], json.loads(out)["status"]) == (str(job.id), "CANCELED")
    assert rl.get_job(db, job.id).status_reason == "just this one"
    assert scalar(db, "SELECT count(*) FROM job_operations") == 0


def test_jobs_retry_and_delete_by_type_and_status(db, run):
    dead = dead_lettered(db, REPORT)
    done = succeeded(db, REPORT)

    code, out, err = run("jobs", "retry", "--type", REPORT, "--status", "dead_lettered", "--reason", "fixed")
    assert code == 0, err
    assert out.startswith("retry: 1 matched, 1 changed (operation ")
    assert rl.get_job(db, dead.id).run_number == 2

    code, out, err = run("jobs", "delete", "--type", REPORT, "--reason", "cleanup")
    assert code == 0, err
    assert out.startswith("delete: 1 matched, 1 changed")
    assert rl.get_job(db, done.id) is None
    assert rl.get_job(db, dead.id) is not None


def test_jobs_update_sets_priority_and_run_at_of_pending_jobs(db, run):
    jobs = acme(db, 2)
    later = (datetime.now(timezone.utc) + timedelta(hours=2)).replace(microsecond=0)

    code, out, err = run("jobs", "update", "--meta", "tenant=acme", "--reason", "later", "--priority", "42",
                         "--run-at", later.isoformat())

    assert code == 0, err
    for job in jobs:
        record = rl.get_job(db, job.id)
        assert (record.priority, record.next_run_at) == (42, later)


def test_jobs_list_by_meta(db, run):
    [job] = acme(db)
    rl.enqueue(db, EMAIL, {}, meta={"tenant": "globex"})

    code, out, err = run("jobs", "list", "--meta", "tenant=acme", "--json")

    assert code == 0, err
    assert [line["id"] for line in json_lines(out)] == [str(job.id)]


@pytest.mark.parametrize("argv, code_printed", [
    (["jobs", "delete", "--reason", "all"], "job.empty_filter"),
    (["jobs", "cancel", "--reason", "all"], "job.empty_filter"),
    (["jobs", "cancel", "--status", "BOGUS", "--reason", "r"], "job.invalid_filter"),
    (["jobs", "delete", "--status", "PENDING", "--reason", "r"], "job.invalid_filter"),
    (["jobs", "cancel", "--meta", "tenant", "--reason", "r"], "job.invalid_meta"),
    (["jobs", "cancel", "--type", EMAIL], "job.invalid_filter"),
    (["jobs", "retry", "--type", EMAIL, "--reason", "r", "--expect-run", "1"], "job.invalid_filter"),
    (["jobs", "update", "--type", EMAIL, "--reason", "r"], "job.invalid_update"),
    (["jobs", "update", "--type", EMAIL, "--reason", "r", "--priority", "99999999"], "job.invalid_update"),
    (["jobs", "cancel", "--type", EMAIL, "--reason", "r", "--created-after", "yesterday"], "job.invalid_filter"),
])
def test_a_bad_filter_exits_2_with_its_code_and_changes_nothing(db, run, argv, code_printed):
    acme(db, 2)
    code, out, err = run(*argv)
    assert code == 2, (out, err)
    assert f"error: {code_printed}:" in err
    assert scalar(db, "SELECT count(*) FROM job_queue WHERE status = 'PENDING'") == 2
    assert scalar(db, "SELECT count(*) FROM job_operations") == 0
