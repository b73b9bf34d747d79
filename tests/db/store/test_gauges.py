"""store.admin.gauges: the scrape's one statement counts the unfinished queue by type, and reads only indexes."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.store.admin.gauges import queue_gauges, queue_gauges_statement
from runledger_sync.store.attempt.ends import complete_job_failure
from tests.support import claim_one, define, expire_lease, identity

FINISHED_ROWS = 1_000_000


def _dead_letter(engine, job_type: str) -> None:
    rl.enqueue(engine, job_type, {})
    job = claim_one(engine, job_type=job_type)
    complete_job_failure(engine, **identity(job), failure=rl.JobFailure.terminal("test.broken", "no"),
                                   retry_delay_ms=None)


def test_gauges_count_unfinished_jobs_by_type_and_status(engine):
    define(engine, "a")
    define(engine, "b")
    define(engine, "idle")
    for _ in range(3):
        rl.enqueue(engine, "a", {})
    rl.enqueue(engine, "a", {}, delay_seconds=3600)
    rl.enqueue(engine, "b", {})
    leased = claim_one(engine, job_type="b")
    expire_lease(engine, leased.id)
    claim_one(engine, job_type="a")
    _dead_letter(engine, "b")
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET next_run_at = now() - interval '90 seconds' "
                          "WHERE job_type = 'a' AND status = 'PENDING' AND next_run_at <= now()"))

    read = queue_gauges(engine)

    assert read.job_types == ("a", "b", "idle")
    assert read.jobs == {("a", "PENDING"): 3, ("a", "LEASED"): 1, ("b", "LEASED"): 1}
    assert read.due == {"a": 2}
    assert 89 < read.oldest_due_age_seconds["a"] < 120 and set(read.oldest_due_age_seconds) == {"a"}
    assert read.expired_leases == {"a": 0, "b": 1}
    assert read.dead_lettered_recently == {"b": 1}
    assert (read.late_schedules, read.max_schedule_lateness_seconds) == (0, None)


def test_gauges_count_schedules_late_to_fire(engine):
    define(engine, "a")
    for name in ("late", "due-now", "later"):
        rl.upsert_schedule(engine, name, cron_expr="0 0 3 * * *", job_type="a")
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_schedules SET next_fire_at = now() - interval '5 minutes' WHERE name = 'late'"))
        conn.execute(text("UPDATE job_schedules SET next_fire_at = now() - interval '1 second' WHERE name = 'due-now'"))

    read = queue_gauges(engine)

    assert read.late_schedules == 1
    assert 299 < read.max_schedule_lateness_seconds < 330


def test_dead_letters_older_than_the_window_are_not_counted(engine):
    define(engine, "a")
    _dead_letter(engine, "a")
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_dead_letters SET failed_at = now() - interval '61 minutes'"))

    assert queue_gauges(engine).dead_lettered_recently == {}


@pytest.mark.timeout(300)
def test_scrape_statement_reads_indexes_not_a_million_finished_jobs(engine):
    define(engine, "a")
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO job_queue (id, job_type, status, stage, max_attempts, attempt, started_at, finished_at) "
            "SELECT gen_random_uuid(), 'a', 'SUCCEEDED', 'completed', 3, 1, now(), now() "
            "FROM generate_series(1, :n)"), {"n": FINISHED_ROWS})
    for _ in range(5):
        rl.enqueue(engine, "a", {})
    claim_one(engine, job_type="a")
    with engine.connect() as conn:
        conn.execute(text("ANALYZE job_queue"))
        compiled = queue_gauges_statement().compile(engine, compile_kwargs={"literal_binds": True})
        plan = conn.execute(text(f"EXPLAIN (FORMAT JSON) {compiled}")).scalar_one()
    scans = _scans(plan[0]["Plan"] if isinstance(plan, list) else json.loads(plan)[0]["Plan"])

    # Every read of job_queue goes through an index, bounded to the unfinished rows (the
    # plan's choice among the indexes may vary with the statistics): none reads the
    # million finished ones.
    queue_scans = [scan for scan in scans if scan.get("Relation Name") == "job_queue"]
    assert queue_scans and all(scan["Node Type"] != "Seq Scan" for scan in queue_scans), scans
    assert all(scan["Plan Rows"] < FINISHED_ROWS // 100 for scan in queue_scans), scans
    read = queue_gauges(engine)
    assert read.jobs == {("a", "PENDING"): 4, ("a", "LEASED"): 1}


def _scans(node: dict) -> list[dict]:
    found = [node] if "Scan" in node["Node Type"] else []
    for child in node.get("Plans", []):
        found += _scans(child)
    return found
