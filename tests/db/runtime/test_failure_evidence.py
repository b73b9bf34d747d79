"""Failures keep their evidence: each failed attempt's exception type and traceback, from the handler to the operator.

A handler raising ``KeyError`` in a nested function is run by a real worker;
the attempt row, ``rl.list_attempts``, ``jobs show``, the job and dead-letter
pages, the log records and the hooks are then read back. A secret in the
payload must appear in none of what the evidence reaches.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import threading
from typing import Any, Iterator

import pytest
from sqlalchemy import text
from werkzeug.test import Client

import runledger_sync as rl
from runledger_sync.core.evidence import CALLED_BY_HEADING, MAX_TRACEBACK_CHARS
from runledger_sync.runtime.attempt.run import process_claimed_job
from runledger_sync.web import allow_anyone, create_app
from runledger_sync.store.driver import driver_for
from tests import handlers as h
from tests.handlers import SECRET, fast_config
from tests.support import claim_one, configured_logging, rows

JOB_TYPE = "orders.import"
PAYLOAD = {"token": SECRET, "order": 7}
FAST = dict(dead_letter_hook_timeout_seconds=2)


def lookup_field(payload: dict) -> Any:
    token = payload["token"]  # a local holding the secret: a traceback must never show it
    return payload["missing_field"], token


class Recorded:
    """What the hooks were told, across the worker's threads."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.failures: list[tuple[Any, Any, BaseException]] = []
        self.dead_letters: list[rl.JobDeadLetterInfo] = []

    def on_failure(self, ctx: rl.JobContext, payload: Any, exception: BaseException) -> None:
        with self.lock:
            self.failures.append((ctx.job_id, ctx.attempt, exception))
            self.lock.notify_all()

    def on_dead_letter(self, ctx: rl.JobContext, payload: Any, info: rl.JobDeadLetterInfo) -> None:
        with self.lock:
            self.dead_letters.append(info)
            self.lock.notify_all()

    def wait(self, failures: int, dead_letters: int, timeout: float = 20.0) -> None:
        with self.lock:
            assert self.lock.wait_for(lambda: len(self.failures) >= failures
                                      and len(self.dead_letters) >= dead_letters, timeout), (
                self.failures, self.dead_letters)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def named(self, message: str) -> list[logging.LogRecord]:
        return [record for record in self.records if record.getMessage() == message]


@contextlib.contextmanager
def captured_logs() -> Iterator[tuple[Records, io.StringIO]]:
    """The package's log records as objects, and as the JSON lines configure_logging prints (DEBUG)."""
    stream, records = io.StringIO(), Records()
    with configured_logging(level="DEBUG", stream=stream) as logger:
        logger.addHandler(records)
        yield records, stream


def run_worker_until(engine: Any, registry: rl.JobRegistry, done: Any, **options: Any) -> None:
    shutdown = threading.Event()
    worker = threading.Thread(target=rl.run_worker_loop, args=(engine, registry, fast_config(**FAST), shutdown),
                              kwargs=options, daemon=True)
    worker.start()
    try:
        done()
    finally:
        shutdown.set()
        worker.join(30)
    assert not worker.is_alive()


def failing_registry(recorded: Recorded, **options: Any) -> rl.JobRegistry:
    registry = rl.JobRegistry()
    registry.on_failure(recorded.on_failure)

    @registry.job(JOB_TYPE, on_dead_letter=recorded.on_dead_letter, **({"dead_letter_on": KeyError} | options))
    def import_order(ctx: rl.JobContext, payload: dict) -> None:
        lookup_field(payload)

    return registry


def secret_free_rows(engine: Any) -> None:
    """The secret is in no row the failure wrote: attempts, events, the job's error (its payload holds it, by design)."""
    for query in ("SELECT job_attempts::text FROM job_attempts", "SELECT job_events::text FROM job_events",
                  "SELECT concat(last_error_code, last_error_message, status_reason) FROM job_queue",
                  "SELECT concat(error_code, error_message) FROM job_dead_letters"):
        for (row,) in rows(engine, query):
            assert SECRET not in (row or ""), query


def test_a_key_error_in_a_nested_function_is_kept_shown_logged_and_handed_to_the_hooks(engine, run):
    recorded = Recorded()
    registry = failing_registry(recorded)
    registry.sync_definitions(engine)
    job = rl.enqueue(engine, JOB_TYPE, PAYLOAD)

    with captured_logs() as (records, json_lines):
        run_worker_until(engine, registry, lambda: recorded.wait(failures=1, dead_letters=1))

    # The attempt row, through the public read.
    [attempt] = rl.list_attempts(engine, job.id)
    assert (attempt.outcome, attempt.error_code, attempt.error_type) == ("PANICKED", "job.handler_panic", "KeyError")
    assert "in lookup_field" in attempt.traceback and "in import_order" in attempt.traceback
    assert "KeyError: 'missing_field'\n" in attempt.traceback
    assert rl.get_dead_letter(engine, job.id).error_type == "KeyError"

    # The hooks: the live exception, once per failed attempt, and in the dead letter's info.
    [(job_id, number, exception)] = recorded.failures
    assert (job_id, number, type(exception), exception.args) == (job.id, 1, KeyError, ("missing_field",))
    assert exception.__traceback__ is not None
    [info] = recorded.dead_letters
    assert info.exception is exception

    # The log: the panic carries the exception itself, so error trackers' logging integrations see it.
    [panic] = records.named("job handler raised KeyError; the job is dead-lettered without a retry: it is in dead_letter_on")
    assert panic.exc_info[1] is exception and panic.error_type == "KeyError"
    assert "in lookup_field" in json_lines.getvalue()

    # The CLI: the attempts' type and traceback (jobs show prints the payload above them, by design).
    code, out, _ = run("jobs", "show", str(job.id))
    shown_attempts = out.split("\nattempts (", 1)[1]
    assert code == 0 and "KeyError" in shown_attempts and "in lookup_field" in shown_attempts
    assert "KeyError: 'missing_field'" in shown_attempts
    code, listed, _ = run("dead-letters", "list")
    assert code == 0 and "KeyError" in listed

    # The dashboard: both pages, escaped (the payload is only sent when asked for).
    client = Client(create_app(engine, authorize=allow_anyone))
    job_page = client.get(f"/jobs/{job.id}").get_data(as_text=True)
    dead_letters_page = client.get("/dead-letters").get_data(as_text=True)
    for page in (job_page, dead_letters_page):
        assert "<code>KeyError</code>" in page
        assert "in lookup_field" in page and "KeyError: &#39;missing_field&#39;" in page

    # The secret: nowhere the evidence went.
    secret_free_rows(engine)
    logged = json_lines.getvalue() + "".join(
        logging.Formatter().format(record) + str(record.__dict__) for record in records.records)
    for seen in (shown_attempts, listed, job_page, dead_letters_page, logged, attempt.traceback):
        assert SECRET not in seen


def test_the_handlers_frame_comes_first_and_the_library_frames_that_called_it_below_folded_on_the_page(engine, run):
    recorded = Recorded()
    registry = failing_registry(recorded)
    registry.sync_definitions(engine)
    job = rl.enqueue(engine, JOB_TYPE, PAYLOAD)

    with captured_logs() as (_, json_lines):
        run_worker_until(engine, registry, lambda: recorded.wait(failures=1, dead_letters=1))

    first_frame = f'  File "{__file__}", line '
    # The attempt row: the handler's frame first, its message, then the worker's frames.
    [attempt] = rl.list_attempts(engine, job.id)
    lines = attempt.traceback.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[1].startswith(first_frame) and lines[1].endswith("in import_order")
    own, heading, called_by = attempt.traceback.partition(CALLED_BY_HEADING)
    assert heading and own.endswith("KeyError: 'missing_field'\n\n") and "/runledger_sync/" not in own
    assert "/runledger_sync/runtime/attempt/run.py" in called_by and __file__ not in called_by

    # The log's traceback, as configure_logging formats it.
    [panic] = [line for line in map(json.loads, json_lines.getvalue().splitlines())
               if line["message"].startswith("job handler raised KeyError; the job is dead-lettered")]
    assert panic["exc_info"].splitlines()[1].startswith(first_frame)

    # jobs show.
    _, out, _ = run("jobs", "show", str(job.id))
    shown = out.split("\ntraceback of run 1 attempt 1 (KeyError):\n", 1)[1].splitlines()
    assert shown[0] == "  Traceback (most recent call last):" and shown[1].startswith(f"  {first_frame}")

    # The job page: the handler's frames in the traceback's first block, the library's folded below.
    page = Client(create_app(engine, authorize=allow_anyone)).get(f"/jobs/{job.id}").get_data(as_text=True)
    evidence = re.search(r'<details class="traceback"><summary>Traceback</summary><pre>(.*?)</pre>'
                         r'<details class="called-by"><summary>(.*?)</summary><pre>(.*?)</pre></details>', page, re.S)
    assert evidence is not None, page
    handlers_part, summary, library_part = evidence.groups()
    assert handlers_part.splitlines()[1].startswith(first_frame.replace('"', "&#34;"))
    assert handlers_part.endswith("KeyError: &#39;missing_field&#39;\n") and "/runledger_sync/" not in handlers_part
    assert summary == CALLED_BY_HEADING.strip() and "/runledger_sync/runtime/attempt/run.py" in library_part


def test_each_failed_attempt_is_told_to_the_failure_hooks_and_kept_on_its_own_row(engine):
    recorded = Recorded()
    registry = failing_registry(recorded, max_attempts=2, dead_letter_on=(),
                                retry_delay_overrides={"job.handler_exception": 1})
    registry.sync_definitions(engine)
    job = rl.enqueue(engine, JOB_TYPE, PAYLOAD)

    with captured_logs() as (records, _):
        run_worker_until(engine, registry, lambda: recorded.wait(failures=2, dead_letters=1))

    assert [(number, type(exception)) for _, number, exception in recorded.failures] == [(1, KeyError), (2, KeyError)]
    assert recorded.failures[0][2] is not recorded.failures[1][2]
    assert recorded.dead_letters[0].exception is recorded.failures[1][2]
    attempts = rl.list_attempts(engine, job.id)
    assert [(a.outcome, a.error_code, a.error_type) for a in attempts] == [
        ("RETRYABLE", "job.handler_exception", "KeyError"), ("RETRYABLE", "job.handler_exception", "KeyError")]
    assert all("in lookup_field" in a.traceback for a in attempts)
    # A retried error is logged with its exception too, as a warning.
    assert [type(r.exc_info[1]) for r in records.named("job handler raised KeyError: a retryable failure that spends an attempt")] == [
        KeyError, KeyError]


def test_a_database_error_keeps_its_first_line_and_never_the_parameters(engine):
    recorded = Recorded()
    registry = rl.JobRegistry()
    registry.on_failure(recorded.on_failure)

    @registry.job(JOB_TYPE, on_dead_letter=recorded.on_dead_letter, max_attempts=1)
    def divide(ctx: rl.JobContext, payload: dict) -> None:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1 / 0 WHERE :token <> ''"), {"token": payload["token"]})

    registry.sync_definitions(engine)
    job = rl.enqueue(engine, JOB_TYPE, PAYLOAD)
    with captured_logs() as (records, json_lines):
        run_worker_until(engine, registry, lambda: recorded.wait(failures=1, dead_letters=1))

    [attempt] = rl.list_attempts(engine, job.id)
    assert attempt.error_type == "sqlalchemy.exc.DataError"
    assert "division by zero" in attempt.traceback and "in divide" in attempt.traceback
    assert "[parameters:" not in attempt.traceback
    [panic] = records.named("job handler raised DataError: a retryable failure that spends an attempt")
    assert SECRET in str(panic.exc_info[1])  # the exception itself, for an error tracker, as SQLAlchemy made it
    # What the package prints and stores leaves the statement's parameters out.
    assert SECRET not in json_lines.getvalue() and "division by zero" in json_lines.getvalue()
    secret_free_rows(engine)


def test_a_timeout_has_no_traceback_and_its_failure_is_what_the_hook_gets(engine):
    recorded = Recorded()
    registry = rl.JobRegistry()
    registry.on_failure(recorded.on_failure)

    @registry.job(JOB_TYPE, timeout_seconds=1, max_attempts=3)
    def slow(ctx: rl.JobContext, payload: dict) -> None:
        ctx.wait_cancelled(h.MAX_BLOCK_SECONDS)
        raise KeyError("raised once told to stop: not the cause")

    registry.sync_definitions(engine)
    job = rl.enqueue(engine, JOB_TYPE, PAYLOAD)
    config = fast_config(**FAST)
    process_claimed_job(driver_for(engine), registry, claim_one(engine, worker_id=config.worker_id, job_type=JOB_TYPE), config)

    recorded.wait(failures=1, dead_letters=0)
    [attempt] = rl.list_attempts(engine, job.id)
    assert (attempt.outcome, attempt.error_code, attempt.error_type, attempt.traceback) == (
        "TIMEOUT", "job.timeout_exceeded", None, None)
    [(_, _, told)] = recorded.failures
    assert isinstance(told, rl.JobFailure) and told.code == "job.timeout_exceeded"


def test_a_failing_or_hanging_failure_hook_is_logged_and_changes_nothing(engine):
    recorded = Recorded()
    registry = failing_registry(recorded)

    @registry.on_failure
    def broken(ctx: rl.JobContext, payload: Any, exception: BaseException) -> None:
        raise RuntimeError("the hook broke")

    release = threading.Event()
    registry.on_failure(lambda ctx, payload, exception: release.wait(h.MAX_BLOCK_SECONDS))
    registry.sync_definitions(engine)
    job = rl.enqueue(engine, JOB_TYPE, PAYLOAD)
    try:
        with captured_logs() as (records, _):
            config = fast_config(dead_letter_hook_timeout_seconds=0.5)
            process_claimed_job(driver_for(engine), registry, claim_one(engine, worker_id=config.worker_id, job_type=JOB_TYPE),
                                config)
    finally:
        release.set()

    assert len(recorded.failures) == 1 and len(recorded.dead_letters) == 1  # the others still ran
    assert rl.get_job(engine, job.id).status is rl.JobStatus.DEAD_LETTERED
    [panicked] = records.named("failure hook panicked; continuing worker job task")
    assert str(panicked.exc_info[1]) == "the hook broke"
    assert records.named("failure hook timed out; continuing worker job task")


def test_a_wrapped_registry_runs_its_failure_hooks_inside_the_wrapper(engine):
    seen: list[str] = []
    registry = rl.JobRegistry()

    @registry.job(JOB_TYPE)
    def fail(ctx: rl.JobContext, payload: dict) -> None:
        lookup_field(payload)

    registry.on_failure(lambda ctx, payload, exception: seen.append(f"hook inside {inside}"))
    inside = "nothing"

    @contextlib.contextmanager
    def app_context() -> Iterator[None]:
        nonlocal inside
        inside = "app context"
        try:
            yield
        finally:
            inside = "nothing"

    wrapped = registry.wrapped(app_context)
    wrapped.sync_definitions(engine)
    rl.enqueue(engine, JOB_TYPE, PAYLOAD)
    config = fast_config(**FAST)
    process_claimed_job(driver_for(engine), wrapped, claim_one(engine, worker_id=config.worker_id, job_type=JOB_TYPE), config)

    assert seen == ["hook inside app context"]


class FailureWatch:
    """An observer that notes failed attempts; ``old_style`` leaves out attempt_failed, as observers written before it do."""

    def __init__(self) -> None:
        self.failed: list[tuple[str, str, Any]] = []

    def claimed(self, jobs: Any) -> None:
        pass

    def job_finished(self, job_type: str, outcome: str, handler_seconds: Any) -> None:
        pass

    def group_written(self, writer: str, size: int, seconds: float) -> None:
        pass

    def heartbeat_failed(self, job_type: str) -> None:
        pass

    def attempt_failed(self, job_type: str, failure: rl.JobFailure, exception: Any) -> None:
        self.failed.append((job_type, failure.code, exception))


class OldStyleWatch(FailureWatch):
    attempt_failed = None  # type: ignore[assignment]


@pytest.mark.parametrize("watch", [FailureWatch, OldStyleWatch])
def test_the_observer_is_told_of_a_failed_attempt_with_its_exception(engine, watch):
    recorded = Recorded()
    registry = failing_registry(recorded)
    registry.sync_definitions(engine)
    rl.enqueue(engine, JOB_TYPE, PAYLOAD)
    observer = watch()

    run_worker_until(engine, registry, lambda: recorded.wait(failures=1, dead_letters=1), observer=observer)

    if watch is FailureWatch:
        [(job_type, code, exception)] = observer.failed
        assert (job_type, code, exception) == (JOB_TYPE, "job.handler_panic", recorded.failures[0][2])


def test_a_huge_traceback_is_stored_cut_to_the_cap(engine):
    recorded = Recorded()
    registry = rl.JobRegistry()
    registry.on_failure(recorded.on_failure)

    def ping(n: int) -> int:
        return pong(n + 1)

    def pong(n: int) -> int:
        return ping(n + 1)

    @registry.job(JOB_TYPE)
    def recurse(ctx: rl.JobContext, payload: dict) -> None:
        ping(0)

    registry.sync_definitions(engine)
    job = rl.enqueue(engine, JOB_TYPE, PAYLOAD)
    config = fast_config(**FAST)
    process_claimed_job(driver_for(engine), registry, claim_one(engine, worker_id=config.worker_id, job_type=JOB_TYPE), config)

    [attempt] = rl.list_attempts(engine, job.id)
    assert attempt.error_type == "RecursionError"
    assert MAX_TRACEBACK_CHARS - 200 < len(attempt.traceback) <= MAX_TRACEBACK_CHARS
    assert "characters cut ...]" in attempt.traceback and "in recurse" in attempt.traceback
    # The cut keeps the end: the message, and the library frames that called the handler below it.
    assert f"RecursionError: maximum recursion depth exceeded\n\n{CALLED_BY_HEADING}" in attempt.traceback
