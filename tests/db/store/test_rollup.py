"""store.admin.rollup (the dashboard's per-minute rollup) and its retention against a real PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.store.admin.rollup import (
    SAMPLE_LOCK_KEY, SAMPLE_STATEMENT, SETTLE_SECONDS, rollup_series, sample_rollup,
)
from tests.support import JOB_TYPE, define, scalar

COLUMNS = "queue, succeeded, retried, dead_lettered, canceled, ready, oldest_due_wait_seconds"


@pytest.fixture
def db(engine):
    define(engine)
    rl.configure_queue(engine, "reports")
    return engine


def minute_ago(db, minutes: int) -> datetime:
    return scalar(db, "SELECT date_trunc('minute', now()) - make_interval(mins => :m)", m=minutes)


def finished_job(db, event_type: str, at: datetime) -> None:
    """A job of the default queue that ended at ``at``, with the outcome event the worker writes."""
    job = rl.enqueue(db, JOB_TYPE, {})
    with db.begin() as conn:
        conn.execute(text("UPDATE job_queue SET status = 'SUCCEEDED', finished_at = :at WHERE id = :id"),
                     {"at": at, "id": job.id})
        conn.execute(text("INSERT INTO job_events (job_id, run_number, attempt, event_type, occurred_at) "
                          "VALUES (:id, 1, 1, :type, :at)"), {"id": job.id, "type": event_type, "at": at})


def due_job(db, due_at: datetime, **options: Any) -> None:
    job = rl.enqueue(db, JOB_TYPE, {}, **options)
    with db.begin() as conn:
        conn.execute(text("UPDATE job_queue SET next_run_at = :at WHERE id = :id"), {"at": due_at, "id": job.id})


def rows(db) -> list[tuple]:
    with db.connect() as conn:
        return [tuple(row) for row in conn.execute(text(f"SELECT minute, {COLUMNS} FROM job_rollup_minutes "
                                                        "ORDER BY minute, queue"))]


def test_a_sample_counts_the_closed_minutes_outcomes_and_what_waits_per_queue(db):
    minute = minute_ago(db, 10)
    second = timedelta(seconds=1)
    for event_type, count in (("SUCCEEDED", 3), ("RETRY_SCHEDULED", 2), ("DEAD_LETTERED", 1), ("CANCELED", 1)):
        for _ in range(count):
            finished_job(db, event_type, minute + 10 * second)
    finished_job(db, "SUCCEEDED", minute - second)  # the minute before
    finished_job(db, "SUCCEEDED", minute + 60 * second)  # the minute after: its start is outside the range
    finished_job(db, "FAILED", minute + 20 * second)  # written beside RETRY_SCHEDULED or DEAD_LETTERED, not counted
    now = minute + timedelta(minutes=1, seconds=SETTLE_SECONDS + 5)
    due_job(db, minute + 30 * second)
    due_job(db, minute + 50 * second)
    due_job(db, now + 60 * second)  # not due yet

    sample = sample_rollup(db, now=now)

    assert (sample.minute, sample.rows, sample.contended) == (minute, 2, False)
    assert sample.next_in_seconds == pytest.approx(55.0)
    assert rows(db) == [
        (minute, "default", 3, 2, 1, 1, 2, pytest.approx(SETTLE_SECONDS + 5 + 30)),
        (minute, "reports", 0, 0, 0, 0, 0, None),
    ]


def test_the_minute_sampled_is_the_last_one_closed_a_settling_while_ago(db):
    minute = minute_ago(db, 5)
    just_closed = minute + timedelta(minutes=1, seconds=SETTLE_SECONDS - 1)
    assert sample_rollup(db, now=just_closed).minute == minute - timedelta(minutes=1)
    assert sample_rollup(db, now=just_closed + timedelta(seconds=1)).minute == minute


def test_a_minute_is_written_once_however_often_it_is_sampled(db):
    minute = minute_ago(db, 10)
    finished_job(db, "SUCCEEDED", minute + timedelta(seconds=5))
    now = minute + timedelta(minutes=1, seconds=SETTLE_SECONDS)
    assert sample_rollup(db, now=now).rows == 2
    before = rows(db)

    finished_job(db, "SUCCEEDED", minute + timedelta(seconds=6))  # late: the minute is written already
    again = sample_rollup(db, now=now + timedelta(seconds=30))

    assert (again.minute, again.rows, again.contended) == (minute, 0, False)
    assert rows(db) == before
    assert before[0][2] == 1


def test_one_sampler_at_a_time_the_other_reads_nothing(db):
    minute = minute_ago(db, 10)
    now = minute + timedelta(minutes=1, seconds=SETTLE_SECONDS)
    with db.connect() as holder:
        holder.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SAMPLE_LOCK_KEY})
        sample = sample_rollup(db, now=now)
        assert (sample.rows, sample.contended) == (0, True)
        assert rows(db) == []
        holder.rollback()
    assert sample_rollup(db, now=now).rows == 2


def test_a_sample_joins_the_callers_transaction(db):
    minute = minute_ago(db, 10)
    with db.connect() as conn:
        assert sample_rollup(conn, now=minute + timedelta(minutes=1, seconds=SETTLE_SECONDS)).rows == 2
        conn.rollback()
    assert rows(db) == []


def test_the_series_sums_the_queues_per_minute_within_the_window_oldest_first(db):
    base = minute_ago(db, 0)
    with db.begin() as conn:
        conn.execute(text(
            "INSERT INTO job_rollup_minutes (minute, queue, succeeded, retried, ready, oldest_due_wait_seconds) VALUES "
            "(:base - interval '2 minutes', 'default', 4, 1, 3, 12.5), "
            "(:base - interval '2 minutes', 'reports', 1, 0, 2, 40), "
            "(:base - interval '5 minutes', 'default', 7, 0, 0, NULL), "
            "(:base - interval '90 minutes', 'default', 100, 0, 0, NULL)"), {"base": base})

    series = rollup_series(db)

    assert [(p.minute, p.succeeded, p.retried, p.ready, p.oldest_due_wait_seconds) for p in series.points] == [
        (base - timedelta(minutes=5), 7, 0, 0, None), (base - timedelta(minutes=2), 5, 1, 5, 40.0)]
    assert [p.succeeded for p in rollup_series(db, queue="reports").points] == [1]
    assert [p.succeeded for p in rollup_series(db, window_minutes=120).points] == [100, 7, 5]
    with pytest.raises(rl.InvalidArgument):
        rollup_series(db, window_minutes=0)


def test_prune_deletes_rollup_minutes_older_than_their_retention(db):
    base = minute_ago(db, 0)
    with db.begin() as conn:
        conn.execute(text(
            "INSERT INTO job_rollup_minutes (minute, queue) SELECT :base - make_interval(mins => m), q "
            "FROM generate_series(1, 9, 2) m, unnest(ARRAY['default', 'reports']) q"), {"base": base})
    # Minutes 1 and 3 back are younger than 4.5 minutes, 5, 7 and 9 older, whatever second it is now.
    keep_three = rl.Retention(succeeded=None, canceled=None, dead_lettered=None, workflow_runs=None,
                              dashboard_rollup=timedelta(minutes=4, seconds=30))

    dry = rl.prune(db, keep_three, dry_run=True)
    assert (dry.rollup_minutes, scalar(db, "SELECT count(*) FROM job_rollup_minutes")) == (6, 10)

    result = rl.prune(db, keep_three, batch_size=3)

    assert (result.rollup_minutes, result.batches, result.total_jobs) == (6, 2, 0)
    assert scalar(db, "SELECT min(minute) FROM job_rollup_minutes") == base - timedelta(minutes=3)
    assert rl.prune(db, rl.Retention(dashboard_rollup=None)).rollup_minutes == 0
    assert rl.Retention.parse("dashboard_rollup=1d").dashboard_rollup == timedelta(days=1)


def plan_nodes(plan: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(node type, relation, index) of every node of an EXPLAIN (FORMAT JSON) plan."""
    found, stack = [], [plan["Plan"]]
    while stack:
        node = stack.pop()
        found.append((node["Node Type"], node.get("Relation Name", ""), node.get("Index Name", "")))
        stack.extend(node.get("Plans", []))
    return found


def test_the_sample_reads_the_minutes_events_and_the_due_jobs_by_index_never_the_whole_tables(db):
    with db.begin() as conn:
        # A day of finished jobs with their outcome events, and a backlog partly due.
        conn.execute(text(
            "INSERT INTO job_queue (id, job_type, status, max_attempts, attempt, finished_at) "
            "SELECT gen_random_uuid(), :type, 'SUCCEEDED', 1, 1, now() - g * interval '4 seconds' "
            "FROM generate_series(1, 20000) g"), {"type": JOB_TYPE})
        conn.execute(text(
            "INSERT INTO job_events (job_id, run_number, attempt, event_type, occurred_at) "
            "SELECT id, 1, 1, e, finished_at FROM job_queue, unnest(ARRAY['ENQUEUED', 'SUCCEEDED']) e"))
        conn.execute(text(
            "INSERT INTO job_queue (id, job_type, max_attempts, next_run_at) "
            "SELECT gen_random_uuid(), :type, 1, now() + (g - 1000) * interval '1 second' "
            "FROM generate_series(1, 2000) g"), {"type": JOB_TYPE})
        conn.execute(text("ANALYZE job_queue"))
        conn.execute(text("ANALYZE job_events"))

    with db.connect() as conn:
        minute = minute_ago(db, 30)
        compiled = SAMPLE_STATEMENT.compile(dialect=conn.dialect)
        params = {**compiled.params, "now": None, "minute": minute}
        plan = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + str(compiled), params).scalar_one()[0]
    nodes = plan_nodes(plan)
    assert ("Index Scan", "job_events", "idx_job_events_type_occurred") in nodes or \
        ("Bitmap Index Scan", "", "idx_job_events_type_occurred") in nodes, nodes
    # The due jobs through an index of PENDING rows only: the claim index (index-only once
    # vacuumed), or, on a table never vacuumed, the resting rows' status index; the events'
    # jobs by their key.
    indexes = {index for _, _, index in nodes if index.startswith(("idx_job_queue", "pk_job_queue"))}
    assert indexes & {"idx_job_queue_claim", "idx_job_queue_resting_status"}, nodes
    assert indexes <= {"idx_job_queue_claim", "idx_job_queue_resting_status", "pk_job_queue"}, nodes
    assert not [node for node in nodes if node[0] == "Seq Scan" and node[1] in ("job_events", "job_queue")], nodes
