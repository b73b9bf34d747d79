"""The worker's claim and running write: two transactions sent in one round trip.

What goes over the wire is counted at the driver; what landed is read back from
the rows. Failures are made by the server itself (a trigger that refuses a
write, or ends its own backend), so each path runs as it would in production.
"""

from __future__ import annotations

from typing import Any, Iterator

import psycopg2.extensions
import pytest
from sqlalchemy.engine import make_url

from runledger_sync.core.errors import RunledgerError
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.store_errors import CommitOutcomeUnknown
from runledger_sync.core.types import EventLog
from runledger_sync.core.states import JobStatus
from runledger_sync.db.engine import create_engine
from runledger_sync.store.enqueue.enqueue import enqueue
from runledger_sync.store.attempt.ends import release_unstarted_job_claim
from runledger_sync.store.claim.start import claim_and_start_jobs
from runledger_sync.store.transactions import HeldConnection
from runledger_sync.store.maintenance.reaper import reap_expired_leases
from tests.support import JOB_TYPE, define, rows, scalar

SENT: list[str] = []


class _CountingCursor(psycopg2.extensions.cursor):
    def execute(self, query: Any, vars: Any = None) -> Any:  # noqa: A002 - psycopg2's name
        SENT.append(query if isinstance(query, str) else query.decode())
        return super().execute(query, vars)


class _CountingConnection(psycopg2.extensions.connection):
    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cursor_factory", _CountingCursor)
        return super().cursor(*args, **kwargs)


@pytest.fixture
def counted(fresh_database) -> Iterator[HeldConnection]:
    engine = create_engine(fresh_database, connect_args={"connection_factory": _CountingConnection})
    define(engine)
    held = HeldConnection(engine)
    yield held
    held.close()
    engine.dispose()


def start(held: HeldConnection, limit: int = 8, event_log: EventLog | str = EventLog.FULL) -> Any:
    return claim_and_start_jobs(held, worker_id="w", lease_ttl_seconds=30, limit=limit, job_types=[JOB_TYPE],
                                event_log=event_log)


def refuse(engine: Any, when: str, statement: str = "RAISE EXCEPTION 'refused by the test'") -> None:
    """A trigger on job_attempts that runs ``statement`` ``when`` (BEFORE INSERT, BEFORE UPDATE ...)."""
    with engine.begin() as connection:
        connection.exec_driver_sql(
            f"CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN {statement}; RETURN NEW; END$$")
        connection.exec_driver_sql(f"CREATE TRIGGER refuse {when} ON job_attempts FOR EACH ROW EXECUTE FUNCTION refuse()")


def allow(engine: Any) -> None:
    with engine.begin() as connection:
        connection.exec_driver_sql("DROP TRIGGER refuse ON job_attempts")
        connection.exec_driver_sql("DROP FUNCTION refuse()")


def test_claim_and_running_go_out_as_one_query_of_two_transactions(counted):
    engine = counted.engine
    start(counted)  # prepares the statements on the held connection
    low = enqueue(engine, JOB_TYPE, {"n": 1}, priority=1)
    high = enqueue(engine, JOB_TYPE, {"n": 2}, priority=9)
    SENT.clear()

    started = start(counted)

    assert len(SENT) == 1, SENT
    assert SENT[0].startswith("BEGIN; ") and "; COMMIT; " in SENT[0] and not SENT[0].endswith("COMMIT")
    assert [job.id for job in started.running] == [high.id, low.id]  # claim order
    assert started.unstarted == [] and started.error is None
    assert all(job.status is JobStatus.LEASED and job.stage == "running" for job in started.running)
    assert rows(engine, "SELECT status, stage, attempt FROM job_queue ORDER BY priority") == [
        ("LEASED", "running", 1), ("LEASED", "running", 1)]
    assert scalar(engine, "SELECT count(*) FROM job_attempts WHERE execution_started_persisted_at IS NOT NULL"
                          " AND claim_origin = 'WORKER_PRESTART'") == 2
    # Two transactions: the LEASED events were written by another one than STAGE_CHANGED.
    writers = rows(engine, "SELECT event_type, count(DISTINCT xmin::text) FROM job_events"
                           " WHERE event_type IN ('LEASED', 'STAGE_CHANGED') GROUP BY event_type ORDER BY 1")
    assert writers == [("LEASED", 1), ("STAGE_CHANGED", 1)]
    assert scalar(engine, "SELECT count(DISTINCT xmin::text) FROM job_events"
                          " WHERE event_type IN ('LEASED', 'STAGE_CHANGED')") == 2


@pytest.mark.parametrize("event_log", [EventLog.FULL, EventLog.TRANSITIONS])
def test_the_event_log_level_decides_the_leased_and_running_events(counted, event_log):
    job = enqueue(counted.engine, JOB_TYPE, {}, event_log=event_log)

    [started] = start(counted, event_log=event_log).running

    assert started.id == job.id
    logged = [row[0] for row in rows(counted.engine, "SELECT event_type FROM job_events WHERE job_id = :id ORDER BY id",
                                     id=job.id)]
    assert logged == (["ENQUEUED", "LEASED", "STAGE_CHANGED"] if event_log is EventLog.FULL else [])


def test_a_refused_running_write_leaves_the_claim_leased_unstarted_and_releasable(counted):
    engine = counted.engine
    job = enqueue(engine, JOB_TYPE, {})
    refuse(engine, "BEFORE UPDATE")

    started = start(counted)

    assert started.running == []
    assert [claimed.id for claimed in started.unstarted] == [job.id]
    assert isinstance(started.error, RunledgerError) and not isinstance(started.error, CommitOutcomeUnknown)
    # The claim committed; the running write did not.
    assert rows(engine, "SELECT status, stage, attempt FROM job_queue") == [("LEASED", "queued", 1)]
    assert scalar(engine, "SELECT execution_started_persisted_at FROM job_attempts") is None
    allow(engine)
    released = release_unstarted_job_claim(
        engine, **LeaseIdentity.of(started.unstarted[0]).keywords(), reason="TEST", delay_ms=0)
    assert (released.status, released.attempt) == (JobStatus.PENDING, 0)
    # The session is fine: the next claim starts the job.
    assert [again.id for again in start(counted).running] == [job.id]


def test_a_refused_claim_leases_nothing_and_leaves_the_session_usable(counted):
    engine = counted.engine
    start(counted)  # prepared: the refusal then comes inside the BEGIN block, not while preparing
    job = enqueue(engine, JOB_TYPE, {})
    refuse(engine, "BEFORE INSERT")

    with pytest.raises(RunledgerError):
        start(counted)

    assert rows(engine, "SELECT status, attempt FROM job_queue") == [("PENDING", 0)]
    allow(engine)
    # The failed BEGIN block was rolled back: the same connection claims at once.
    assert [again.id for again in start(counted).running] == [job.id]


def test_a_connection_lost_during_the_running_write_reports_the_claim_with_an_unknown_outcome(counted):
    engine = counted.engine
    job = enqueue(engine, JOB_TYPE, {})
    refuse(engine, "BEFORE UPDATE", "PERFORM pg_terminate_backend(pg_backend_pid())")

    started = start(counted)

    assert started.running == []
    assert [claimed.id for claimed in started.unstarted] == [job.id]
    assert isinstance(started.error, CommitOutcomeUnknown)
    assert rows(engine, "SELECT status, stage FROM job_queue") == [("LEASED", "queued")]
    allow(engine)


@pytest.mark.parametrize("kind", ["transaction pool mode", "psycopg 3"])
def test_unprepared_the_claim_and_running_write_are_still_two_transactions(fresh_database, kind):
    if kind == "psycopg 3":
        engine = create_engine(make_url(fresh_database).set(drivername="postgresql+psycopg"))
    else:
        engine = create_engine(fresh_database, pool_mode="transaction")
    define(engine)
    held = HeldConnection(engine)
    try:
        job = enqueue(engine, JOB_TYPE, {})

        [started] = start(held).running

        assert started.id == job.id and started.stage == "running"
        assert rows(engine, "SELECT status, stage, attempt FROM job_queue") == [("LEASED", "running", 1)]
        assert scalar(engine, "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'runledger%'") == 0
        assert scalar(engine, "SELECT count(DISTINCT xmin::text) FROM job_events"
                              " WHERE event_type IN ('LEASED', 'STAGE_CHANGED')") == 2
    finally:
        held.close()
        engine.dispose()


def test_a_lease_that_runs_out_before_the_running_write_is_fenced_off_and_left_to_the_reaper(counted):
    engine = counted.engine
    job = enqueue(engine, JOB_TYPE, {})

    started = claim_and_start_jobs(counted, worker_id="w", lease_ttl_seconds=1e-6, limit=1, job_types=[JOB_TYPE])

    assert started.running == [] and started.unstarted == [] and started.error is None
    assert rows(engine, "SELECT status, stage, attempt, lease_expires_at < now() FROM job_queue") == [
        ("LEASED", "queued", 1, True)]
    assert scalar(engine, "SELECT execution_started_persisted_at FROM job_attempts WHERE job_id = :id", id=job.id) is None
    assert reap_expired_leases(engine, limit=10, default_retry_delay_ms=1).released_unstarted == 1
    assert rows(engine, "SELECT status, attempt FROM job_queue") == [("PENDING", 0)]
