"""A handler's transient infrastructure error retries without spending the job's attempts; it is never the seed's panic.

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
from runledger_sync.core.outcomes import TRANSIENT_FAILURE_BUDGET
from runledger_sync.core.types import JobCompletion, JobDeadLetterReason, JobFailure
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.execution import process_claimed_job
from tests import handlers as h
from tests.handlers import fast_config
from runledger_sync.store import enqueue as store_enqueue
from tests.support import JOB_TYPE, attempts, claim_one, event_types, rows, scalar

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
    assert attempt.retry_delay_ms == backoff.compute_transient_retry_delay_ms(1, row.id)
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


def run_again(engine, registry, job_id, config):
    """Make the retried job due at once, claim it and run its next attempt; return its row."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET next_run_at = now() WHERE id = :id AND status = 'PENDING'"),
                     {"id": job_id})
    job = claim_one(engine, worker_id=config.worker_id, lease_ttl_seconds=config.lease_ttl_seconds)
    assert job.id == job_id
    process_claimed_job(engine, registry, job, config)
    return rows(engine, "SELECT * FROM job_queue WHERE id = :id", id=job_id)[0]


def refused_connection():
    """A real OSError: a connection to a port that is bound but never listens."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        socket.create_connection(("127.0.0.1", unused.getsockname()[1]), timeout=2).close()


def test_a_single_attempt_job_rides_out_transient_errors_and_succeeds(engine, fresh_database, probe, logs):
    lose_connection = terminate_own_backend_sqlalchemy(fresh_database)

    def handler(ctx, payload):
        if ctx.attempt <= 2:
            lose_connection(ctx, payload)
        return JobCompletion(output={"attempt": ctx.attempt})

    registry = one_handler(handler, max_attempts=1, on_dead_letter=h.recording_hook(probe))
    config = fast_config()
    row = run_one(engine, registry, config)
    assert (row.status, row.attempt, row.last_error_code) == ("PENDING", 1, TRANSIENT)
    assert run_again(engine, registry, row.id, config).status == "PENDING"
    row = run_again(engine, registry, row.id, config)
    # attempt counts claims; the two transient failures spent none of the job's one attempt.
    assert (row.status, row.attempt, row.max_attempts, row.output) == ("SUCCEEDED", 3, 1, {"attempt": 3})
    assert [(a.attempt, a.outcome, a.error_code, a.retry_delay_ms) for a in attempts(engine, row.id)] == [
        (1, "RETRYABLE", TRANSIENT, backoff.compute_transient_retry_delay_ms(1, row.id)),
        (2, "RETRYABLE", TRANSIENT, backoff.compute_transient_retry_delay_ms(2, row.id)),
        (3, None, None, None),
    ]
    assert "DEAD_LETTERED" not in event_types(engine, row.id)
    assert scalar(engine, "SELECT count(*) FROM job_dead_letters") == 0
    assert probe.dead_letters == []


def test_transient_errors_past_their_budget_spend_attempts_like_any_retryable_failure(engine, probe, logs):
    def handler(ctx, payload):
        refused_connection()

    registry = one_handler(handler, max_attempts=2, on_dead_letter=h.recording_hook(probe))
    config = fast_config()
    row = run_one(engine, registry, config)
    for _ in range(TRANSIENT_FAILURE_BUDGET - 1):
        row = run_again(engine, registry, row.id, config)
    # The budget's transient failures all retried on the transient schedule, spending nothing.
    assert (row.status, row.attempt) == ("PENDING", TRANSIENT_FAILURE_BUDGET)
    delays = [a.retry_delay_ms for a in attempts(engine, row.id)]
    assert delays == [backoff.compute_transient_retry_delay_ms(n, row.id) for n in range(1, TRANSIENT_FAILURE_BUDGET + 1)]
    # The next one spends the first of the two attempts, with the backoff of a first failed attempt...
    row = run_again(engine, registry, row.id, config)
    assert (row.status, row.last_error_code) == ("PENDING", TRANSIENT)
    assert attempts(engine, row.id)[-1].retry_delay_ms == backoff.compute_retry_delay_ms(1, row.id)
    assert probe.dead_letters == []
    # ...and the one after spends the last.
    row = run_again(engine, registry, row.id, config)
    assert (row.status, row.status_reason, row.last_error_code, row.attempt) == (
        "DEAD_LETTERED", "RETRYABLE", TRANSIENT, TRANSIENT_FAILURE_BUDGET + 2)
    [(_, _, info, _)] = probe.dead_letters
    assert (info.reason, info.failure.code, info.max_attempts) == (JobDeadLetterReason.ATTEMPTS_EXHAUSTED, TRANSIENT, 2)


def test_only_ordinary_failures_count_against_max_attempts_and_their_backoff(engine, probe, logs):
    def handler(ctx, payload):
        if ctx.attempt == 2:
            refused_connection()
        raise JobFailure.retryable("test.busy", "upstream busy")

    registry = one_handler(handler, max_attempts=3, on_dead_letter=h.recording_hook(probe))
    config = fast_config()
    row = run_one(engine, registry, config)
    for _ in range(3):
        row = run_again(engine, registry, row.id, config)
    assert [(a.error_code, a.retry_delay_ms) for a in attempts(engine, row.id)] == [
        ("test.busy", backoff.compute_retry_delay_ms(1, row.id)),
        (TRANSIENT, backoff.compute_transient_retry_delay_ms(1, row.id)),
        # The third claim is the second attempt spent: it backs off as one.
        ("test.busy", backoff.compute_retry_delay_ms(2, row.id)),
        ("test.busy", None),
    ]
    assert (row.status, row.attempt) == ("DEAD_LETTERED", 4)
    [(_, _, info, _)] = probe.dead_letters
    assert (info.reason, info.max_attempts) == (JobDeadLetterReason.ATTEMPTS_EXHAUSTED, 3)
