"""How a job's current run used its retries, told from its stored rows (the operator's view).

The command line's ``jobs show`` and the dashboard's job page say it in the
same words: the attempts spent of ``max_attempts``, the free retries after a
lost database connection or a worker shutdown, and why a dead-lettered job was
not retried (:func:`~runledger_sync.core.exception_rules.not_retried_because`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

from runledger_sync.core.exception_rules import STOPPED_BY_EVENT_KEY, Verdict, not_retried_because
from runledger_sync.core.outcomes import HANDLER_PANIC_CODE, EarlierAttempts
from runledger_sync.core.states import JobStatus
from runledger_sync.core.types import JobDeadLetterReason, JobFailureKind


@dataclass(frozen=True)
class RetrySummary:
    """How a job's current run has used its retries (see :func:`retry_summary`)."""

    attempts_spent: int
    max_attempts: int
    #: Failed attempts that spent none of ``max_attempts``: a lost queue-database connection, a worker shutdown.
    free_retries: int
    #: Why a dead-lettered job was not retried; None for any other status.
    not_retried_because: Optional[str]

    def __str__(self) -> str:
        free = f"{self.free_retries} free {'retry' if self.free_retries == 1 else 'retries'} (lost connection or shutdown)"
        if self.not_retried_because is not None:
            return f"not retried: {self.not_retried_because}; {free}"
        return f"{self.attempts_spent} of {self.max_attempts} attempts spent; {free}"


def retry_summary(job: Any, attempts: Iterable[Any], events: Iterable[Any] = ()) -> RetrySummary:
    """Say how the job's current run used its attempts, and why it was not retried if it was dead-lettered.

    Args:
        job: The job (:func:`runledger_sync.get_job`).
        attempts: Its attempts (:func:`runledger_sync.list_attempts`); those of earlier runs are ignored.
        events: Its events (:func:`runledger_sync.list_events`), where the failure's write
            recorded which setting stopped a handler's exception.

    Returns:
        A :class:`RetrySummary`; ``str()`` of it reads, for example,
        ``not retried: attempts exhausted (5 of 5); 0 free retries (lost connection or shutdown)``.

    Example:
        ``str(rl.retry_summary(job, rl.list_attempts(engine, job.id), rl.list_events(engine, job.id)))``
    """
    run = sorted((a for a in attempts if a.run_number == job.run_number and a.finished_at is not None),
                 key=lambda a: a.attempt)
    # The same count the dead-letter rule makes (core.outcomes): claims, less the free failures.
    free = EarlierAttempts.of(a.error_code for a in run).free
    spent = max(0, job.attempt - free)
    kind = _kind(job.status_reason)
    if job.status is not JobStatus.DEAD_LETTERED or kind is None:
        return RetrySummary(spent, job.max_attempts, free, None)
    reason = JobDeadLetterReason.ATTEMPTS_EXHAUSTED if kind.is_retryable else JobDeadLetterReason.FAILURE_KIND_NON_RETRYABLE
    stopped_by = _stopped_by(job, events) if job.last_error_code == HANDLER_PANIC_CODE else None
    because = not_retried_because(reason, kind, job.last_error_code, attempts_spent=spent,
                                  max_attempts=job.max_attempts, stopped_by=stopped_by,
                                  error_type=run[-1].error_type if run else None)
    return RetrySummary(spent, job.max_attempts, free, because)


def _kind(status_reason: Optional[str]) -> Optional[JobFailureKind]:
    # After a failure the status reason is its kind (spec section 12); a cancel or a requeue leaves another word.
    try:
        return JobFailureKind(status_reason)
    except ValueError:
        return None


def _stopped_by(job: Any, events: Iterable[Any]) -> Optional[Verdict]:
    """The setting that stopped the run's last exception, as its failure event recorded it."""
    for event in reversed(list(events)):
        stopped = event.payload.get(STOPPED_BY_EVENT_KEY) if isinstance(event.payload, dict) else None
        if event.run_number == job.run_number and stopped is not None:
            try:
                return Verdict(stopped)
            except ValueError:
                return None
    return None
