"""A handler's transient infrastructure error retries; it is never the seed's panic.

The errors are real: the handler's own connection is terminated by the server,
as in a database restart, or its socket is refused.
"""

from __future__ import annotations

import socket

import psycopg2
import pytest
import sqlalchemy
from sqlalchemy import text

from runledger_sync.core import backoff
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.execution import process_claimed_job
from tests import handlers as h
from tests.handlers import fast_config
from runledger_sync.store import enqueue as store_enqueue
from tests.support import JOB_TYPE, attempts, claim_one, rows

TRANSIENT = "job.handler_transient_error"


def run_one(engine, registry, config=None):
    config = config or fast_config()
    registry.sync_definitions(engine)
    store_enqueue.enqueue(engine, JOB_TYPE, {"secret": h.SECRET})
    job = claim_one(engine, worker_id=config.worker_id, lease_ttl_seconds=config.lease_ttl_seconds)
    process_claimed_job(engine, registry, job, config)
    return rows(engine, "SELECT * FROM job_queue WHERE id = :id", id=job.id)[0]


def one_handler(fn, **options) -> JobRegistry:
    registry = JobRegistry(transient_errors=options.pop("transient_errors", ()))
    registry.job(JOB_TYPE, **options)(fn)
    return registry


def terminate_own_backend_sqlalchemy(url):
    def handler(ctx, payload):
        app_engine = sqlalchemy.create_engine(url)
        try:
            with app_engine.begin() as conn:
                conn.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
        finally:
            app_engine.dispose()

    return handler


def terminate_own_backend_psycopg2(url):
    def handler(ctx, payload):
        dsn = sqlalchemy.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        connection = psycopg2.connect(dsn)
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        finally:
            connection.close()

    return handler


def assert_retried_as_transient(engine, row):
    assert (row.status, row.status_reason, row.last_error_code) == ("PENDING", "RETRYABLE", TRANSIENT)
    [attempt] = attempts(engine, row.id)
    assert attempt.outcome == "RETRYABLE"
    assert attempt.retry_delay_ms == backoff.compute_retry_delay_ms(1, row.id)
    # One line: never the statement and its parameters that SQLAlchemy appends.
    assert "\n" not in row.last_error_message and "[SQL" not in row.last_error_message


def test_a_server_shutdown_seen_through_the_apps_sqlalchemy_engine_retries(engine, fresh_database, logs):
    row = run_one(engine, one_handler(terminate_own_backend_sqlalchemy(fresh_database), max_attempts=5))
    assert_retried_as_transient(engine, row)
    assert row.last_error_message.startswith("OperationalError: (psycopg2.")
    [warning] = [r for r in logs.records if r.getMessage().startswith("job handler hit a transient error")]
    assert warning.job_id == str(row.id) and h.SECRET not in str(warning.__dict__)
    assert not [r for r in logs.records if r.getMessage() == "job handler panicked"]


def test_a_server_shutdown_seen_through_a_raw_psycopg2_connection_retries(engine, fresh_database, logs):
    row = run_one(engine, one_handler(terminate_own_backend_psycopg2(fresh_database), max_attempts=5))
    assert_retried_as_transient(engine, row)
    assert row.last_error_message.startswith(("OperationalError: ", "AdminShutdown: "))


def test_a_server_shutdown_seen_through_psycopg3_retries(engine, fresh_database, logs):
    psycopg = pytest.importorskip("psycopg")
    dsn = sqlalchemy.make_url(fresh_database).set(drivername="postgresql").render_as_string(hide_password=False)

    def handler(ctx, payload):
        with psycopg.connect(dsn) as connection:
            connection.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    row = run_one(engine, one_handler(handler, max_attempts=5))
    assert_retried_as_transient(engine, row)


def test_a_refused_socket_retries(engine, logs):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, never listening: connecting is refused

        def handler(ctx, payload):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()

        row = run_one(engine, one_handler(handler, max_attempts=5))
    assert_retried_as_transient(engine, row)
    assert row.last_error_message.startswith("ConnectionRefusedError: ")


class UpstreamTimeout(Exception):
    """An HTTP client's own timeout class, unrelated to OSError."""


def test_an_apps_own_transient_errors_retry_for_every_type(engine, logs):
    def handler(ctx, payload):
        raise UpstreamTimeout("upstream took too long")

    row = run_one(engine, one_handler(handler, max_attempts=5, transient_errors=(UpstreamTimeout,)))
    assert_retried_as_transient(engine, row)
    assert row.last_error_message == "UpstreamTimeout: upstream took too long"


def test_without_being_declared_the_same_error_is_a_panic(engine, logs):
    def handler(ctx, payload):
        raise UpstreamTimeout("upstream took too long")

    row = run_one(engine, one_handler(handler, max_attempts=5))
    assert (row.status, row.last_error_code) == ("DEAD_LETTERED", "job.handler_panic")


def test_retry_on_keeps_its_own_code_for_a_transient_class(engine, logs):
    def handler(ctx, payload):
        raise ConnectionResetError("peer reset")

    row = run_one(engine, one_handler(handler, max_attempts=5, retry_on=(ConnectionResetError,)))
    assert (row.status, row.last_error_code) == ("PENDING", "job.handler_error")


def test_a_transient_error_on_the_last_attempt_dead_letters_as_exhausted(engine, fresh_database, logs):
    row = run_one(engine, one_handler(terminate_own_backend_sqlalchemy(fresh_database), max_attempts=1))
    assert (row.status, row.status_reason, row.last_error_code) == ("DEAD_LETTERED", "RETRYABLE", TRANSIENT)
