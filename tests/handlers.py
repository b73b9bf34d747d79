"""Scripted job handlers for the runtime tests, after rq's ``fixtures.py`` and Oban's scripted worker.

Each factory returns a ``fn(ctx, payload)`` handler whose name says what it does.
Handlers report to a :class:`Probe`: a thread-safe log of calls, a concurrency
counter and ``threading.Event`` signals, so tests wait on what happened instead
of sleeping (the probe's lock is a Condition notified on every change).
Payloads carry :data:`SECRET` so a test can prove that no log record ever
shows payload contents.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from sqlalchemy import text

from runledger_sync.config import JobsConfig
from runledger_sync.core.types import JobCompletion, JobContext, JobDeadLetterInfo, JobFailure
from runledger_sync.registry import JobRegistry

#: Put in payloads; must never appear in any log record.
SECRET = "payload-secret-5f1e9c"

Handler = Callable[[JobContext, Any], Optional[JobCompletion]]

#: Intervals short enough for a 2-core machine shared with other test runs.
FAST_CONFIG: dict[str, Any] = dict(
    worker_id="worker-test",
    poll_interval_ms=20,
    claim_batch_size=4,
    lease_ttl_seconds=5,
    heartbeat_interval_seconds=0.3,
    max_global_concurrency=4,
    reaper_interval_seconds=0.2,
    # Reaped jobs stay out of the way unless a test asks for a quick retry.
    reaper_retry_delay_ms=60_000,
    timeout_grace_seconds=0.5,
    dead_letter_hook_timeout_seconds=0.1,
)


def fast_config(**overrides: Any) -> JobsConfig:
    """A JobsConfig with :data:`FAST_CONFIG`, changed by ``overrides``."""
    return JobsConfig(**(FAST_CONFIG | overrides))


#: How long a blocking handler waits before giving up, so a failed test cannot hang the run.
MAX_BLOCK_SECONDS = 20.0


@dataclass
class Call:
    job_id: Any
    attempt: int
    worker_id: str
    started: float
    ended: Optional[float] = None
    cancelled_at: Optional[float] = None
    cancel_reason: Optional[str] = None


@dataclass
class Probe:
    """What the handlers of one test did, shared across their threads."""

    lock: threading.Condition = field(default_factory=threading.Condition)
    calls: list[Call] = field(default_factory=list)
    running: int = 0
    peak: int = 0
    #: Blocking handlers return once this is set.
    release: threading.Event = field(default_factory=threading.Event)
    dead_letters: list[tuple[JobContext, Any, JobDeadLetterInfo, Any]] = field(default_factory=list)
    notes: list[Any] = field(default_factory=list)

    def enter(self, ctx: JobContext) -> Call:
        call = Call(ctx.job_id, ctx.attempt, ctx.worker_id, time.monotonic())
        with self.lock:
            self.calls.append(call)
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.lock.notify_all()
        return call

    def leave(self, call: Call, ctx: JobContext) -> None:
        if ctx.cancelled:
            call.cancel_reason = ctx.cancel_reason
        with self.lock:
            call.ended = time.monotonic()
            self.running -= 1
            self.lock.notify_all()

    def note(self, value: Any) -> None:
        with self.lock:
            self.notes.append(value)
            self.lock.notify_all()

    def count(self) -> int:
        with self.lock:
            return len(self.calls)

    def wait_calls(self, n: int, timeout: float = 10.0) -> list[Call]:
        """Wait until at least ``n`` handler calls started; return them."""
        with self.lock:
            if not self.lock.wait_for(lambda: len(self.calls) >= n, timeout):
                raise AssertionError(f"expected {n} handler calls within {timeout} s, got {len(self.calls)}")
            return list(self.calls)

    def wait_ended(self, n: int, timeout: float = 10.0) -> list[Call]:
        """Wait until at least ``n`` handler calls returned or raised; return all calls."""
        with self.lock:
            ended = lambda: sum(call.ended is not None for call in self.calls) >= n  # noqa: E731
            if not self.lock.wait_for(ended, timeout):
                raise AssertionError(f"expected {n} handler returns within {timeout} s")
            return list(self.calls)

    def wait_dead_letters(self, n: int, timeout: float = 10.0) -> list[tuple[JobContext, Any, JobDeadLetterInfo, Any]]:
        with self.lock:
            if not self.lock.wait_for(lambda: len(self.dead_letters) >= n, timeout):
                got = len(self.dead_letters)
                raise AssertionError(f"expected {n} dead-letter hook calls within {timeout} s, got {got}")
            return list(self.dead_letters)


def scripted(probe: Probe, body: Callable[[JobContext, Any, Call], Any]) -> Handler:
    """Wrap ``body(ctx, payload, call)`` so the probe sees every start and end, however it ends."""

    def handler(ctx: JobContext, payload: Any) -> Any:
        call = probe.enter(ctx)
        try:
            return body(ctx, payload, call)
        finally:
            probe.leave(call, ctx)

    handler.__name__ = getattr(body, "__name__", "scripted")
    return handler


# -- outcomes ---------------------------------------------------------------------


def ok(probe: Probe, completion: Optional[JobCompletion] = None) -> Handler:
    """Succeed at once, returning ``completion`` (None: plain success)."""
    return scripted(probe, lambda ctx, payload, call: completion)


def fail_retryable(probe: Probe, code: str = "test.retryable", message: str = "try again later") -> Handler:
    def body(ctx: JobContext, payload: Any, call: Call) -> None:
        raise JobFailure.retryable(code, message)

    return scripted(probe, body)


def fail_terminal(probe: Probe, code: str = "test.terminal", message: str = "cannot ever work") -> Handler:
    def body(ctx: JobContext, payload: Any, call: Call) -> None:
        raise JobFailure.terminal(code, message)

    return scripted(probe, body)


def raise_error(probe: Probe, error: BaseException) -> Handler:
    """Raise ``error`` (any exception: retried, spending an attempt, unless the job type's rules dead-letter it)."""

    def body(ctx: JobContext, payload: Any, call: Call) -> None:
        raise error

    return scripted(probe, body)


def kill_thread(probe: Probe) -> Handler:
    """Raise SystemExit, which ends the thread it reaches the top of."""
    return raise_error(probe, SystemExit("handler thread killed"))


def wrong_return(probe: Probe, value: Any) -> Handler:
    """Return something that is neither None nor a JobCompletion."""
    return scripted(probe, lambda ctx, payload, call: value)


# -- blocking ---------------------------------------------------------------------


def hang(probe: Probe, result: Optional[JobCompletion] = None) -> Handler:
    """Block until ``probe.release`` is set, ignoring cancellation, then return ``result``."""

    def body(ctx: JobContext, payload: Any, call: Call) -> Optional[JobCompletion]:
        if not probe.release.wait(MAX_BLOCK_SECONDS):
            raise AssertionError("hang handler was never released")
        return result

    return scripted(probe, body)


def ignore_cancel(probe: Probe) -> Handler:
    """Block like :func:`hang`, noting when the cancellation flag went up, but never obey it."""

    def body(ctx: JobContext, payload: Any, call: Call) -> None:
        deadline = time.monotonic() + MAX_BLOCK_SECONDS
        while not probe.release.wait(0.02):
            if ctx.cancelled and call.cancelled_at is None:
                call.cancelled_at = time.monotonic()
            if time.monotonic() > deadline:
                raise AssertionError("ignore_cancel handler was never released")
        return None

    return scripted(probe, body)


def cooperative_sleep(probe: Probe, seconds: float = MAX_BLOCK_SECONDS) -> Handler:
    """Sleep up to ``seconds`` but wake on cancellation and stop with JobCancelled."""

    def body(ctx: JobContext, payload: Any, call: Call) -> None:
        if ctx.wait_cancelled(seconds):
            call.cancelled_at = time.monotonic()
        ctx.check_cancelled()

    return scripted(probe, body)


# -- effects ------------------------------------------------------------------------

SIDE_EFFECTS_DDL = "CREATE TABLE IF NOT EXISTS side_effects (job_id uuid, attempt int, note text)"


def record_side_effect(probe: Probe, engine: Any, note: str = "ran") -> Handler:
    """Insert one row into ``side_effects`` (create it with :data:`SIDE_EFFECTS_DDL`), then succeed."""

    def body(ctx: JobContext, payload: Any, call: Call) -> None:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO side_effects VALUES (:j, :a, :n)"),
                         {"j": ctx.job_id, "a": ctx.attempt, "n": note})

    return scripted(probe, body)


def report_then_wait(probe: Probe, done: int, total: int, checkpoint: Any = None,
                     completion: Optional[JobCompletion] = None) -> Handler:
    """Persist progress with ``ctx.report_progress``, wait for ``probe.release``, return ``completion``."""

    def body(ctx: JobContext, payload: Any, call: Call) -> Optional[JobCompletion]:
        ctx.report_progress(done, total, checkpoint)
        probe.note(("reported", ctx.checkpoint))
        if not probe.release.wait(MAX_BLOCK_SECONDS):
            raise AssertionError("report_then_wait handler was never released")
        return completion

    return scripted(probe, body)


# -- dead-letter hooks --------------------------------------------------------------


def recording_hook(probe: Probe, engine: Any = None) -> Callable[[JobContext, Any, JobDeadLetterInfo], None]:
    """Record every call; with ``engine``, also the job's status as the hook sees it (is it committed?)."""

    def hook(ctx: JobContext, payload: Any, info: JobDeadLetterInfo) -> None:
        status = None
        if engine is not None:
            with engine.connect() as conn:
                status = conn.execute(text("SELECT status FROM job_queue WHERE id = :id"), {"id": ctx.job_id}).scalar()
        with probe.lock:
            probe.dead_letters.append((ctx, payload, info, status))
            probe.lock.notify_all()

    return hook


def hanging_hook(probe: Probe) -> Callable[[JobContext, Any, JobDeadLetterInfo], None]:
    """Record the call, then block until ``probe.release`` (longer than any hook timeout in the tests)."""

    def hook(ctx: JobContext, payload: Any, info: JobDeadLetterInfo) -> None:
        with probe.lock:
            probe.dead_letters.append((ctx, payload, info, "hanging"))
            probe.lock.notify_all()
        probe.release.wait(MAX_BLOCK_SECONDS)

    return hook


def raising_hook(probe: Probe) -> Callable[[JobContext, Any, JobDeadLetterInfo], None]:
    def hook(ctx: JobContext, payload: Any, info: JobDeadLetterInfo) -> None:
        with probe.lock:
            probe.dead_letters.append((ctx, payload, info, "raising"))
            probe.lock.notify_all()
        raise RuntimeError("dead-letter hook exploded")

    return hook


def registry_with(job_type: str, handler: Handler, **options: Any) -> JobRegistry:
    """A registry holding one function handler registered with ``options``."""
    registry = JobRegistry()
    registry.job(job_type, **options)(handler)
    return registry
