"""How an attempt ends, decided as a value before anything is written (spec sections 5, 6 and 12).

A handler's result (a completion, a failure) or the watch's verdict (the lease
was lost, an operator canceled the job) becomes one :data:`Transition`: succeed,
retry after a delay, dead-letter for a reason, or write nothing. :func:`decide_failure` is the one
place the retry delay and the dead-letter rule are applied to a failure; the
store's failure write and the reaper ask :func:`dead_letter_reason` the same
question of the locked row.

Which uncaught handler exceptions are retried is the job type's rule
(:mod:`~runledger_sync.core.exception_rules`). Only a lost connection to the
queue's database (``job.handler_transient_error``: a server restarting, a
failover) spends none of the job's ``max_attempts``, so
a database restart never dead-letters work. Its own budget bounds it:
:data:`TRANSIENT_FAILURE_BUDGET` such failures in a row retry on the transient
schedule; from the next one on, each spends an attempt like any retryable
failure. An attempt the worker's shutdown stopped (``job.worker_shutdown``: the
handler gave up when told to at the drain deadline) is an interruption of the
same kind and shares that budget, so a deploy never dead-letters work either.
``attempt`` still counts claims, so a job's ``attempt`` may exceed its
``max_attempts``: the rule counts the run's earlier attempts
(:class:`EarlierAttempts`), not the claims.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, Optional, Union

from runledger_sync.core import backoff
from runledger_sync.core.continuation import (
    CONTINUATION_LIMIT_CODE,
    WORKFLOW_CONTINUATION_NOT_ENABLED_CODE,
    delay_ms,
)
from runledger_sync.core.evidence import NO_EVIDENCE, FailureEvidence
from runledger_sync.core.exception_rules import Verdict, not_retried_because
from runledger_sync.core.records import JobRecord
from runledger_sync.core.types import (
    JobCompletion,
    JobDeadLetterInfo,
    JobDeadLetterReason,
    JobFailure,
    JobFailureKind,
)

# The failure codes the runtime records (spec section 12, runtime failure codes).
HANDLER_PANIC_CODE = "job.handler_panic"
#: An uncaught handler exception its job type's rules retry: it spends an attempt.
HANDLER_EXCEPTION_CODE = "job.handler_exception"
HANDLER_TRANSIENT_ERROR_CODE = "job.handler_transient_error"
HANDLER_NOT_REGISTERED_CODE = "job.handler_not_registered"
HANDLER_INVALID_RESULT_CODE = "job.handler_invalid_result"
INVALID_COMPLETION_PROGRESS_CODE = "job.invalid_completion_progress"
TIMEOUT_EXCEEDED_CODE = "job.timeout_exceeded"
LEASE_OWNER_MISMATCH_CODE = "job.lease_owner_mismatch"
LEASE_MAINTENANCE_FAILED_CODE = "job.lease_maintenance_failed"
LEASE_EXPIRED_CODE = "job.lease_expired"
LEASE_EXPIRED_MESSAGE = "Job lease expired before completion."
WORKER_SHUTDOWN_CODE = "job.worker_shutdown"
#: Failures of the infrastructure rather than of the job: within their budget they spend no attempt.
FREE_FAILURE_CODES = frozenset({HANDLER_TRANSIENT_ERROR_CODE, WORKER_SHUTDOWN_CODE})

#: Transient failures in a row that spend none of a job's attempts. With the
#: transient backoff (:func:`~runledger_sync.core.backoff.compute_transient_retry_delay_ms`)
#: they span about 15 minutes, longer than a database restart takes.
TRANSIENT_FAILURE_BUDGET = 20


# Each transition says what it is through the same attributes (ended_as, noun,
# failure, carries_progress, log_fields), so its kind is told once, by its class,
# and nowhere again by a chain of isinstance tests.


class _Ending:
    """What every transition says of itself; a failure's closing log line adds its kind and code."""

    #: How the attempt ended, in its closing log line.
    ended_as: ClassVar[str]

    def log_fields(self) -> dict[str, Any]:
        return {"outcome": self.ended_as}


@dataclass(frozen=True)
class LeaseLost(_Ending):
    """The attempt lost its lease: nothing is written, the reaper recovers the job."""

    code: str
    message: str
    ended_as: ClassVar[str] = "lease_lost"
    failure: ClassVar[None] = None

    def log_fields(self) -> dict[str, Any]:
        return {"outcome": self.ended_as, "failure_code": self.code}


@dataclass(frozen=True)
class Canceled(_Ending):
    """An operator canceled the job while it ran: the cancel wrote its end, so the attempt writes nothing.

    Not a lost lease: nobody needs to recover the job, and nothing went wrong.
    """

    #: The operator's reason, as the job row keeps it (``CANCELED`` when none was given).
    reason: str
    ended_as: ClassVar[str] = "canceled"
    failure: ClassVar[None] = None


@dataclass(frozen=True)
class Succeed(_Ending):
    completion: JobCompletion
    ended_as: ClassVar[str] = "succeeded"
    #: What its write is called in a log line about it.
    noun: ClassVar[str] = "success"
    failure: ClassVar[None] = None
    #: It writes the handler's progress, which the store may refuse (a terminal failure replaces it then).
    carries_progress: ClassVar[bool] = True


@dataclass(frozen=True)
class Retry(_Ending):
    failure: JobFailure
    delay_ms: int
    #: The exception behind the failure, written with the attempt row.
    evidence: FailureEvidence = field(default=NO_EVIDENCE, compare=False)
    ended_as: ClassVar[str] = "retry_scheduled"
    noun: ClassVar[str] = "failure"
    carries_progress: ClassVar[bool] = False

    def log_fields(self) -> dict[str, Any]:
        return _failure_fields(self.ended_as, self.failure)


@dataclass(frozen=True)
class Continue(_Ending):
    """The run ends and the job runs again after ``delay_ms`` as its next run (spec T14), spending no attempt."""

    delay_ms: int
    #: The new checkpoint, or None to keep the stored one (a snooze).
    checkpoint: Any = None
    progress_done: Optional[int] = None
    progress_total: Optional[int] = None
    ended_as: ClassVar[str] = "continued"
    noun: ClassVar[str] = "continuation"
    failure: ClassVar[None] = None
    carries_progress: ClassVar[bool] = True


@dataclass(frozen=True)
class DeadLetter(_Ending):
    failure: JobFailure
    info: JobDeadLetterInfo
    evidence: FailureEvidence = field(default=NO_EVIDENCE, compare=False)
    #: The job type's setting that dead-lettered the handler's exception at once, if one did
    #: (recorded with the failure's events, for the operator's view).
    stopped_by: Optional[Verdict] = None
    ended_as: ClassVar[str] = "dead_lettered"
    noun: ClassVar[str] = "failure"
    carries_progress: ClassVar[bool] = False

    def log_fields(self) -> dict[str, Any]:
        return _failure_fields(self.ended_as, self.failure)


def _failure_fields(ended_as: str, failure: JobFailure) -> dict[str, Any]:
    return {"outcome": ended_as, "failure_kind": failure.kind.value, "failure_code": failure.code}


Outcome = Union[JobCompletion, JobFailure, LeaseLost, Canceled]
Transition = Union[Succeed, Continue, Retry, DeadLetter, LeaseLost, Canceled]
#: The transitions that write an outcome (the others leave the job to whoever took it).
Written = Union[Succeed, Continue, Retry, DeadLetter]

#: A handler still running when the worker's shutdown grace ran out: nothing is
#: written for it, and the reaper recovers the job once its lease runs out.
LEFT_BEHIND = LeaseLost(WORKER_SHUTDOWN_CODE, "The worker shut down before the handler finished.")
MAINTENANCE_LOST = LeaseLost(LEASE_MAINTENANCE_FAILED_CODE, "Job lease could not be durably maintained during processing.")


def timeout_failure() -> JobFailure:
    return JobFailure.timeout(TIMEOUT_EXCEEDED_CODE, "Job exceeded the configured timeout.")


def lease_expired_failure() -> JobFailure:
    return JobFailure.lease_expired(LEASE_EXPIRED_CODE, LEASE_EXPIRED_MESSAGE)


def worker_shutdown_failure() -> JobFailure:
    return JobFailure.retryable(WORKER_SHUTDOWN_CODE, "The worker shut down before the handler finished; the job runs again.")


@dataclass(frozen=True)
class EarlierAttempts:
    """What the run's attempts before the one being judged mean for its failure."""

    #: Transient failures within their budget: they spent none of ``max_attempts``.
    free: int = 0
    #: How many of the latest earlier attempts in a row ended on a transient error.
    transient_streak: int = 0

    @classmethod
    def of(cls, error_codes: Iterable[Optional[str]]) -> "EarlierAttempts":
        """Count the run's earlier attempts from their error codes, oldest first."""
        free = streak = 0
        for code in error_codes:
            streak = streak + 1 if code in FREE_FAILURE_CODES else 0
            if 0 < streak <= TRANSIENT_FAILURE_BUDGET:
                free += 1
        return cls(free, streak)

    def spends_attempt(self, failure: JobFailure) -> bool:
        """False for a transient failure still within its budget; True for any other failure."""
        transient = failure.kind is JobFailureKind.RETRYABLE and failure.code in FREE_FAILURE_CODES
        return not transient or self.transient_streak >= TRANSIENT_FAILURE_BUDGET

    def attempts_spent(self, failure: JobFailure, attempt: int) -> int:
        """The run's attempts that count against ``max_attempts`` once ``failure`` ends claim number ``attempt``."""
        spent = attempt - self.free
        return spent if self.spends_attempt(failure) else spent - 1


def dead_letter_reason(
    failure: JobFailure, attempt: int, max_attempts: int, earlier: EarlierAttempts,
) -> Optional[JobDeadLetterReason]:
    """Why ``failure`` of claim number ``attempt`` ends the job, or None when it is retried.

    A non-retryable kind (TERMINAL, PANICKED) always ends it; a retryable one
    does when it spends the last allowed attempt. A transient failure within
    its budget spends none, so it never does.
    """
    if not failure.kind.is_retryable:
        return JobDeadLetterReason.FAILURE_KIND_NON_RETRYABLE
    if earlier.spends_attempt(failure) and earlier.attempts_spent(failure, attempt) >= max_attempts:
        return JobDeadLetterReason.ATTEMPTS_EXHAUSTED
    return None


def decide_failure(
    job: JobRecord, failure: JobFailure, earlier: EarlierAttempts, *, retry_delay_override: Optional[int] = None,
    evidence: FailureEvidence = NO_EVIDENCE, stopped_by: Optional[Verdict] = None,
) -> Retry | DeadLetter:
    """The transition ``failure`` makes for the claimed ``job``, given its run's earlier attempts.

    Args:
        retry_delay_override: the registry's delay for this (job type, failure
            code), in ms; used instead of the backoff for a retried failure.
        evidence: the exception behind the failure, carried to its write (and
            to the dead-letter hook's info).
        stopped_by: the job type's setting that made the handler's exception a
            panic (``dead_letter_on``, or a narrowed ``retry_on``), if one did.
    """
    reason = dead_letter_reason(failure, job.attempt, job.max_attempts, earlier)
    if reason is not None:
        because = not_retried_because(
            reason, failure.kind, failure.code, attempts_spent=earlier.attempts_spent(failure, job.attempt),
            max_attempts=job.max_attempts, stopped_by=stopped_by, error_type=evidence.error_type,
        )
        info = JobDeadLetterInfo(failure=failure, reason=reason, max_attempts=job.max_attempts,
                                 exception=evidence.exception, not_retried_because=because)
        return DeadLetter(failure, info, evidence, stopped_by)
    return Retry(failure, _at_least_the_hint(failure, _policy_delay_ms(job, failure, earlier, retry_delay_override)),
                 evidence)


def _policy_delay_ms(
    job: JobRecord, failure: JobFailure, earlier: EarlierAttempts, retry_delay_override: Optional[int],
) -> int:
    if retry_delay_override is not None:
        return retry_delay_override
    if not earlier.spends_attempt(failure):
        return backoff.compute_transient_retry_delay_ms(earlier.transient_streak + 1, job.id)
    # The backoff of the attempts spent, not of the claims: transient retries do not lengthen it.
    return backoff.compute_retry_delay_ms(earlier.attempts_spent(failure, job.attempt), job.id)


def _at_least_the_hint(failure: JobFailure, policy_ms: int) -> int:
    """The handler's ``retry_after`` is a lower bound on the policy's delay (spec section 2)."""
    hint = None if failure.retry_after is None else delay_ms(failure.retry_after)
    return policy_ms if hint is None else max(policy_ms, hint)


def decide_continuation(
    job: JobRecord, completion: JobCompletion, *, max_continuations: int, step_allows: bool = True,
) -> Continue | DeadLetter:
    """The transition a continuation makes for the claimed ``job``: run again later, or end here.

    ``completion`` asks for a continuation whose delay and (absent) output were
    checked when the handler returned. It is refused, as a TERMINAL failure,
    when the job has continued ``max_continuations`` times already, or when the
    job runs a workflow step that did not opt in (``step_allows`` False).
    """
    if not step_allows:
        failure = JobFailure.terminal(WORKFLOW_CONTINUATION_NOT_ENABLED_CODE,
                                      "The job's workflow step was not built with continuation=True.")
    elif job.continuations >= max_continuations:
        failure = JobFailure.terminal(CONTINUATION_LIMIT_CODE,
                                      f"The job has continued {job.continuations} times, its limit "
                                      f"(max_continuations {max_continuations}).")
    else:
        return Continue(delay_ms(completion.continue_after) or 0, completion.checkpoint,
                        completion.progress_done, completion.progress_total)
    info = JobDeadLetterInfo(failure=failure, reason=JobDeadLetterReason.FAILURE_KIND_NON_RETRYABLE,
                             max_attempts=job.max_attempts)
    return DeadLetter(failure, info)
