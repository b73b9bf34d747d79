"""Apply a decided transition to one leased job, so that it lands even across a database restart.

The one write path for an attempt's outcome, with one retry policy: a lost
connection is retried until ``budget_seconds`` run out; a commit whose outcome
is unknown is checked by reading the row back, never blindly repeated (the
fence would refuse the repeat, and a landed success would look like a lost lease).
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from runledger_sync.core import validation as check
from runledger_sync.core.errors import CommitOutcomeUnknown, ConnectionFailed, RunledgerError
from runledger_sync.core.outcomes import DeadLetter, Retry, Succeed
from runledger_sync.core.records import JobRecord, LeaseIdentity
from runledger_sync.core.types import JobStage, JobStatus
from runledger_sync.store import admin, lifecycle
from runledger_sync.store._binds import Bind

#: The pause between tries of a write whose connection was lost.
RETRY_PAUSE_SECONDS = 0.2


def apply_transition(
    bind: Bind, identity: LeaseIdentity, transition: Succeed | Retry | DeadLetter, *, budget_seconds: float,
    max_output_bytes: int = check.DEFAULT_MAX_OUTPUT_BYTES,
) -> JobRecord:
    """Write ``transition`` under ``identity``'s lease; return the row as it landed.

    Raises:
        LeaseOwnerMismatch: the lease is gone (the fence refused the write).
        InvalidCompletionProgress: a success's progress is invalid merged with the stored one.
        OutputTooLarge: a success's output is larger than ``max_output_bytes``.
        ConnectionFailed: the database stayed out of reach for ``budget_seconds``.
    """
    if isinstance(transition, Succeed):
        return land(bind, identity, lambda: lifecycle.complete_job_success(
            bind, **identity.keywords(), completion=transition.completion, max_output_bytes=max_output_bytes),
            budget_seconds=budget_seconds)
    delay = transition.delay_ms if isinstance(transition, Retry) else None
    return land(bind, identity, lambda: lifecycle.complete_job_failure(
        bind, **identity.keywords(), failure=transition.failure, retry_delay_ms=delay), budget_seconds=budget_seconds)


def land(bind: Bind, identity: LeaseIdentity, write: Callable[[], JobRecord], *, budget_seconds: float) -> JobRecord:
    """Run ``write`` until it lands or ``budget_seconds`` pass (see the module docstring)."""
    give_up = time.monotonic() + budget_seconds
    while True:
        try:
            return write()
        except CommitOutcomeUnknown:
            landed = landed_outcome(bind, identity)
            if landed is not None:
                return landed
        except ConnectionFailed:
            if time.monotonic() >= give_up:
                raise
        if time.monotonic() >= give_up:
            raise ConnectionFailed("the outcome could not be written before the retry budget ran out")
        time.sleep(RETRY_PAUSE_SECONDS)


def landed_outcome(bind: Bind, identity: LeaseIdentity) -> Optional[JobRecord]:
    """The row if this attempt's outcome has been written (it is no longer LEASED), else None."""
    current = _this_attempt(bind, identity)
    return current if current is not None and current.status is not JobStatus.LEASED else None


def running_landed(bind: Bind, identity: LeaseIdentity) -> bool:
    """True if this attempt's running write landed: the job is still leased under ``identity``, at stage running."""
    current = _this_attempt(bind, identity)
    return (current is not None and current.status is JobStatus.LEASED and current.stage is JobStage.RUNNING
            and current.worker_id == identity.worker_id)


def _this_attempt(bind: Bind, identity: LeaseIdentity) -> Optional[JobRecord]:
    """The job's row while it is still at ``identity``'s run and attempt; None otherwise, or when unreadable."""
    try:
        current = admin.get_job(bind, identity.job_id)
    except RunledgerError:
        return None
    if current is None or (current.run_number, current.attempt) != (identity.run_number, identity.attempt):
        return None
    return current
