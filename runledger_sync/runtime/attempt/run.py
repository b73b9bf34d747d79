"""One claimed job, start to finish: the seed's ``process_claimed_job`` on threads.

The pipeline, on the pool thread: mark the job running (or hand the claim
back), run the handler and narrow whatever it does to one outcome, then take
take the attempt's outcome and write it (:mod:`~runledger_sync.runtime.attempt.decision`).
Beside it the pool thread's timer thread runs the watch
(:mod:`~runledger_sync.runtime.attempt.watch`): lease renewal, the deadline, an
operator's cancel missed by the listener. An operator's cancel, told by the
worker's listener, ends the attempt from the polling thread
(:mod:`~runledger_sync.runtime.attempt.cancels`). Whichever decides first takes the
attempt's one outcome; the others' are discarded. Threads cannot be killed: a handler that ignores its
cancellation flag keeps its pool thread (and so its concurrency slot) until it
returns, but its late result is never written.

A handler may instead write its success itself, in its own transaction, with
``ctx.complete_in(conn)``. The job row then stays locked by that transaction
until it ends, and after the handler returns the worker reads the row: a
SUCCEEDED attempt means the handler committed and nothing more is written;
still LEASED means it did not, and the handler's outcome is written as usual.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable, Optional, TypeVar


from runledger_sync.config import JobsConfig
from runledger_sync.core.errors import (
    CheckpointTooLarge,
    InvalidArgument,
    InvalidPayload,
    JobCancelled,
    LeaseOwnerMismatch,
    OutputTooLarge,
    RunledgerError,
    UnstartedClaimReleaseNotApplicable,
)
from runledger_sync.core.continuation import (
    CONTINUATION_OUTPUT_CODE,
    INVALID_CONTINUATION_DELAY_CODE,
    INVALID_RETRY_TIMING_CODE,
    delay_ms,
    describe,
)
from runledger_sync.core.encryption import closed_value, missing_key
from runledger_sync.core.encryption_errors import DecryptionFailed
from runledger_sync.core.exception_rules import Verdict
from runledger_sync.core.evidence import NO_EVIDENCE, FailureEvidence, evidence_of, message_of
from runledger_sync.core.outcomes import (
    HANDLER_EXCEPTION_CODE,
    HANDLER_INVALID_RESULT_CODE,
    HANDLER_NOT_REGISTERED_CODE,
    HANDLER_PANIC_CODE,
    HANDLER_TRANSIENT_ERROR_CODE,
    INVALID_COMPLETION_PROGRESS_CODE,
    Canceled,
    LeaseLost,
    Outcome,
    worker_shutdown_failure,
)
from runledger_sync.core.records import JobRecord
from runledger_sync.core.store_errors import CommitOutcomeUnknown
from runledger_sync.core.types import (
    JobCompletion,
    JobFailure,
    Snooze,
)
from runledger_sync.core.validation import (
    check_failure_code,
    completion_progress_problem,
    serialize_checkpoint,
    serialize_output,
)
from runledger_sync.db.errors import is_connection_loss
from runledger_sync.handlers import run_execute
from runledger_sync.logging import get_logger
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.attempt.state import Attempt, Decider, RunningHandlers
from runledger_sync.runtime.attempt.decision import finish
from runledger_sync.runtime.attempt.completer import Completer
from runledger_sync.runtime.worker.tally import OutcomeTally
from runledger_sync.runtime.attempt.watch import TimerThread, deadline_of, watch
from runledger_sync.store.driver import Driver

log = get_logger(__name__)

T = TypeVar("T")

RUNNING_PROGRESS_PERSIST_FAILED_REASON = "RUNNING_PROGRESS_PERSIST_FAILED"
UNSTARTED_CLAIM_RETRY_DELAY_MS = 1_000
#: How long a claim handed back for a missing encryption key waits: a worker holding the key
#: takes it meanwhile; one without it does not spin on it.
KEY_MISSING_RETRY_DELAY_MS = 10_000


#: ``running`` for a job whose running write has not been made: the pool thread makes it.
WRITE_RUNNING = object()


def process_claimed_job(
    driver: Driver, registry: JobRegistry, job: JobRecord, config: JobsConfig,
    completer: Optional[Completer] = None, running: object = WRITE_RUNNING,
    timer: Optional[TimerThread] = None, tally: Optional[OutcomeTally] = None,
    *, on_ended: Optional[Callable[[], None]] = None, handlers_running: Optional[RunningHandlers] = None,
) -> None:
    """Run one claimed job and write its single outcome (or none when the lease was lost).

    Args:
        completer: the worker's completer, shared with its other jobs; None
            writes this job's outcome on this thread, before this returns.
        running: the answer to this job's running write when the polling thread
            sent it with the claim (None once written, or the error that kept it
            from landing or left its outcome unknown); ``WRITE_RUNNING`` makes it here.
        timer: the calling pool thread's heartbeat timer thread, free for this job;
            None starts one for this job alone.
        tally: counts how the attempt ended, for the worker's periodic summary; the
            per-job "job processed" line is logged at DEBUG.
        on_ended: called once when the attempt is over (its outcome durable, or
            nothing left to write). With ``completer``, a success or retry ends on
            the completer's thread, after this has returned.
        handlers_running: holds the attempt while its handler runs, so a worker
            shutting down past its drain deadline can tell it to stop, and an
            operator's cancel reaches it at once.
    """
    try:
        attempt = Attempt(driver, registry, job, config, completer, tally=tally, on_ended=on_ended)
    except BaseException:
        if on_ended is not None:
            on_ended()  # the slot must come back even when the job could not even be set up
        raise
    if timer is not None:
        _process_with_timer(attempt, running, timer, handlers_running)
        return
    timer = TimerThread(f"runledger-heartbeat-{job.id}")
    try:
        _process_with_timer(attempt, running, timer, handlers_running)
    finally:
        timer.close()


def _process_with_timer(
    attempt: Attempt, running: object, timer: TimerThread, handlers_running: Optional[RunningHandlers],
) -> None:
    job, config = attempt.job, attempt.config
    finishing = attempt.completer.finishing
    handed_off = False
    try:
        if not _mark_running_or_abort(attempt, running):
            attempt.end("not_started")  # handed back, or left to the reaper: the handler never ran
            return
        attempt.begin_running()
        if log.isEnabledFor(logging.DEBUG):
            # Payloads may hold secrets: only an operator's explicit log_payloads shows them.
            shown = {"payload": job.payload} if config.log_payloads else {}
            log.debug("job started", extra=attempt.log_fields | shown)
        started = attempt.started
        first_beat = time.monotonic() + config.heartbeat_interval
        # The timer thread wakes only if the job is still running when its first
        # renewal or its deadline comes; a job done sooner is withdrawn, or replaced
        # by the thread's next job (the watch of a decided attempt returns at once).
        timer.schedule(min(first_beat, deadline_of(attempt, started)), lambda: watch(attempt, timer, started, first_beat))
        handler_started = time.monotonic()
        if handlers_running is not None:
            handlers_running.add(attempt)
        try:
            outcome, evidence, stopped_by = _run_handler(attempt)
        finally:
            if handlers_running is not None:
                handlers_running.discard(attempt)
        attempt.handler_seconds = handler_seconds = time.monotonic() - handler_started
        if finishing is not None:
            finishing.record(handler_seconds)
        if attempt.verdict_pending:
            # The lease ran out while a renewal was in flight: the watch logs the
            # verdict itself once that renewal has said why.
            timer.withdraw()
        elif attempt.take(Decider.HANDLER):
            # From here the watch decides nothing: it returns when it next wakes,
            # unless this thread's next job has replaced it on the timer by then.
            handed_off = finish(attempt, outcome, hand_off=True, evidence=evidence, stopped_by=stopped_by)
        elif not isinstance(outcome, (LeaseLost, Canceled)):
            log.warning(
                "handler finished after its attempt was already decided; result discarded",
                extra=attempt.log_fields | {"late_result": type(outcome).__name__},
            )
    finally:
        # The watch must never outlive the attempt. After a crash above it would
        # otherwise keep renewing a lease nobody works under and later write a
        # timeout; taking the outcome leaves the lease to expire for the reaper, as
        # the seed's dropped task does. When the watch decided the outcome,
        # withdrawing waits for its write to land before the slot is freed.
        if not handed_off:
            attempt.take(Decider.ABANDONED)
            timer.withdraw()
            attempt.end()


# -- step 2: mark running -----------------------------------------------------------


def _mark_running_or_abort(attempt: Attempt, running: object) -> bool:
    closed = missing_key(attempt.job)
    if closed is not None:
        # Never started (the running write leaves such claims alone): handed back unspent, for a worker with the key.
        _release_unstarted(attempt, str(closed), KEY_MISSING_RETRY_DELAY_MS, closed, "job's encryption key is missing")
        return False
    if running is WRITE_RUNNING:
        try:
            attempt.driver.mark_job_running(attempt.identity, event_log=attempt.config.event_log)
        except RunledgerError as error:
            running = error
        else:
            running = None
    if isinstance(running, CommitOutcomeUnknown) and attempt.driver.running_landed(attempt.identity):
        running = None  # the write landed before its connection went
    if running is None:
        return True
    if isinstance(running, LeaseOwnerMismatch):
        log.warning(
            "aborting job before execution because lease ownership was already lost",
            extra=attempt.log_fields | {"error": str(running)},
        )
    else:
        # Whatever kept the group's write from landing (a lost connection, the
        # writer stopping), the job never started: hand its claim back.
        _release_after_running_persist_failure(attempt, running)
    return False


def _release_after_running_persist_failure(attempt: Attempt, error: object) -> None:
    _release_unstarted(attempt, RUNNING_PROGRESS_PERSIST_FAILED_REASON, UNSTARTED_CLAIM_RETRY_DELAY_MS, error,
                       "running progress could not be persisted")


def _release_unstarted(attempt: Attempt, reason: str, delay_ms: int, error: object, why: str) -> None:
    fields = attempt.log_fields | {"error": str(error)}
    try:
        attempt.driver.release_unstarted_job_claim(**attempt.identity.keywords(), reason=reason, delay_ms=delay_ms)
    except UnstartedClaimReleaseNotApplicable as release_error:
        log.warning(
            f"{why}; unstarted release no longer applies and the job will continue under the current lease owner",
            extra=fields | {"release_error": str(release_error)},
        )
    except RunledgerError as release_error:
        log.warning(
            f"{why}; leaving claim for reaper recovery",
            extra=fields | {"release_error": str(release_error)},
        )
    else:
        log.warning(f"{why}; released unstarted claim back to pending", extra=fields)


# -- step 3: the handler and its watchdog ----------------------------------------------


def _run_handler(attempt: Attempt) -> tuple[Outcome, FailureEvidence, Optional[Verdict]]:
    """Call the handler and narrow whatever it does to one Outcome, with the evidence of the exception behind it.

    The third value is the job type's setting that made the handler's exception a panic, if one did.
    """
    handler = attempt.registry.get(attempt.job.job_type)
    closed = closed_value(attempt.job)
    if closed is not None:
        # Its key is here but does not open it (other key bytes, or a ciphertext from another row).
        return JobFailure.terminal(DecryptionFailed.code, str(closed)), NO_EVIDENCE, None
    if handler is None:
        failure = JobFailure.terminal(HANDLER_NOT_REGISTERED_CODE, "No handler is registered for this job type.")
        return failure, NO_EVIDENCE, None
    try:
        result = attempt.registry.hooks.run(
            functools.partial(run_execute, handler), attempt.context, attempt.job.payload)
    except Snooze as snooze:
        # A snooze is a continuation that keeps the stored checkpoint (checkpoint None).
        result = JobCompletion(continue_after=snooze.seconds)
    except BaseException as exc:  # noqa: BLE001 - a handler may raise anything, even SystemExit
        abandoned = attempt.forced_outcome()
        if abandoned is not None:
            # A cancel, a timeout or a lost lease: what the handler raised once told to stop is not the cause.
            return abandoned, NO_EVIDENCE, None
        return _failure_of(attempt, exc)
    return attempt.forced_outcome() or _completion_outcome(result, attempt.config), NO_EVIDENCE, None


def _failure_of(attempt: Attempt, exc: BaseException) -> tuple[JobFailure, FailureEvidence, Optional[Verdict]]:
    """The failure the handler's exception makes (its choice, a free reconnect, a retry or a panic), with its evidence."""
    if isinstance(exc, JobCancelled) and attempt.interrupted:
        log.warning("job stopped by the worker's shutdown; it runs again without spending an attempt",
                    extra=attempt.log_fields)
        return worker_shutdown_failure(), NO_EVIDENCE, None
    evidence = evidence_of(exc)
    if isinstance(exc, JobFailure):
        return _recordable(exc), evidence, None
    if isinstance(exc, OutputTooLarge):
        # ctx.complete_in refused the output: the same code would return it again.
        return JobFailure.terminal(exc.code, f"The handler's {exc.message}; the output was not stored."), evidence, None
    if isinstance(exc, CheckpointTooLarge):
        # ctx.report_progress or ctx.complete_in refused it, and the handler let that end it.
        return JobFailure.terminal(exc.code, f"The handler's {exc.message}; the checkpoint was not stored."), evidence, None
    if isinstance(exc, JobCancelled):
        # Not an Exception: no rule retries a request to stop.
        return _panic(attempt, exc, evidence, "a request to stop is never retried"), evidence, None
    if is_connection_loss(exc):
        return _connection_lost(attempt, exc, evidence), evidence, None
    verdict = attempt.registry.exception_rules(attempt.job.job_type).classify(exc)
    if verdict is Verdict.RETRY:
        log.warning(f"job handler raised {type(exc).__name__}: a retryable failure that spends an attempt", exc_info=exc,
                    extra=attempt.log_fields | {"error_type": evidence.error_type})
        return JobFailure.retryable(HANDLER_EXCEPTION_CODE, _plain(exc)), evidence, None
    return _panic(attempt, exc, evidence, _PANIC_BECAUSE[verdict]), evidence, verdict


def _recordable(failure: JobFailure) -> JobFailure:
    """The handler's failure, or a terminal one when its code cannot be stored.

    The store would refuse the write, and the failure would be lost to a lease
    expiry. (NUL and lone surrogates in the code or message are replaced by the
    store, not refused.) Likewise a retry hint that is no valid delay.
    """
    try:
        check_failure_code(failure.code)
    except InvalidArgument as error:
        return JobFailure.terminal(
            HANDLER_INVALID_RESULT_CODE, f"Handler raised a JobFailure whose {error.message}: {failure.message}"
        )
    if failure.retry_after is not None and delay_ms(failure.retry_after) is None:
        return JobFailure.terminal(
            INVALID_RETRY_TIMING_CODE,
            f"Handler raised a JobFailure whose retry_after is {describe(failure.retry_after)}; "
            f"expected a timedelta from zero to 365 days: {failure.message}",
        )
    return failure


def _completion_outcome(result: Any, config: JobsConfig) -> Outcome:
    if result is None:
        return JobCompletion()
    if not isinstance(result, JobCompletion):
        return JobFailure.terminal(
            HANDLER_INVALID_RESULT_CODE,
            f"Handler returned a {type(result).__name__}; return None for a plain success, or "
            "rl.JobCompletion(output=...) to keep a result (progress and checkpoint too); nothing was stored.",
        )
    # Checked here, not left to the store: a str progress would crash the
    # comparison below, and a non-JSON output would fail the success write and
    # leave the lease to the reaper, which retries the same broken result.
    for name in ("progress_done", "progress_total"):
        value = getattr(result, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return JobFailure.terminal(
                HANDLER_INVALID_RESULT_CODE, f"Handler returned a JobCompletion whose {name} is not an int but a {type(value).__name__}."
            )
    try:
        serialize_checkpoint(result.checkpoint, max_bytes=config.max_payload_bytes)
        serialize_output(result.output, max_bytes=config.max_output_bytes)
    except OutputTooLarge as error:
        # Terminal: the same code returns the same output, so a retry cannot help.
        return JobFailure.terminal(
            OutputTooLarge.code,
            f"Handler returned an output of {error.value}, over the limit of {config.max_output_bytes} bytes "
            "(max_output_bytes); the output was not stored.",
        )
    except CheckpointTooLarge as error:
        # Terminal, as an output too large is; a checkpoint has the payload's limit.
        return JobFailure.terminal(
            CheckpointTooLarge.code,
            f"Handler returned a checkpoint of {error.value}, over the limit of {config.max_payload_bytes} bytes "
            "(max_payload_bytes); the checkpoint was not stored.",
        )
    except InvalidPayload as error:
        return JobFailure.terminal(
            HANDLER_INVALID_RESULT_CODE,
            f"Handler returned a JobCompletion whose {error.argument} is not JSON: {error.message}",
        )
    problem = completion_progress_problem(result.progress_done, result.progress_total)
    if problem is not None:
        return JobFailure.terminal(INVALID_COMPLETION_PROGRESS_CODE, problem)
    if result.continue_after is not None:
        return _continuation_problem(result) or result
    return result


def _continuation_problem(result: JobCompletion) -> Optional[JobFailure]:
    """The terminal failure a continuation the store cannot write makes; None for a valid one."""
    if delay_ms(result.continue_after) is None:
        return JobFailure.terminal(
            INVALID_CONTINUATION_DELAY_CODE,
            f"Handler asked to continue after {describe(result.continue_after)}; "
            "expected a timedelta or seconds from zero to 365 days.",
        )
    if result.output is not None:
        return JobFailure.terminal(
            CONTINUATION_OUTPUT_CODE, "Handler returned an output with a continuation; only a finished job has one.",
        )
    return None


def _plain(exc: BaseException) -> str:
    """``KeyError: 'x'``: the exception's type name and its message, as the job's last error keeps it."""
    return f"{type(exc).__name__}: {message_of(exc)}"


def _connection_lost(attempt: Attempt, exc: BaseException, evidence: FailureEvidence) -> JobFailure:
    # A database restart or failover is not a bug in the handler: the attempt retries
    # without spending one. Only the first line: a SQLAlchemy error goes on with the
    # statement and its parameters. Logged without exc_info for the same reason: the
    # log's traceback would print the whole message (the attempt row keeps the
    # traceback, messages cut alike).
    summary = f"{type(exc).__name__}: {(message_of(exc).strip().splitlines() or [''])[0]}"
    log.warning("job handler lost its database connection; the job retries without spending an attempt",
                extra=attempt.log_fields | {"error": summary, "error_type": evidence.error_type})
    return JobFailure.retryable(HANDLER_TRANSIENT_ERROR_CODE, summary)


#: Why a handler's exception was not retried, for the log line (the stored words are core.exception_rules').
_PANIC_BECAUSE = {Verdict.DEAD_LETTER_ON: "it is in dead_letter_on", Verdict.NOT_IN_RETRY_ON: "it is not in retry_on"}


def _panic(attempt: Attempt, exc: BaseException, evidence: FailureEvidence, why: str) -> JobFailure:
    # exc_info, not a text field: error trackers' logging integrations (Sentry's)
    # report the exception itself. Never the payload: the traceback has no locals.
    log.error(f"job handler raised {type(exc).__name__}; the job is dead-lettered without a retry: {why}",
              exc_info=exc, extra=attempt.log_fields | {"error_type": evidence.error_type})
    return JobFailure.panicked(HANDLER_PANIC_CODE, _plain(exc))
