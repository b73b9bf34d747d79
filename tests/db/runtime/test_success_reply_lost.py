"""A success whose commit landed but whose reply was lost is read back, never logged as a failed write.

The commit is real and lands; then the server ends the connection before its
reply is read, and the database refuses every connection for a moment, as while
it restarts (``ALLOW_CONNECTIONS false``, every session terminated), so the
first read-backs fail too. Each way a success is written is covered: the
completer's group in a worker, the completer writing on the deciding thread
(no worker around it), and the handler's own transaction (``ctx.complete_in``).
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Iterator

import psycopg2
import pytest
import sqlalchemy
from sqlalchemy import event, text

from runledger_sync.core.types import JobCompletion
from runledger_sync.db.engine import create_engine
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.attempt.run import process_claimed_job
from runledger_sync.store.enqueue.enqueue import enqueue
from runledger_sync.store.driver import driver_for
from tests.handlers import fast_config
from tests.support import JOB_TYPE, attempts, claim_one, event_types, rows, run_worker_until

LANDED = "job success landed; its reply was lost"
#: Longer than one store call's own retries of a lost connection (about 0.2 s), so a read-back fails whole.
OUTAGE_SECONDS = 1.5


class Outage:
    """Makes one test database refuse connections for a while, as a restarting server does."""

    def __init__(self, admin_url: str, database: str) -> None:
        self._admin = sqlalchemy.create_engine(admin_url, isolation_level="AUTOCOMMIT",
                                               poolclass=sqlalchemy.pool.NullPool)
        self._name = self._admin.dialect.identifier_preparer.quote(database)
        self._database = database
        self._timer: threading.Timer | None = None
        self.started = threading.Event()

    def start(self, seconds: float) -> None:
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f"ALTER DATABASE {self._name} ALLOW_CONNECTIONS false")
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"),
                         {"d": self._database})
        self.started.set()
        self._timer = threading.Timer(seconds, self.end)
        self._timer.start()

    def end(self) -> None:
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f"ALTER DATABASE {self._name} ALLOW_CONNECTIONS true")

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()
        self.end()
        self._admin.dispose()


@pytest.fixture
def outage(pg_server, fresh_database) -> Iterator[Outage]:
    made = Outage(pg_server.url("postgres"), sqlalchemy.make_url(fresh_database).database)
    yield made
    made.close()


def lose_reply(outage: Outage) -> psycopg2.OperationalError:
    """End every session of the database (the reply is never read) and keep it unreachable for a while."""
    outage.start(OUTAGE_SECONDS)
    return psycopg2.OperationalError("server closed the connection unexpectedly")


@contextmanager
def commit_reply_lost_after(engine: sqlalchemy.Engine, statement_part: str, outage: Outage) -> Iterator[None]:
    """The first commit on ``engine`` after a statement holding ``statement_part`` lands, and its reply is lost."""
    armed: list[bool] = []
    original = engine.dialect.do_commit

    def arm(conn, cursor, statement, *rest):
        if statement_part in statement:
            armed.append(True)

    def do_commit(dbapi_connection):
        original(dbapi_connection)
        if armed and not outage.started.is_set():
            raise lose_reply(outage)

    event.listen(engine, "after_cursor_execute", arm)
    engine.dialect.do_commit = do_commit
    try:
        yield
    finally:
        engine.dialect.do_commit = original
        event.remove(engine, "after_cursor_execute", arm)


@contextmanager
def group_reply_lost(engine: sqlalchemy.Engine, outage: Outage) -> Iterator[None]:
    """The first group of outcomes written on ``engine`` lands, and its reply is lost."""

    def lose_the_group_reply(conn, cursor, statement, *rest):
        # The group's one query is its whole transaction: it has committed when it returns.
        if "EXECUTE runledger_apply_transitions_plain" in statement and not outage.started.is_set():
            raise lose_reply(outage)

    event.listen(engine, "after_cursor_execute", lose_the_group_reply)
    try:
        yield
    finally:
        event.remove(engine, "after_cursor_execute", lose_the_group_reply)


def errors_logged(logs) -> list[str]:
    return [record.getMessage() for record in logs.records if record.levelno >= logging.ERROR]


def assert_succeeded_once(engine, job_id, output):
    [row] = rows(engine, "SELECT status, attempt, output, last_error_code FROM job_queue WHERE id = :id", id=job_id)
    assert (row.status, row.attempt, row.output, row.last_error_code) == ("SUCCEEDED", 1, output, None)
    assert event_types(engine, job_id).count("SUCCEEDED") == 1
    [attempt] = attempts(engine, job_id)
    assert (attempt.outcome, attempt.error_code) == (None, None) and attempt.finished_at is not None


def landed_records(logs):
    return [record for record in logs.records if record.getMessage() == LANDED]


def test_a_group_success_whose_reply_is_lost_is_read_back_and_logged_as_landed(engine, outage, logs):
    registry = JobRegistry()
    registry.job(JOB_TYPE)(lambda ctx, payload: JobCompletion(output={"done": True}))
    registry.sync_definitions(engine)
    job = enqueue(engine, JOB_TYPE, {})

    with group_reply_lost(engine, outage):
        run_worker_until(engine, registry, fast_config(), lambda: landed_records(logs))
    [record] = landed_records(logs)
    assert (record.levelno, record.job_id, record.write) == (logging.INFO, str(job.id), "completer")
    assert errors_logged(logs) == []
    assert_succeeded_once(engine, job.id, {"done": True})


def test_a_success_written_on_the_deciding_thread_whose_reply_is_lost_is_read_back_and_logged_as_landed(
        engine, outage, logs):
    registry = JobRegistry()
    registry.job(JOB_TYPE)(lambda ctx, payload: JobCompletion(output={"done": True}))
    registry.sync_definitions(engine)
    enqueue(engine, JOB_TYPE, {})
    config = fast_config()
    job = claim_one(engine, worker_id=config.worker_id, lease_ttl_seconds=config.lease_ttl_seconds)
    with group_reply_lost(engine, outage):
        process_claimed_job(driver_for(engine), registry, job, config)  # no worker: the completer writes on this thread
    assert outage.started.is_set()
    [record] = landed_records(logs)
    assert (record.levelno, record.job_id, record.write) == (logging.INFO, str(job.id), "completer")
    assert errors_logged(logs) == []
    assert_succeeded_once(engine, job.id, {"done": True})


def test_a_handler_transaction_whose_commit_reply_is_lost_is_read_back_and_logged_as_landed(
        engine, fresh_database, outage, logs):
    app_engine = create_engine(fresh_database)
    registry = JobRegistry()

    @registry.job(JOB_TYPE)
    def handler(ctx, payload):
        with app_engine.begin() as conn:
            ctx.complete_in(conn, JobCompletion(output={"done": True}))

    registry.sync_definitions(engine)
    enqueue(engine, JOB_TYPE, {})
    config = fast_config()
    job = claim_one(engine, worker_id=config.worker_id, lease_ttl_seconds=config.lease_ttl_seconds)
    try:
        with commit_reply_lost_after(app_engine, "written_events", outage):
            process_claimed_job(driver_for(engine), registry, job, config)
    finally:
        app_engine.dispose()
    assert outage.started.is_set()
    [record] = landed_records(logs)
    assert (record.levelno, record.job_id, record.write) == (logging.INFO, str(job.id), "handler_transaction")
    assert errors_logged(logs) == []
    assert_succeeded_once(engine, job.id, {"done": True})


def test_a_single_attempt_job_whose_success_meets_an_outage_longer_than_ten_seconds_lands_within_its_lease(
        engine, outage, logs):
    """The outcome write retries for as long as the lease lasts: a restart shorter than the lease loses nothing."""
    registry = JobRegistry()

    @registry.job(JOB_TYPE, max_attempts=1)
    def handler(ctx, payload):
        outage.start(11.0)  # the database goes away as the handler returns
        return JobCompletion(output={"done": True})

    registry.sync_definitions(engine)
    enqueue(engine, JOB_TYPE, {})
    config = fast_config(lease_ttl_seconds=30)
    job = claim_one(engine, worker_id=config.worker_id, lease_ttl_seconds=config.lease_ttl_seconds)
    process_claimed_job(driver_for(engine), registry, job, config)  # written alone, retried until the database is back
    assert errors_logged(logs) == []
    assert_succeeded_once(engine, job.id, {"done": True})
