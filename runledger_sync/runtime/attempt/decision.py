"""The attempt's one outcome: decide its transition, have the completer write it, act on the answer.

The decision is made here, once, before anything is written: a success; a
continuation (:func:`~runledger_sync.core.outcomes.decide_continuation`: run
again later, unless the job used up its type's continuations or its workflow
step, which is read, did not opt in); or for a failure
:func:`~runledger_sync.core.outcomes.decide_failure` (retry after a delay, or
dead-letter), which reads the run's earlier attempts when the failure is
retryable. The :class:`~runledger_sync.runtime.attempt.completer.Completer`
writes it as decided. A pool thread hands its outcome off and moves on: the
completer ends the attempt (frees its slot) once the outcome is durable. A
dead letter's hook, and the registry's failure hooks, run on the pool thread
that waits for its write (a failure with hooks is not handed off), and the
watch always waits, since its handler may still be running.

A success is logged as failed (ERROR) only when it did not land; one whose
reply was lost is logged at INFO once the row shows it landed.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional, TypeVar

from runledger_sync.core.errors import InvalidCompletionProgress
from runledger_sync.core.evidence import NO_EVIDENCE, FailureEvidence
from runledger_sync.core.continuation import DEFAULT_MAX_CONTINUATIONS
from runledger_sync.core.exception_rules import Verdict
from runledger_sync.core.outcomes import (
    HANDLER_TRANSIENT_ERROR_CODE,
    INVALID_COMPLETION_PROGRESS_CODE,
    Canceled,
    Continue,
    DeadLetter,
    EarlierAttempts,
    LeaseLost,
    Outcome,
    Retry,
    Succeed,
    Written,
    decide_continuation,
    decide_failure,
)
from runledger_sync.core.store_errors import CommitOutcomeUnknown, ConnectionFailed
from runledger_sync.core.types import JobCompletion, JobFailure
from runledger_sync.core.states import JobStatus
from runledger_sync.core.workflow_errors import WorkflowReleaseConflict
from runledger_sync.logging import get_logger
from runledger_sync.runtime.attempt.state import Attempt
from runledger_sync.runtime.attempt.completer import LANDED_AFTER_LOST_REPLY, wait_for_answer, with_retries
from runledger_sync.runtime.hooks import run_dead_letter_hook, run_failure_hooks
from runledger_sync.runtime.observer import failure_observer

log = get_logger(__name__)

#: The least time an outcome write is given, even when the lease is nearly out:
#: one try and its read-back.
MIN_OUTCOME_WRITE_SECONDS = 1.0

#: Logged at INFO for an outcome whose write landed though its reply was lost (``what``: its noun).
REPLY_LOST = "job {what} landed; its reply was lost"
SUCCESS_REPLY_LOST = REPLY_LOST.format(what=Succeed.noun)
#: Logged at INFO, once, for an attempt whose job an operator canceled (with the operator's ``reason``).
CANCELED_BY_OPERATOR = "job canceled by operator"

T = TypeVar("T")


def finish(
    attempt: Attempt, outcome: Outcome, *, hand_off: bool = False, evidence: FailureEvidence = NO_EVIDENCE,
    stopped_by: Optional[Verdict] = None,
) -> bool:
    """Decide the attempt's transition and have it written.

    Args:
        hand_off: the caller frees the attempt's slot only through the return
            value: True means the completer ends the attempt once its outcome is
            durable (a pool thread's success or retry); the caller moves on.
        evidence: the exception behind a failure (its type and traceback are
            written with the attempt row; the hooks and the observer get the exception).
        stopped_by: the job type's setting that made the handler's exception a panic, if one did.

    Returns:
        True when the completer took the attempt and will end it.
    """
    if attempt.completed_in_transaction and not isinstance(outcome, (LeaseLost, Canceled)) and _committed_by_handler(
            attempt, outcome):
        return False
    if isinstance(outcome, Canceled):
        attempt.ended_with(outcome)
        log.info(CANCELED_BY_OPERATOR, extra=attempt.log_fields | {"reason": outcome.reason})
        return False
    if isinstance(outcome, LeaseLost):
        attempt.ended_with(outcome)
        log.warning(
            "job processing aborted because durable lease maintenance was lost",
            extra=attempt.log_fields | {"failure_code": outcome.code},
        )
        return False
    transition = _decide(attempt, outcome, evidence, stopped_by)
    if transition is None:
        return False
    return _write(attempt, transition, hand_off=hand_off)


def _decide(
    attempt: Attempt, outcome: JobCompletion | JobFailure, evidence: FailureEvidence, stopped_by: Optional[Verdict],
) -> Optional[Written]:
    """The transition ``outcome`` makes; None when what it depends on (earlier attempts, the step) could not be read."""
    if not isinstance(outcome, JobFailure):
        if outcome.continue_after is None:
            return Succeed(outcome)
        return _decide_continuation(attempt, outcome)
    job = attempt.job
    earlier = EarlierAttempts()
    if outcome.kind.is_retryable:
        read = _read_for_decision(
            attempt, "failure", lambda: attempt.driver.read_earlier_attempts(attempt.identity))
        if read is None:
            return None
        earlier = read
    override = attempt.registry.retry_delay_override(job.job_type, outcome.code) if outcome.kind.is_retryable else None
    return decide_failure(job, outcome, earlier, retry_delay_override=override, evidence=evidence, stopped_by=stopped_by)


def _decide_continuation(attempt: Attempt, completion: JobCompletion) -> Optional[Continue | DeadLetter]:
    job = attempt.job
    handler = attempt.registry.get(job.job_type)
    # The registry's cap, the one sync_definitions stores on the type's definition.
    cap = DEFAULT_MAX_CONTINUATIONS
    if handler is not None and handler.max_continuations is not None:
        cap = handler.max_continuations
    step_allows = True
    if job.workflow_step_id is not None:
        step_id = job.workflow_step_id
        read = _read_for_decision(
            attempt, "continuation", lambda: attempt.driver.step_allows_continuation(step_id))
        if read is None:
            return None
        step_allows = read
    return decide_continuation(job, completion, max_continuations=cap, step_allows=step_allows)


def _read_for_decision(attempt: Attempt, what: str, read: Callable[[], T]) -> Optional[T]:
    """What the decision reads, retried as its write would be; None (logged) when the database stayed out of reach.

    Nothing is written then: the job stays LEASED, and the reaper retries it once its lease runs out.
    """
    try:
        return with_retries(read, give_up_at=_give_up_at(attempt), keep_trying=attempt.completer.keeps_trying)
    except ConnectionFailed as error:
        log.warning(f"job {what} could not be decided: the database stayed out of reach; "
                    "the reaper retries the job", extra=attempt.log_fields | {"error": str(error)})
        return None


def _write(attempt: Attempt, transition: Written, *, hand_off: bool) -> bool:
    """Post the transition; hand the attempt's end to the completer, or wait for the answer here."""
    completer = attempt.completer
    if hand_off and completer.threaded and not _hooked(attempt, transition):
        completer.post(attempt.identity, transition, give_up_at=_give_up_at(attempt),
                       on_answer=lambda answer: _answered_off_thread(attempt, transition, answer))
        return True
    answer = wait_for_answer(completer, attempt.identity, transition, give_up_at=_give_up_at(attempt))
    invalid = _answered(attempt, transition, answer)
    if invalid is not None:
        _write(attempt, invalid, hand_off=False)
    return False


def _hooked(attempt: Attempt, transition: Written) -> bool:
    """True when a hook waits for the transition to land: it runs on the deciding thread, never the completer's."""
    return isinstance(transition, DeadLetter) or (transition.failure is not None and bool(attempt.registry.failure_hooks))


def _answered_off_thread(attempt: Attempt, transition: Written, answer: object) -> None:
    """On the completer's thread: act on the answer and end the attempt (quick, no database).

    When the store refused a success's progress, the terminal failure that
    replaces it is the completer's second item for the attempt: posted from
    here, and the attempt ends once it is answered. Its hooks (a dead letter's)
    must not hold the completer's thread, so they run on a thread of their own.
    """
    invalid = _answered(attempt, transition, answer)
    if invalid is None:
        attempt.end()
        return
    attempt.completer.post(attempt.identity, invalid, give_up_at=_give_up_at(attempt),
                           on_answer=lambda second: _invalid_answered(attempt, invalid, second))


def _invalid_answered(attempt: Attempt, invalid: Written, answer: object) -> None:
    def record() -> None:
        try:
            _answered(attempt, invalid, answer)
        finally:
            attempt.end()

    if _hooked(attempt, invalid):
        threading.Thread(target=record, name=f"runledger-hooks-{attempt.job.id}", daemon=True).start()
    else:
        record()


def _answered(attempt: Attempt, transition: Written, answer: object) -> Optional[Written]:
    """Log what the write's answer means; the terminal failure to write instead, when the store refused the progress."""
    fields = attempt.log_fields
    what = transition.noun
    if answer is None or answer is LANDED_AFTER_LOST_REPLY:
        attempt.ended_with(transition)
        if answer is LANDED_AFTER_LOST_REPLY:
            log.info(REPLY_LOST.format(what=what), extra=fields | {"write": "completer"})
        if transition.failure is not None:
            _failure_recorded(attempt, transition)
        return None
    if isinstance(answer, InvalidCompletionProgress) and transition.carries_progress:
        log.warning("handler returned invalid success completion; marking job terminal",
                    extra=fields | {"failure_code": answer.code})
        failure = JobFailure.terminal(INVALID_COMPLETION_PROGRESS_CODE, answer.message)
        return decide_failure(attempt.job, failure, EarlierAttempts())
    if isinstance(answer, WorkflowReleaseConflict):
        log.warning(f"job {what} completion conflicted with workflow cancellation; leaving lease for reaper recovery",
                    extra=fields | {"error": str(answer)})
    elif isinstance(answer, CommitOutcomeUnknown):
        log.warning(f"job {what} may not have landed: its reply was lost and the database stayed out of reach; "
                    "if it did not land, the reaper retries the job", extra=fields | {"error": str(answer)})
    else:  # the fence refused it (LeaseOwnerMismatch), or the database did
        log.error(f"failed to mark job {what}", extra=fields | {"error": str(answer)})
    return None


def _failure_recorded(attempt: Attempt, transition: Retry | DeadLetter) -> None:
    """Tell the observer and the hooks of a failed attempt whose outcome is durable."""
    failure, exception = transition.failure, transition.evidence.exception
    observe = failure_observer(attempt.observer)
    if observe is not None:
        observe(attempt.job.job_type, failure, exception)
    hooks = attempt.registry.failure_hooks
    if hooks:
        # Not on the completer's thread: a failure with hooks is never handed off (_hooked).
        run_failure_hooks(hooks, attempt.context, attempt.job.payload, exception or failure,
                          timeout_seconds=attempt.config.dead_letter_hook_timeout_seconds,
                          log_fields=attempt.log_fields)
    if isinstance(transition, DeadLetter):
        _dead_lettered(attempt, transition)


def _dead_lettered(attempt: Attempt, transition: DeadLetter) -> None:
    job, failure, info = attempt.job, transition.failure, transition.info
    log.warning(
        "job dead lettered after handler failure",
        extra=attempt.log_fields | {
            "max_attempts": job.max_attempts, "dead_letter_reason": info.reason.value,
            "not_retried_because": info.not_retried_because,
            "failure_kind": failure.kind.value, "failure_code": failure.code, "failure_message": failure.message,
            "error_type": transition.evidence.error_type,
        },
    )
    handler = attempt.registry.get(job.job_type)
    if handler is not None:
        run_dead_letter_hook(
            handler, attempt.context, job.payload, info,
            timeout_seconds=attempt.config.dead_letter_hook_timeout_seconds, log_fields=attempt.log_fields,
        )


def _committed_by_handler(attempt: Attempt, outcome: Outcome) -> bool:
    """True when nothing more is to be written for an attempt whose handler used complete_in.

    That is when its transaction committed the success, and when whether it did
    cannot be read (nothing could be written either; if it did not commit, the
    lease runs out and the reaper retries the job). Otherwise the outcome is
    written as usual; the lease fence makes that safe even if the read was
    wrong, since a second success or a late failure cannot land on a SUCCEEDED row.
    """
    identity = attempt.identity
    try:
        landed = with_retries(lambda: attempt.driver.get_job(identity.job_id),
                              give_up_at=_give_up_at(attempt))
    except ConnectionFailed as error:
        log.warning("could not read whether the handler's transaction committed the job's success; "
                    "if it did not, the reaper retries the job", extra=attempt.log_fields | {"error": str(error)})
        return True
    if (landed is None or (landed.run_number, landed.attempt) != (identity.run_number, identity.attempt)
            or landed.status is not JobStatus.SUCCEEDED):
        log.warning("handler completed the job in its own transaction but did not commit it; writing its outcome",
                    extra=attempt.log_fields | {"outcome": type(outcome).__name__})
        return False
    attempt.ended_with(Succeed(JobCompletion()))
    if isinstance(outcome, JobFailure) and outcome.code == HANDLER_TRANSIENT_ERROR_CODE:
        # The connection failed after the commit: most often the commit's own reply was lost.
        log.info(SUCCESS_REPLY_LOST, extra=attempt.log_fields | {"write": "handler_transaction",
                                                                  "error": outcome.message})
    elif isinstance(outcome, JobFailure):
        log.warning("handler failed after committing its own success; the success stands",
                    extra=attempt.log_fields | {"failure_code": outcome.code})
    else:
        log.info("job success committed in the handler's transaction", extra=attempt.log_fields)
    return True


def _give_up_at(attempt: Attempt) -> float:
    # A lost connection is retried at least for as long as the lease lasts (by this
    # process's clock), so a database restart shorter than the lease never hands the
    # job to the reaper, which would spend an attempt. The completer's own thread
    # tries on past it while the worker lives (Completer.keeps_trying).
    return max(time.monotonic() + MIN_OUTCOME_WRITE_SECONDS, attempt.local_lease_deadline)
