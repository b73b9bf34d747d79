"""What a handler's uncaught exception makes of its attempt (ARCHITECTURE, "Handler exceptions").

Any exception is a retryable failure that spends an attempt, so ``max_attempts``
means what it says; ``dead_letter_on`` (and a narrowed ``retry_on``) dead-letter
at once. Only a lost database connection spends none: the errors are real, the
handler's connection is terminated by the server, as in a database restart.
"""

from __future__ import annotations

import json
import socket

import psycopg2
import pytest
import sqlalchemy
from sqlalchemy import text
from werkzeug.test import Client

from runledger_sync.core import backoff
from runledger_sync.core.outcomes import TRANSIENT_FAILURE_BUDGET
from runledger_sync.core.types import JobCompletion, JobDeadLetterReason, JobFailure, JobFailureKind
from runledger_sync.errors import InvalidExceptionRules
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.attempt.run import process_claimed_job
from runledger_sync.web import allow_anyone, create_app
from tests import handlers as h
from tests.handlers import fast_config
from runledger_sync.store.enqueue.enqueue import enqueue
from runledger_sync.store.driver import driver_for
from tests.support import JOB_TYPE, attempts, claim_one, event_types, events, rows, scalar, terminate_backend

TRANSIENT = "job.handler_transient_error"
EXCEPTION = "job.handler_exception"
PANIC = "job.handler_panic"


def run_one(engine, registry, config=None, job_type=JOB_TYPE):
    config = config or fast_config()
    registry.sync_definitions(engine)
    enqueue(engine, job_type, {"secret": h.SECRET})
    job = claim_one(engine, worker_id=config.worker_id, lease_ttl_seconds=config.lease_ttl_seconds, job_type=job_type)
    process_claimed_job(driver_for(engine), registry, job, config)
    return rows(engine, "SELECT * FROM job_queue WHERE id = :id", id=job.id)[0]


def one_handler(fn, **options) -> JobRegistry:
    registry = JobRegistry()
    registry.job(JOB_TYPE, **options)(fn)
    return registry


def raising(exc):
    def handler(ctx, payload):
        raise exc

    return handler


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
    [warning] = [r for r in logs.records if r.getMessage().startswith("job handler lost its database connection")]
    assert warning.job_id == str(row.id) and h.SECRET not in str(warning.__dict__)
    assert not [r for r in logs.records if r.levelname == "ERROR"]


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


def test_the_queue_engines_connection_terminated_by_another_session_retries_without_spending_an_attempt(
        engine, probe, logs):
    def handler(ctx, payload):
        with engine.connect() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
            terminate_backend(engine, pid)  # from another of the pool's connections, as a restart would
            conn.execute(text("SELECT 1"))

    config = fast_config()
    registry = one_handler(handler, max_attempts=1, on_dead_letter=h.recording_hook(probe))
    row = run_one(engine, registry, config)
    assert_retried_as_transient(engine, row)
    assert (row.attempt, row.max_attempts) == (1, 1)
    assert probe.dead_letters == []


def test_a_refused_socket_is_no_database_connection_loss_and_spends_an_attempt(engine, logs):
    def handler(ctx, payload):
        refused_connection()

    row = run_one(engine, one_handler(handler, max_attempts=5))
    assert (row.status, row.status_reason, row.last_error_code) == ("PENDING", "RETRYABLE", EXCEPTION)
    assert row.last_error_message.startswith("ConnectionRefusedError: ")
    [attempt] = attempts(engine, row.id)
    assert attempt.retry_delay_ms == backoff.compute_retry_delay_ms(1, row.id)


def test_an_uncaught_key_error_spends_each_of_max_attempts_then_dead_letters(engine, probe, logs):
    registry = one_handler(raising(KeyError("x")), max_attempts=5, on_dead_letter=h.recording_hook(probe))
    config = fast_config()
    row = run_one(engine, registry, config)
    assert (row.status, row.status_reason, row.last_error_code, row.last_error_message) == (
        "PENDING", "RETRYABLE", EXCEPTION, "KeyError: 'x'")
    for _ in range(4):
        row = run_again(engine, registry, row.id, config)
    assert (row.status, row.status_reason, row.last_error_code, row.attempt) == (
        "DEAD_LETTERED", "RETRYABLE", EXCEPTION, 5)
    assert [(a.attempt, a.outcome, a.error_code, a.error_type, a.retry_delay_ms) for a in attempts(engine, row.id)] == [
        (n, "RETRYABLE", EXCEPTION, "KeyError", backoff.compute_retry_delay_ms(n, row.id) if n < 5 else None)
        for n in range(1, 6)
    ]
    [(_, _, info, _)] = probe.dead_letters
    assert (info.reason, info.failure.kind, info.not_retried_because) == (
        JobDeadLetterReason.ATTEMPTS_EXHAUSTED, JobFailureKind.RETRYABLE, "attempts exhausted (5 of 5)")
    assert isinstance(info.exception, KeyError)
    warnings = [r for r in logs.records if r.getMessage() == "job handler raised KeyError: a retryable failure that spends an attempt"]
    assert len(warnings) == 5 and all(r.levelname == "WARNING" and r.exc_info for r in warnings)
    assert not [r for r in logs.records if "panicked" in r.getMessage()]


def test_an_oserror_with_max_attempts_1_is_tried_once_and_dead_lettered(engine, probe, logs):
    registry = one_handler(raising(FileNotFoundError(2, "No such file or directory", "/data/missing.csv")),
                           max_attempts=1, on_dead_letter=h.recording_hook(probe))
    row = run_one(engine, registry)
    assert (row.status, row.status_reason, row.last_error_code, row.attempt) == (
        "DEAD_LETTERED", "RETRYABLE", EXCEPTION, 1)
    assert row.last_error_message == "FileNotFoundError: [Errno 2] No such file or directory: '/data/missing.csv'"
    assert len(attempts(engine, row.id)) == 1
    [(_, _, info, _)] = probe.dead_letters
    assert info.not_retried_because == "attempts exhausted (1 of 1)"


def test_an_exception_in_the_types_dead_letter_on_is_dead_lettered_at_once(engine, probe, logs):
    registry = one_handler(raising(ValueError("bad input")), max_attempts=5, dead_letter_on=(ValueError,),
                           on_dead_letter=h.recording_hook(probe))
    row = run_one(engine, registry)
    assert (row.status, row.status_reason, row.last_error_code, row.last_error_message, row.attempt) == (
        "DEAD_LETTERED", "PANICKED", PANIC, "ValueError: bad input", 1)
    [(_, _, info, _)] = probe.dead_letters
    assert (info.reason, info.not_retried_because) == (
        JobDeadLetterReason.FAILURE_KIND_NON_RETRYABLE, "`ValueError` is in dead_letter_on")
    [error] = [r for r in logs.records if r.levelname == "ERROR" and r.getMessage().startswith("job handler raised")]
    assert error.getMessage() == "job handler raised ValueError; the job is dead-lettered without a retry: it is in dead_letter_on"
    assert error.exc_info and h.SECRET not in str(error.__dict__)
    # The failure's events keep which setting stopped it, for jobs show and the dashboard.
    assert [payload.get("stopped_by") for kind, _, payload in events(engine, row.id) if kind == "DEAD_LETTERED"] == [
        "dead_letter_on"]


def test_the_registrys_dead_letter_on_holds_for_every_type_and_a_types_own_setting_wins(engine, probe, logs):
    registry = JobRegistry(dead_letter_on=(LookupError,))
    registry.job("test.inherits", max_attempts=5)(raising(KeyError("k")))
    registry.job("test.own", max_attempts=5, dead_letter_on=())(raising(KeyError("k")))
    registry.job("test.other", max_attempts=5)(raising(RuntimeError("r")))
    inherits = run_one(engine, registry, job_type="test.inherits")
    own = run_one(engine, registry, job_type="test.own")
    other = run_one(engine, registry, job_type="test.other")
    assert (inherits.status, inherits.last_error_code) == ("DEAD_LETTERED", PANIC)
    assert (own.status, own.last_error_code) == ("PENDING", EXCEPTION)
    assert (other.status, other.last_error_code) == ("PENDING", EXCEPTION)


def test_a_narrowed_retry_on_retries_its_classes_and_dead_letters_the_rest(engine, probe, logs):
    def handler(ctx, payload):
        if payload.get("kind") == "reset":
            raise ConnectionResetError("peer reset")
        raise ValueError("bad input")

    registry = one_handler(handler, max_attempts=5, retry_on=(ConnectionError,), on_dead_letter=h.recording_hook(probe))
    registry.sync_definitions(engine)
    config = fast_config()
    reset = enqueue(engine, JOB_TYPE, {"kind": "reset"})
    process_claimed_job(driver_for(engine), registry, claim_one(engine, worker_id=config.worker_id), config)
    other = enqueue(engine, JOB_TYPE, {"kind": "other"})
    process_claimed_job(driver_for(engine), registry, claim_one(engine, worker_id=config.worker_id), config)
    [reset_row] = rows(engine, "SELECT * FROM job_queue WHERE id = :id", id=reset.id)
    [other_row] = rows(engine, "SELECT * FROM job_queue WHERE id = :id", id=other.id)
    assert (reset_row.status, reset_row.last_error_code) == ("PENDING", EXCEPTION)
    assert (other_row.status, other_row.status_reason, other_row.last_error_code) == ("DEAD_LETTERED", "PANICKED", PANIC)
    [(_, _, info, _)] = probe.dead_letters
    assert info.not_retried_because == "`ValueError` is not in retry_on"


def test_dead_letter_on_wins_over_retry_on(engine, logs):
    registry = one_handler(raising(ValueError("bad")), retry_on=(ValueError,), dead_letter_on=(ValueError,))
    assert run_one(engine, registry).last_error_code == PANIC


@pytest.mark.parametrize("options", [
    {"retry_on": "ValueError"}, {"dead_letter_on": (ValueError, 3)}, {"dead_letter_on": (KeyboardInterrupt,)},
    {"retry_on": ValueError("not a class")},
])
def test_exception_rules_that_are_not_exception_classes_are_refused_with_a_code_and_register_nothing(options):
    registry = JobRegistry()
    with pytest.raises(InvalidExceptionRules) as refused:
        registry.job(JOB_TYPE, **options)(raising(ValueError()))
    assert refused.value.code == "registry.invalid_exception_rules"
    assert JOB_TYPE not in registry
    with pytest.raises(InvalidExceptionRules):
        JobRegistry(**options)


def run_again(engine, registry, job_id, config):
    """Make the retried job due at once, claim it and run its next attempt; return its row."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET next_run_at = now() WHERE id = :id AND status = 'PENDING'"),
                     {"id": job_id})
    job = claim_one(engine, worker_id=config.worker_id, lease_ttl_seconds=config.lease_ttl_seconds)
    assert job.id == job_id
    process_claimed_job(driver_for(engine), registry, job, config)
    return rows(engine, "SELECT * FROM job_queue WHERE id = :id", id=job_id)[0]


def refused_connection():
    """A real OSError: a connection to a port that is bound but never listens."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        socket.create_connection(("127.0.0.1", unused.getsockname()[1]), timeout=2).close()


def losing_its_connection(url):
    """A handler whose database connection the server terminates, as a restart would."""
    return terminate_own_backend_sqlalchemy(url)


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


def test_transient_errors_past_their_budget_spend_attempts_like_any_retryable_failure(engine, fresh_database, probe, logs):
    registry = one_handler(losing_its_connection(fresh_database), max_attempts=2, on_dead_letter=h.recording_hook(probe))
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


def test_only_ordinary_failures_count_against_max_attempts_and_their_backoff(engine, fresh_database, probe, logs):
    lose_connection = losing_its_connection(fresh_database)

    def handler(ctx, payload):
        if ctx.attempt == 2:
            lose_connection(ctx, payload)
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


# -- the operator's view: jobs show and the job page say why a job was or was not retried ------


def test_jobs_show_and_the_job_page_say_the_attempts_were_exhausted_and_the_free_retries(
        engine, fresh_database, run, logs):
    lose_connection = losing_its_connection(fresh_database)

    def handler(ctx, payload):
        if ctx.attempt == 1:
            lose_connection(ctx, payload)
        raise KeyError("x")

    registry = one_handler(handler, max_attempts=2)
    config = fast_config()
    row = run_one(engine, registry, config)
    for _ in range(2):
        row = run_again(engine, registry, row.id, config)
    assert (row.status, row.attempt) == ("DEAD_LETTERED", 3)
    why = "not retried: attempts exhausted (2 of 2); 1 free retry (lost connection or shutdown)"

    code, out, _ = run("jobs", "show", str(row.id))
    assert code == 0 and f"retries:             {why}\n" in out
    code, out, _ = run("jobs", "show", str(row.id), "--json")
    shown = json.loads(out)["retries"]
    assert code == 0 and shown == {"attempts_spent": 2, "max_attempts": 2, "free_retries": 1,
                                   "not_retried_because": "attempts exhausted (2 of 2)", "summary": why}
    page = Client(create_app(engine, authorize=allow_anyone)).get(f"/jobs/{row.id}").get_data(as_text=True)
    assert f'<dd id="retries">{why}</dd>' in page


def test_jobs_show_and_the_job_page_say_which_setting_dead_lettered_the_exception(engine, run, logs):
    registry = one_handler(raising(ValueError("bad input")), max_attempts=5, dead_letter_on=(ValueError,))
    row = run_one(engine, registry)
    why = "not retried: `ValueError` is in dead_letter_on; 0 free retries (lost connection or shutdown)"

    code, out, _ = run("jobs", "show", str(row.id))
    assert code == 0 and why in out
    page = Client(create_app(engine, authorize=allow_anyone)).get(f"/jobs/{row.id}").get_data(as_text=True)
    assert f'<dd id="retries">{why}</dd>' in page


def test_a_pending_jobs_retries_say_how_many_attempts_are_spent(engine, run, logs):
    row = run_one(engine, one_handler(raising(KeyError("x")), max_attempts=5))
    code, out, _ = run("jobs", "show", str(row.id))
    assert code == 0 and "retries:             1 of 5 attempts spent; 0 free retries" in out
