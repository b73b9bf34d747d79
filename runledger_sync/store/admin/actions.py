"""Operator actions on one job: cancel it, or requeue a finished one (spec section 4, Cancel and Requeue).

Both take an optional ``organization_id`` scope, as every admin call does.

Beside them, :func:`make_jobs_due` brings waiting jobs forward to now, for a
test that works retries and delayed jobs without waiting for them
(:func:`runledger_sync.testing.drain` with ``include_scheduled``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence
from uuid import UUID

from sqlalchemy import Integer, Text, bindparam, func, literal, select
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.errors import (
    CompareAndRequeueUnsupportedIsolation,
    InvalidArgument,
    InvalidStateTransition,
    JobNotFound,
    RequeueExpectationFailed,
    WorkflowRequeueNotSupported,
)
from runledger_sync.core.records import JobRecord
from runledger_sync.core.types import JobEventType
from runledger_sync.core.states import JobStage, JobStatus
from runledger_sync.db.schema import job_attempts, job_events, job_queue
from runledger_sync.store.binds import Bind
from runledger_sync.store.transactions import require_read_committed, run_in_transaction
from runledger_sync.store.notify import notify_canceled, notify_ended
from runledger_sync.store.rows import JOB_COLUMNS, to_job
from runledger_sync.store.scope import check_job_id, scoped
from runledger_sync.store.workflows.steps import job_ends, jobs_ended

_q = job_queue.c
CANCELABLE = (JobStatus.PENDING.value, JobStatus.LEASED.value)
REQUEUABLE = (JobStatus.SUCCEEDED.value, JobStatus.DEAD_LETTERED.value, JobStatus.CANCELED.value)


def _reason_event(changed: Any, event_type: JobEventType, run_number: Any, attempt: Any) -> Any:
    """The event row of an operator's action on the ``changed`` rows, carrying its reason."""
    return job_events.insert().from_select(
        ["job_id", "run_number", "attempt", "event_type", "stage", "payload"],
        select(
            changed.c.id,
            run_number,
            func.nullif(attempt, 0),
            literal(event_type.value),
            changed.c.stage,
            func.jsonb_build_object("reason", changed.c.status_reason),
        ),
    ).cte(f"{event_type.value.lower()}_event")


def _build_cancel(picked: Any = None) -> Any:
    reason = bindparam("reason", type_=Text)
    target = _q.id == bindparam("target_id") if picked is None else _q.id == picked.subquery("picked").c.id
    canceled = (
        job_queue.update()
        .where(target, _q.status.in_(CANCELABLE))
        # lease_expires_at is kept on purpose: a requeue must not let a new attempt
        # overlap the fenced handler that may still be running.
        .values(
            status=JobStatus.CANCELED.value,
            last_heartbeat_at=None,
            worker_id=None,
            finished_at=func.now(),
            status_reason=func.coalesce(reason, "CANCELED"),
        )
        .returning(*JOB_COLUMNS)
    )
    return canceled


def cancel_statement(organization_id: Optional[str] = None, picked: Any = None) -> Any:
    """The cancel of one job (the bound ``target_id``), or of the jobs ``picked`` selects (their ids, locked).

    It closes each job's open attempt, writes its CANCELED event and notifies the
    workers; the statement takes the bound ``reason`` (None: ``CANCELED``) and
    returns the canceled jobs, whose workflow steps :func:`written_jobs` then ends.
    """
    canceled = scoped(_build_cancel(picked), organization_id).cte("canceled")
    closed = (
        job_attempts.update()
        .where(
            job_attempts.c.job_id == canceled.c.id,
            job_attempts.c.run_number == canceled.c.run_number,
            job_attempts.c.attempt == canceled.c.attempt,
            job_attempts.c.finished_at.is_(None),
        )
        .values(finished_at=func.now())
        .cte("closed_attempt")
    )
    event = _reason_event(canceled, JobEventType.CANCELED, canceled.c.run_number, canceled.c.attempt)
    return select(*canceled.c).add_cte(closed, event).where(notify_ended(canceled), notify_canceled(canceled))


def cancel_job(
    bind: Bind,
    job_id: UUID | str,
    *,
    reason: Optional[str] = None,
    organization_id: Optional[str] = None,
) -> JobRecord:
    """Cancel a PENDING or LEASED job.

    The worker running the job is notified when this commits, and sets its
    handler's cancellation flag at once, with ``reason`` as ``ctx.cancel_reason``
    (``CANCELED`` when none is given); without the notification its next
    heartbeat finds the job canceled. Any write the handler attempts is refused.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).

    Raises:
        JobNotFound: no such job in the scope.
        InvalidStateTransition: the job has already finished.
    """
    return _act(bind, job_id, reason, organization_id, cancel_statement(organization_id), "canceled", CANCELABLE)


def transition_error(
    connection: Connection, job_id: UUID, organization_id: Optional[str], verb: str, allowed: tuple[str, ...],
    expected: Optional[Expectation] = None,
) -> Exception:
    """Why an action ``verb`` on the job changed nothing: the error to raise."""
    found = connection.execute(
        scoped(select(_q.status, _q.run_number, _q.workflow_step_id).where(_q.id == job_id), organization_id)).first()
    if found is None:
        return JobNotFound(f"job {job_id} was not found", job_id=str(job_id))
    if verb == "requeued" and found.workflow_step_id is not None:
        return WorkflowRequeueNotSupported(
            f"job {job_id} belongs to a workflow step and cannot be requeued on its own", job_id=str(job_id))
    if expected is not None and expected.missed_by(found.status, found.run_number):
        return RequeueExpectationFailed(
            f"job {job_id} is {found.status} in run {found.run_number}, not "
            f"{expected.status or 'any status'} in run {expected.run_number or 'any'} as expected; nothing was requeued",
            job_id=str(job_id), status=found.status, run_number=found.run_number,
            expected_status=expected.status, expected_run_number=expected.run_number,
        )
    return InvalidStateTransition(
        f"job {job_id} is {found.status} and cannot be {verb}; only {', '.join(allowed)} can",
        job_id=str(job_id),
        status=found.status,
    )


#: What a requeue may pick: a finished job outside any workflow (a workflow's job runs
#: once per run: its step's end has released its dependents).
REQUEUE_PICKABLE = (_q.status.in_(REQUEUABLE), _q.workflow_step_id.is_(None))


def pick_to_requeue(organization_id: Optional[str], expected: Optional["Expectation"] = None) -> Any:
    """The job ``target_id`` (bound) locked, if it is finished, outside workflows and what ``expected`` says."""
    picked = select(_q.id, _q.run_number, _q.attempt).where(_q.id == bindparam("target_id"), *REQUEUE_PICKABLE)
    if expected is not None:
        # Under READ COMMITTED a row this waited for is tested again as its locker left
        # it: a requeue that lost the race to another action finds nothing to pick.
        if expected.status is not None:
            picked = picked.where(_q.status == bindparam("expected_status", type_=Text))
        if expected.run_number is not None:
            picked = picked.where(_q.run_number == bindparam("expected_run_number", type_=Integer))
    return scoped(picked, organization_id).with_for_update()


@dataclass(frozen=True)
class Expectation:
    """What a compare-and-requeue expects the job to be: its status, its run, or both."""

    status: Optional[str]
    run_number: Optional[int]

    @classmethod
    def of(cls, status: Any, run_number: Any) -> Optional["Expectation"]:
        if status is None and run_number is None:
            return None
        if status is not None:
            try:
                status = JobStatus(status).value
            except ValueError:
                raise InvalidArgument(
                    "expected_status", status, f"one of {', '.join(s.value for s in JobStatus)}") from None
        if run_number is not None:
            check.check_int("expected_run_number", run_number, (1, 2**31 - 1))
        return cls(status, run_number)

    def missed_by(self, status: str, run_number: int) -> bool:
        return (self.status is not None and status != self.status) or (
            self.run_number is not None and run_number != self.run_number)


def requeue_statement(picked: Any) -> Any:
    """The requeue of the jobs ``picked`` selects (their id, run_number and attempt, locked), with a REQUEUED event each.

    ``picked`` must keep to :data:`REQUEUE_PICKABLE`; the statement takes the bound
    ``reason`` (None: ``REQUEUED``) and returns the requeued jobs.
    """
    previous = picked.subquery("previous")
    requeued = (
        job_queue.update()
        .where(_q.id == previous.c.id)
        .values(
            status=JobStatus.PENDING.value,
            stage=JobStage.QUEUED.value,
            progress_done=None,
            progress_total=None,
            checkpoint=None,
            output=None,
            run_number=_q.run_number + 1,
            attempt=0,
            # A requeue starts afresh (its checkpoint is gone too), with the whole cap on continuations.
            continuations=0,
            lease_expires_at=None,
            last_heartbeat_at=None,
            worker_id=None,
            started_at=None,
            finished_at=None,
            next_run_at=func.now(),
            status_reason=func.coalesce(bindparam("reason", type_=Text), "REQUEUED"),
            last_error_code=None,
            last_error_message=None,
        )
        .returning(*JOB_COLUMNS, previous.c.run_number.label("previous_run"), previous.c.attempt.label("previous_attempt"))
        .cte("requeued")
    )
    event = _reason_event(requeued, JobEventType.REQUEUED, requeued.c.previous_run, requeued.c.previous_attempt)
    return select(*requeued.c).add_cte(event)


def requeue_job(
    bind: Bind,
    job_id: UUID | str,
    reason: Optional[str] = None,
    *,
    organization_id: Optional[str] = None,
    expected_status: Optional[JobStatus | str] = None,
    expected_run_number: Optional[int] = None,
) -> JobRecord:
    """Run a finished job again: a new run (run_number + 1) from attempt 0.

    With ``expected_status`` and/or ``expected_run_number`` it is a compare-and-requeue:
    the job is requeued only if it still is what the caller saw, so an operator
    who looked at a dead letter never re-runs a job that somebody requeued, or
    that ran and ended again, meanwhile. Of two such requeues racing each other,
    exactly one wins.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits;
            with expectations it must be READ COMMITTED).

    Raises:
        JobNotFound: no such job in the scope.
        WorkflowRequeueNotSupported: the job runs a workflow's step.
        RequeueExpectationFailed: the job's status or run is not the one expected.
        InvalidStateTransition: the job is still PENDING or LEASED.
        CompareAndRequeueUnsupportedIsolation: expectations in a transaction not at READ COMMITTED.
    """
    expected = Expectation.of(expected_status, expected_run_number)
    statement = requeue_statement(pick_to_requeue(organization_id, expected))
    return _act(bind, job_id, reason, organization_id, statement, "requeued", REQUEUABLE, expected)


def _act(
    bind: Bind, job_id: Any, reason: Optional[str], organization_id: Optional[str], statement: Any, verb: str,
    allowed: tuple[str, ...], expected: Optional[Expectation] = None,
) -> JobRecord:
    """Run an operator's one-statement action on a job; explain why when it changed nothing."""
    target = check_job_id(job_id)
    if reason is not None:
        check.check_text("reason", reason, max_length=255)
    parameters: dict[str, Any] = {"target_id": target, "reason": reason}
    if expected is not None:
        parameters |= {"expected_status": expected.status, "expected_run_number": expected.run_number}

    def work(connection: Connection) -> JobRecord:
        if expected is not None:
            require_read_committed(connection, CompareAndRequeueUnsupportedIsolation, "a requeue with expectations")
        written = written_jobs(connection, statement, parameters)
        if written:
            return written[0]
        raise transition_error(connection, target, organization_id, verb, allowed, expected)

    return run_in_transaction(bind, work)


def written_jobs(connection: Connection, statement: Any, parameters: dict[str, Any]) -> list[JobRecord]:
    """Run an operator's cancel or requeue statement; end the workflow steps of the jobs it ended (spec: on-terminal).

    Raises:
        WorkflowReleaseConflict: a job's workflow run is being cancelled; roll back.
    """
    records = [to_job(row) for row in connection.execute(statement, parameters)]
    jobs_ended(connection, job_ends(records))
    return records


def make_jobs_due(
    bind: Bind,
    *,
    job_types: Optional[Sequence[str]] = None,
    job_ids: Optional[Sequence[UUID | str]] = None,
) -> list[UUID]:
    """Bring PENDING jobs whose ``next_run_at`` is still ahead forward to now, so a claim takes them.

    With ``job_ids``, those jobs (the ones already due are left alone). Without,
    only the jobs of ``job_types`` (None: any type) that are due first, those
    sharing the earliest ``next_run_at`` ahead: one call moves the clock to the
    next instant anything was waiting for, so retries and delayed jobs come due
    in the order time would have brought them. Nothing else about a job changes.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).

    Returns:
        The ids of the jobs made due; empty when nothing was waiting.
    """
    waiting = [_q.status == JobStatus.PENDING.value, _q.next_run_at > func.now()]
    if job_ids is not None:
        waiting.append(_q.id.in_([check_job_id(job_id) for job_id in job_ids]))
    else:
        if job_types is not None:
            waiting.append(_q.job_type.in_([check.check_job_type(t) for t in job_types]))
        waiting.append(_q.next_run_at == select(func.min(_q.next_run_at)).where(*waiting).scalar_subquery())
    statement = job_queue.update().where(*waiting).values(next_run_at=func.now()).returning(_q.id)
    return run_in_transaction(bind, lambda connection: [row.id for row in connection.execute(statement)])
