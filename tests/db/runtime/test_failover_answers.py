"""A failover's answers, met on a real server: read-only (25006), admin shutdown (57P01).

A demoted primary keeps answering, read-only: its sessions pass the pool's pre-ping,
so unless the engine ends them they would be handed out again and again. The
database is made read-only for new sessions with ``ALTER DATABASE ... SET
default_transaction_read_only``, and its sessions ended with ``pg_terminate_backend``
(57P01), as a failover does to the old primary's clients.
"""

from __future__ import annotations

import threading
from collections import Counter

import psycopg2
import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import make_url

import runledger_sync as rl
from runledger_sync.core import backoff
from runledger_sync.core.records import JobSpec
from runledger_sync.db.connection_loss import sqlstate_of
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.attempt.run import process_claimed_job
from runledger_sync.store.driver import driver_for
from runledger_sync.store.enqueue.enqueue import enqueue, enqueue_many_ids
from tests import handlers as h
from tests.handlers import fast_config
from tests.support import JOB_TYPE, attempts, claim_one, rows, run_worker_until, scalar

TRANSIENT = "job.handler_transient_error"


def sqlstates_met(engine) -> Counter:
    """Every SQLSTATE the engine's connections were answered with, counted as it happens.

    A session ended by the server counts as ``disconnect`` when the driver saw only the closed socket.
    """
    met: Counter = Counter()

    def count(context) -> None:
        state = sqlstate_of(context.original_exception)
        met.update([state if state is not None or not context.is_disconnect else "disconnect"])

    event.listen(engine, "handle_error", count)
    return met


def set_read_only(admin, database: str, on: bool) -> None:
    """New sessions of ``database`` read-only (or not), and its current sessions ended (57P01)."""
    with admin.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        name = conn.dialect.identifier_preparer.quote(database)
        action = "SET default_transaction_read_only = on" if on else "RESET default_transaction_read_only"
        conn.exec_driver_sql(f"ALTER DATABASE {name} {action}")
        if on:
            conn.execute(text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = :d AND pid <> pg_backend_pid()"), {"d": database})


@pytest.fixture
def admin(pg_server):
    made = rl.create_engine(pg_server.url(), pool_size=1, max_overflow=0)
    yield made
    made.dispose()


def test_a_read_only_answer_ends_the_connection_and_every_pooled_one(engine):
    with engine.connect() as first, engine.connect() as second:
        second.execute(text("SELECT 1"))
        first.exec_driver_sql("SET SESSION default_transaction_read_only = on")
        first.commit()  # the setting holds from the next transaction on, as on a demoted primary
        with pytest.raises(Exception) as raised:
            first.execute(text("CREATE TABLE failover_probe (x int)"))
        assert sqlstate_of(raised.value.orig) == "25006"
        assert raised.value.connection_invalidated and first.invalidated
        second_pid = second.execute(text("SELECT pg_backend_pid()")).scalar()
    # The pool's other connection, opened before, is replaced too: it led to the same server.
    with engine.connect() as again:
        assert again.execute(text("SELECT pg_backend_pid()")).scalar() != second_pid
        assert again.execute(text("SHOW default_transaction_read_only")).scalar() == "off"


def test_after_a_read_only_spell_the_store_writes_at_once_on_fresh_sessions(engine, fresh_database, admin):
    registry = JobRegistry()
    registry.job(JOB_TYPE)(lambda ctx, payload: None)
    registry.sync_definitions(engine)
    enqueue(engine, JOB_TYPE, {})  # the pool now holds writable sessions
    database = make_url(fresh_database).database
    set_read_only(admin, database, True)
    with pytest.raises(rl.ConnectionFailed):
        enqueue(engine, JOB_TYPE, {})
    set_read_only(admin, database, False)
    # The read-only sessions met above were ended, not pooled: the first try writes.
    met = sqlstates_met(engine)
    enqueue(engine, JOB_TYPE, {})
    assert not met
    assert scalar(engine, "SELECT count(*) FROM job_queue") == 2


def test_a_handlers_read_only_answer_from_the_queue_database_spends_no_attempt(engine):
    def handler(ctx, payload):
        with engine.begin() as conn:
            conn.exec_driver_sql("SET TRANSACTION READ ONLY")
            conn.execute(text("CREATE TABLE failover_probe (x int)"))

    registry = JobRegistry()
    registry.job(JOB_TYPE, max_attempts=1)(handler)
    registry.sync_definitions(engine)
    enqueue(engine, JOB_TYPE, {"secret": h.SECRET})
    config = fast_config()
    job = claim_one(engine, worker_id=config.worker_id, lease_ttl_seconds=config.lease_ttl_seconds)
    process_claimed_job(driver_for(engine), registry, job, config)
    [row] = rows(engine, "SELECT * FROM job_queue WHERE id = :id", id=job.id)
    assert (row.status, row.status_reason, row.last_error_code) == ("PENDING", "RETRYABLE", TRANSIENT)
    assert (row.attempt, row.max_attempts) == (1, 1)
    [attempt] = attempts(engine, row.id)
    assert attempt.retry_delay_ms == backoff.compute_transient_retry_delay_ms(1, row.id)


def test_a_read_only_answer_to_a_handlers_raw_psycopg2_connection_spends_no_attempt(engine, fresh_database):
    # psycopg2 raises 25006 as an InternalError (ReadOnlySqlTransaction), not an OperationalError.
    dsn = make_url(fresh_database).set(drivername="postgresql").render_as_string(hide_password=False)

    def handler(ctx, payload):
        connection = psycopg2.connect(dsn)
        try:
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION READ ONLY")
                cursor.execute("CREATE TABLE failover_probe (x int)")
        finally:
            connection.close()

    registry = JobRegistry()
    registry.job(JOB_TYPE, max_attempts=1)(handler)
    registry.sync_definitions(engine)
    enqueue(engine, JOB_TYPE, {})
    config = fast_config()
    job = claim_one(engine, worker_id=config.worker_id, lease_ttl_seconds=config.lease_ttl_seconds)
    process_claimed_job(driver_for(engine), registry, job, config)
    [row] = rows(engine, "SELECT * FROM job_queue WHERE id = :id", id=job.id)
    assert (row.status, row.last_error_code, row.attempt) == ("PENDING", TRANSIENT, 1)
    assert row.last_error_message.startswith("ReadOnlySqlTransaction: ")


def test_a_worker_through_shutdowns_and_a_read_only_spell_loses_nothing_and_spends_no_attempt(
        engine, fresh_database, admin):
    started = threading.Semaphore(0)
    release = threading.Event()

    def handler(ctx, payload):
        started.release()
        release.wait(h.MAX_BLOCK_SECONDS)

    registry = JobRegistry()
    registry.job(JOB_TYPE, max_attempts=1)(handler)
    registry.sync_definitions(engine)
    ids = enqueue_many_ids(engine, [JobSpec(JOB_TYPE, {}) for _ in range(40)])
    met = sqlstates_met(engine)
    database = make_url(fresh_database).database
    config = fast_config(lease_ttl_seconds=30)
    done = threading.Event()

    def fail_over_while_handlers_run():
        for _ in range(config.max_global_concurrency):
            started.acquire(timeout=h.MAX_BLOCK_SECONDS)
        # The in-flight handlers end while every session is read-only: their outcome
        # writes, the heartbeats and the next claims meet 25006 until it lifts.
        set_read_only(admin, database, True)
        release.set()
        deadline = threading.Event()
        while met["25006"] < 3 and not deadline.wait(0.05):
            pass
        set_read_only(admin, database, False)
        done.set()

    switch = threading.Thread(target=fail_over_while_handlers_run, daemon=True)
    switch.start()
    run_worker_until(engine, registry, config, lambda: done.is_set() and scalar(
        engine, "SELECT count(*) FROM job_queue WHERE status = 'SUCCEEDED'") == len(ids), timeout=60)
    switch.join(10)
    assert met["25006"] >= 3 and met["57P01"] + met["disconnect"] >= 1
    counts = dict(rows(engine, "SELECT status, count(*) FROM job_queue GROUP BY status"))
    assert counts == {"SUCCEEDED": len(ids)}
    # Nothing was spent on the failover: every job succeeded on its one and only attempt.
    assert scalar(engine, "SELECT max(attempt) FROM job_queue") == 1
    assert scalar(engine, "SELECT count(*) FROM job_attempts WHERE outcome IS NOT NULL") == 0
