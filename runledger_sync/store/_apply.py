"""Apply an attempt's outcome to its leased job, so that it lands even across a database restart.

The one write path for an attempt's outcome, with one retry policy: a lost
connection is retried until ``budget_seconds`` run out. A write whose reply was
lost may have landed, so before anything is written again the row is read back
(retried like the write): found landed, the write is answered as landed
(:attr:`Landed.reply_lost`), never repeated, since the fence would refuse the
repeat and a landed success would look like a lost lease.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

from runledger_sync.core import validation as check
from runledger_sync.core.errors import RunledgerError
from runledger_sync.core.outcomes import DeadLetter, EarlierAttempts, Retry, decide_failure
from runledger_sync.core.records import JobRecord, LeaseIdentity
from runledger_sync.core.store_errors import CommitOutcomeUnknown, ConnectionFailed
from runledger_sync.core.types import JobCompletion, JobFailure, JobStage, JobStatus
from runledger_sync.store import admin, lifecycle
from runledger_sync.store._binds import Bind
from runledger_sync.store._errors import run_in_transaction
from runledger_sync.store._fence import lease_mismatch
from runledger_sync.store._transitions import earlier_attempts

#: The pause between tries of a write whose connection was lost.
RETRY_PAUSE_SECONDS = 0.2

_FAILED = (JobStatus.PENDING, JobStatus.DEAD_LETTERED)


@dataclass(frozen=True)
class Landed:
    """An outcome write that landed."""

    #: The job's row as the write left it.
    record: JobRecord
    #: True when the write's reply was lost and the row, read back, showed it had landed.
    reply_lost: bool = False


def apply_success(
    bind: Bind, identity: LeaseIdentity, completion: Optional[JobCompletion], *, budget_seconds: float,
    maybe_landed: bool = False, max_output_bytes: int = check.DEFAULT_MAX_OUTPUT_BYTES,
) -> Landed:
    """Write the attempt's success under ``identity``'s lease.

    Args:
        maybe_landed: an earlier write of this success (a group's whose reply was
            lost) may have landed: the row is read back before anything is written.

    Raises:
        LeaseOwnerMismatch: the lease is gone (the fence refused the write).
        InvalidCompletionProgress: the progress is invalid merged with the stored one.
        OutputTooLarge: the output is larger than ``max_output_bytes``.
        ConnectionFailed: the database stayed out of reach for ``budget_seconds``;
            nothing landed.
        CommitOutcomeUnknown: the database stayed out of reach after a write whose
            reply was lost: it may have landed.
    """
    return _land(
        bind, identity,
        lambda: lifecycle.complete_job_success(bind, **identity.keywords(), completion=completion,
                                               max_output_bytes=max_output_bytes),
        landed_here=lambda row: row.status is JobStatus.SUCCEEDED,
        budget_seconds=budget_seconds, maybe_landed=maybe_landed,
    )


def apply_failure(
    bind: Bind, job: JobRecord, identity: LeaseIdentity, failure: JobFailure, *,
    retry_delay_override: Optional[int], budget_seconds: float,
) -> tuple[Retry | DeadLetter, Landed]:
    """Decide what ``failure`` does to the claimed ``job`` and write it under ``identity``'s lease.

    The decision (:func:`~runledger_sync.core.outcomes.decide_failure`) needs the
    run's earlier attempts when the failure is retryable: a transient failure
    within its budget spends no attempt and retries on its own schedule. They
    are read in the same retry loop as the write, since a database restart is
    just when such failures come.

    Returns:
        The transition written, and how it landed.

    Raises:
        As :func:`apply_success`.
    """
    decided: list[Retry | DeadLetter] = []

    def write() -> JobRecord:
        earlier = EarlierAttempts()
        if failure.kind.is_retryable:
            earlier = run_in_transaction(bind, lambda connection: earlier_attempts(
                connection, identity.job_id, identity.run_number, identity.attempt))
        transition = decide_failure(job, failure, earlier, retry_delay_override=retry_delay_override)
        decided.append(transition)
        delay = transition.delay_ms if isinstance(transition, Retry) else None
        return lifecycle.complete_job_failure(bind, **identity.keywords(), failure=failure, retry_delay_ms=delay)

    landed = _land(
        bind, identity, write,
        # The reaper retries or dead-letters with its own code: a row with this failure's code is this write's.
        landed_here=lambda row: row.status in _FAILED and row.last_error_code == failure.code,
        budget_seconds=budget_seconds,
    )
    return decided[-1], landed


def _land(
    bind: Bind, identity: LeaseIdentity, write: Callable[[], JobRecord], *,
    landed_here: Callable[[JobRecord], bool], budget_seconds: float, maybe_landed: bool = False,
) -> Landed:
    """Run ``write`` until it lands or ``budget_seconds`` pass (see the module docstring).

    ``landed_here`` tells, of a row that left this attempt's lease, whether this
    write left it so (rather than a cancel or the reaper).
    """
    give_up = time.monotonic() + budget_seconds
    while True:
        try:
            if maybe_landed:
                current = _this_attempt(bind, identity)
                if current is not None and current.status is not JobStatus.LEASED:
                    if landed_here(current):
                        return Landed(current, reply_lost=True)
                    # The attempt ended otherwise meanwhile: this write did not land, and never will.
                    raise lease_mismatch(identity)
                maybe_landed = False
            return Landed(write())
        except CommitOutcomeUnknown:
            maybe_landed = True
        except ConnectionFailed:
            pass
        if time.monotonic() >= give_up:
            if maybe_landed:
                raise CommitOutcomeUnknown(
                    "the database stayed out of reach after an outcome write whose reply was lost; it may have landed")
            raise ConnectionFailed("the outcome could not be written before the retry budget ran out")
        time.sleep(RETRY_PAUSE_SECONDS)


def running_landed(bind: Bind, identity: LeaseIdentity) -> bool:
    """True if this attempt's running write landed: the job is still leased under ``identity``, at stage running.

    False as well when the row cannot be read.
    """
    try:
        current = _this_attempt(bind, identity)
    except RunledgerError:
        return False
    return (current is not None and current.status is JobStatus.LEASED and current.stage is JobStage.RUNNING
            and current.worker_id == identity.worker_id)


def read_back(bind: Bind, identity: LeaseIdentity, *, budget_seconds: float) -> Optional[JobRecord]:
    """The job's row while it is still at ``identity``'s run and attempt, else None; a lost connection is retried.

    Raises:
        ConnectionFailed: the row could not be read within ``budget_seconds``.
    """
    give_up = time.monotonic() + budget_seconds
    while True:
        try:
            return _this_attempt(bind, identity)
        except ConnectionFailed:
            if time.monotonic() >= give_up:
                raise
        time.sleep(RETRY_PAUSE_SECONDS)


def _this_attempt(bind: Bind, identity: LeaseIdentity) -> Optional[JobRecord]:
    """The job's row while it is still at ``identity``'s run and attempt; None otherwise."""
    current = admin.get_job(bind, identity.job_id)
    if current is None or (current.run_number, current.attempt) != (identity.run_number, identity.attempt):
        return None
    return current
