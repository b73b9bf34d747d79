"""Lifecycle writes for many leases at once: mark running; and the reads an outcome write needs.

The worker's hot path writes stage ``running`` for every job; one transaction
per job makes each cost a round trip and a commit. These functions write a
whole group of leases in one transaction, behind the same lease fence as the
single writes (:mod:`runledger_sync.store._fence`). The decided outcomes are
written by :func:`runledger_sync.store._outcomes.apply_transitions`, through
:func:`write_leases`; the read-backs of a lost reply are here.

Each lease gets its own answer: None once written, or ``LeaseOwnerMismatch``
when its fence refused it; a refused lease never stops the others from landing.
The statements return only each written lease, not its row: the worker needs
no more, and reading back and decoding whole rows (payloads included) cost
about as much as the rest of the write's client time.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence
from uuid import UUID

from sqlalchemy import and_, select
from sqlalchemy.engine import Connection

from runledger_sync.core.errors import LeaseOwnerMismatch
from runledger_sync.core.outcomes import Continue, DeadLetter, EarlierAttempts, Retry, Succeed
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.types import DEFAULT_EVENT_LOG, EventLog
from runledger_sync.core.states import JobStatus
from runledger_sync.core.workflow_errors import WorkflowReleaseConflict
from runledger_sync.db.schema import job_attempts, job_queue
from runledger_sync.store._binds import Bind
from runledger_sync.store._errors import run_in_transaction
from runledger_sync.store._fence import (
    by_listed_ids,
    lease_mismatch,
    leases_columns,
    live_lease,
    unnested,
    write_fenced,
)
from runledger_sync.store._prepared import PreparedStatement
from runledger_sync.store._sql import check_identity, event_log_params
from runledger_sync.store._transitions import (
    build_running,
    earlier_attempts,
)
from runledger_sync.store._workflow_steps import job_ends, jobs_ended

_q = job_queue.c
_a = job_attempts.c

#: Per-lease result: None once written, or why it was not: its fence refused it, or
#: (a workflow's job) its run is being cancelled.
LeaseResult = Optional[LeaseOwnerMismatch | WorkflowReleaseConflict]

#: What a group write returns per written lease, and what its attempt and event rows need.
_WRITTEN = (_q.id, _q.run_number, _q.attempt, _q.stage, _q.progress_done, _q.progress_total, _q.workflow_step_id)


def _live_leases(leases: Any) -> Any:
    """Rows of these lease identities, still LEASED, whose lease is live now."""
    return and_(live_lease(*leases_columns(leases)), by_listed_ids())


_RUNNING = PreparedStatement("mark_running", build_running(_live_leases(unnested()), returning=_WRITTEN))


def mark_jobs_running(
    bind: Bind, identities: Sequence[LeaseIdentity], *, event_log: EventLog | str = DEFAULT_EVENT_LOG
) -> list[LeaseResult]:
    """Persist stage ``running`` for many claimed jobs in one transaction.

    Same effect per job as :func:`runledger_sync.store._running.mark_job_running`.

    Args:
        event_log: ``full`` writes a STAGE_CHANGED event per job; ``transitions``
            does not (the worker passes ``JobsConfig.event_log``).

    Returns:
        One result per identity, in order: None once written, or a ``LeaseOwnerMismatch``.

    Raises:
        InvalidArgument: ``event_log`` is not a level of :class:`EventLog`.
        CommitOutcomeUnknown: the connection was lost while the write ran; it may have landed.
    """
    flag = event_log_params(event_log)
    checked = [check_identity(*_identity_values(identity)) for identity in identities]
    if not checked:
        return []
    return run_in_transaction(bind, lambda connection: write_leases(connection, _RUNNING, checked, flag),
                              one_query=True)


def read_earlier_attempts(bind: Bind, identity: LeaseIdentity) -> EarlierAttempts:
    """The run's attempts before ``identity``'s, as the dead-letter rule counts them (a lost connection is raised)."""
    return run_in_transaction(bind, lambda connection: earlier_attempts(
        connection, identity.job_id, identity.run_number, identity.attempt), one_repeatable_write=True, retry=False)


def read_back_outcomes(
    bind: Bind, outcomes: Sequence[tuple[LeaseIdentity, Succeed | Continue | Retry | DeadLetter]],
) -> list[Optional[bool | LeaseOwnerMismatch]]:
    """What the rows say of outcome writes whose reply was lost, in one read (a lost connection is raised, not retried).

    Returns:
        Per outcome, in order: True when its row shows the write landed; None
        while the job is still leased under the identity (the write is still to
        be made); a ``LeaseOwnerMismatch`` when the attempt ended otherwise
        meanwhile (a cancel, the reaper), so the write never lands.
    """
    ids = [identity.job_id for identity, _ in outcomes]
    rows = {row.id: row for row in run_in_transaction(bind, lambda connection: connection.execute(
        _READ_BACK, {"lease_job_ids": ids}).all(), one_repeatable_write=True, retry=False)}
    return [_what_the_row_says(rows.get(identity.job_id), identity, transition) for identity, transition in outcomes]


_READ_BACK = select(_q.id, _q.run_number, _q.attempt, _q.status, _q.last_error_code).where(by_listed_ids())


def _what_the_row_says(
    row: Any, identity: LeaseIdentity, transition: Succeed | Continue | Retry | DeadLetter,
) -> Optional[bool | LeaseOwnerMismatch]:
    if isinstance(transition, Continue) and row is not None and row.run_number > identity.run_number:
        # Only a continuation moves a leased job to its next run (a requeue takes a finished one).
        return True
    if row is not None and (row.run_number, row.attempt) == (identity.run_number, identity.attempt):
        if row.status == JobStatus.LEASED.value:
            return None
        if isinstance(transition, Succeed):
            if row.status == JobStatus.SUCCEEDED.value:
                return True
        # The reaper retries or dead-letters with its own code: a row with this failure's code is this write's.
        elif (isinstance(transition, (Retry, DeadLetter))
              and row.status in (JobStatus.PENDING.value, JobStatus.DEAD_LETTERED.value)
              and row.last_error_code == transition.failure.code):
            return True
    return lease_mismatch(identity)


def _identity_values(identity: LeaseIdentity) -> tuple[UUID, int, int, str]:
    return identity.job_id, identity.run_number, identity.attempt, identity.worker_id


def write_leases(
    connection: Connection, statement: PreparedStatement, identities: list[LeaseIdentity],
    values: dict[str, Any], *, end_steps: bool = False,
) -> list[LeaseResult]:
    """Lock the identities' rows, run ``statement``; answer each identity (``end_steps``: then end its workflow step)."""
    rows = write_fenced(connection, (statement,), identities, values).all()
    if end_steps:
        jobs_ended(connection, job_ends(rows))
    written = {(row.id, row.run_number, row.attempt) for row in rows}
    return [
        None if (identity.job_id, identity.run_number, identity.attempt) in written else lease_mismatch(identity)
        for identity in identities
    ]
