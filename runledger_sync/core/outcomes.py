"""How an attempt ends, decided as a value before anything is written (spec sections 5, 6 and 12).

A handler's result (a completion, a failure) or the watch's verdict (the lease
was lost) becomes one :data:`Transition`: succeed, retry after a delay,
dead-letter for a reason, or write nothing. :func:`decide` is the one place the
retry delay and the dead-letter rule are applied; the store writes what it is
given, and the reaper asks :func:`dead_letter_reason` the same question.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from runledger_sync.core import backoff
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
HANDLER_ERROR_CODE = "job.handler_error"
HANDLER_TRANSIENT_ERROR_CODE = "job.handler_transient_error"
HANDLER_NOT_REGISTERED_CODE = "job.handler_not_registered"
HANDLER_INVALID_RESULT_CODE = "job.handler_invalid_result"
INVALID_COMPLETION_PROGRESS_CODE = "job.invalid_completion_progress"
TIMEOUT_EXCEEDED_CODE = "job.timeout_exceeded"
LEASE_OWNER_MISMATCH_CODE = "job.lease_owner_mismatch"
LEASE_MAINTENANCE_FAILED_CODE = "job.lease_maintenance_failed"
LEASE_EXPIRED_CODE = "job.lease_expired"
LEASE_EXPIRED_MESSAGE = "Job lease expired before completion."


@dataclass(frozen=True)
class LeaseLost:
    """The attempt lost its lease: nothing is written, the reaper recovers the job."""

    code: str
    message: str


@dataclass(frozen=True)
class Succeed:
    completion: JobCompletion


@dataclass(frozen=True)
class Retry:
    failure: JobFailure
    delay_ms: int


@dataclass(frozen=True)
class DeadLetter:
    failure: JobFailure
    info: JobDeadLetterInfo


Outcome = Union[JobCompletion, JobFailure, LeaseLost]
Transition = Union[Succeed, Retry, DeadLetter, LeaseLost]

MAINTENANCE_LOST = LeaseLost(LEASE_MAINTENANCE_FAILED_CODE, "Job lease could not be durably maintained during processing.")


def timeout_failure() -> JobFailure:
    return JobFailure.timeout(TIMEOUT_EXCEEDED_CODE, "Job exceeded the configured timeout.")


def lease_expired_failure() -> JobFailure:
    return JobFailure.lease_expired(LEASE_EXPIRED_CODE, LEASE_EXPIRED_MESSAGE)


def dead_letter_reason(kind: JobFailureKind, attempt: int, max_attempts: int) -> Optional[JobDeadLetterReason]:
    """Why a failed attempt ends the job, or None when it is retried.

    A non-retryable kind (TERMINAL, PANICKED) always ends it; a retryable one
    does when this attempt was the last allowed (attempt >= max_attempts).
    """
    if not kind.is_retryable:
        return JobDeadLetterReason.FAILURE_KIND_NON_RETRYABLE
    if attempt >= max_attempts:
        return JobDeadLetterReason.ATTEMPTS_EXHAUSTED
    return None


def decide(job: JobRecord, outcome: Outcome, *, retry_delay_override: Optional[int] = None) -> Transition:
    """The transition ``outcome`` makes for the claimed ``job``.

    Args:
        retry_delay_override: the registry's delay for this (job type, failure
            code), in ms; used instead of the backoff for a retried failure.
    """
    if isinstance(outcome, (LeaseLost, JobCompletion)):
        return outcome if isinstance(outcome, LeaseLost) else Succeed(outcome)
    reason = dead_letter_reason(outcome.kind, job.attempt, job.max_attempts)
    if reason is not None:
        return DeadLetter(outcome, JobDeadLetterInfo(failure=outcome, reason=reason, max_attempts=job.max_attempts))
    delay = retry_delay_override if retry_delay_override is not None else backoff.compute_retry_delay_ms(
        job.attempt, job.id)
    return Retry(outcome, delay)
