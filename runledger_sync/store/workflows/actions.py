"""Acting on a workflow run from outside its jobs: cancel it, answer one of its external steps."""

from __future__ import annotations

from typing import Any, Optional
from uuid import UUID

from sqlalchemy import Text, any_, bindparam, cast, func, literal, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.types import JobEventType
from runledger_sync.core.states import JobStatus
from runledger_sync.core.workflow import (
    STEP_KEY_MAX_LENGTH,
    WorkflowRunRecord,
    WorkflowRunStatus,
    WorkflowStepKind,
    WorkflowStepStatus,
)
from runledger_sync.core.workflow_errors import (
    ExternalStepConflictingCompletion,
    ExternalStepConflictingOutput,
    ExternalStepInvalidTerminalStatus,
    ExternalStepNotExternal,
    ExternalStepNotFound,
    ExternalStepNotWaiting,
    ExternalStepOutputInvalidStatus,
    WorkflowReleaseConflict,
    WorkflowRunFinished,
    WorkflowRunNotFound,
)
from runledger_sync.db.schema import job_events, job_queue
from runledger_sync.db.schema_workflows import workflow_runs, workflow_steps
from runledger_sync.store.binds import Bind
from runledger_sync.store.sealing import opened, sealed
from runledger_sync.store.enqueue.chunk import same_request
from runledger_sync.store.transactions import run_in_transaction
from runledger_sync.store.notify import notify_ended
from runledger_sync.store.workflows.steps import UUIDS, StepEnd, finish_steps, lock_runs_for_release, run_lock_key
from runledger_sync.store.workflows.runs import check_run_id, read_run

#: The stored error code of an external step answered as failed.
EXTERNAL_STEP_FAILED_CODE = "workflow.external_step_failed"

_s = workflow_steps.c
_r = workflow_runs.c
_q = job_queue.c
_RUN_ID = bindparam("target_run_id", type_=PG_UUID(as_uuid=True))
_NOT_STARTED = (WorkflowStepStatus.BLOCKED.value, WorkflowStepStatus.WAITING_FOR_EXTERNAL.value,
                WorkflowStepStatus.ENQUEUED.value)


# -- cancel ----------------------------------------------------------------------

# Waits for every release in flight (they hold it shared) and makes later ones fail fast.
_LOCK_EXCLUSIVE = select(func.pg_advisory_xact_lock(*run_lock_key(_RUN_ID)))
_RUN_FOR_UPDATE = select(_r.status).where(_r.id == _RUN_ID).with_for_update()


def _build_cancel_jobs() -> Any:
    steps_of_run = select(_s.id).where(_s.run_id == _RUN_ID).scalar_subquery()
    canceled = (
        job_queue.update()
        # Only jobs no worker holds: a running one finishes, and its end releases nothing in a cancelled run.
        .where(_q.workflow_step_id == any_(func.array(steps_of_run)), _q.status == JobStatus.PENDING.value)
        .values(status=JobStatus.CANCELED.value, finished_at=func.now(),
                status_reason=func.coalesce(bindparam("cancel_reason", type_=Text), "CANCELED"))
        .returning(_q.id, _q.workflow_step_id, _q.run_number, _q.attempt, _q.stage, _q.status_reason, _q.status)
        .cte("canceled")
    )
    event = job_events.insert().from_select(
        ["job_id", "run_number", "attempt", "event_type", "stage", "payload"],
        select(canceled.c.id, canceled.c.run_number, func.nullif(canceled.c.attempt, 0),
               literal(JobEventType.CANCELED.value), canceled.c.stage,
               func.jsonb_build_object("reason", canceled.c.status_reason)),
    ).cte("canceled_event")
    return select(canceled.c.workflow_step_id).add_cte(event).where(notify_ended(canceled))


_CANCEL_JOBS = _build_cancel_jobs()
_CANCEL_STEPS = (
    workflow_steps.update()
    .where(_s.run_id == _RUN_ID,
           _s.status.in_(_NOT_STARTED) | (_s.id == any_(bindparam("step_ids", type_=UUIDS))))
    .values(status=WorkflowStepStatus.CANCELED.value, finished_at=func.now(),
            error_message=func.coalesce(bindparam("cancel_reason", type_=Text), "CANCELED"))
)
_CANCEL_RUN = (
    workflow_runs.update()
    .where(_r.id == _RUN_ID)
    .values(status=WorkflowRunStatus.CANCELED.value, finished_at=func.now(),
            status_reason=func.coalesce(bindparam("cancel_reason", type_=Text), "CANCELED"))
)


def cancel_workflow_run(bind: Bind, run_id: UUID | str, *, reason: Optional[str] = None) -> WorkflowRunRecord:
    """Cancel a run: every step not yet started is cancelled, with its pending job; nothing is released after.

    A step whose job a worker holds runs to its end; its outcome is recorded but
    releases nothing. While this runs, a job end that would release a step of the
    run fails with ``workflow.release_conflict`` and writes nothing (the worker
    leaves the lease, and the reaper finishes the job once this has committed).
    Cancelling a cancelled run returns it unchanged.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).

    Raises:
        WorkflowRunNotFound: no such run.
        WorkflowRunFinished: the run has already finished.
    """
    target = check_run_id(run_id)
    check.check_optional_text("reason", reason, max_length=255)

    def work(connection: Connection) -> WorkflowRunRecord:
        status = cancel_run(connection, target, reason)
        if status is None:
            raise WorkflowRunNotFound(f"workflow run {target} was not found", run_id=str(target))
        if status in (WorkflowRunStatus.SUCCEEDED.value, WorkflowRunStatus.COMPLETED_WITH_ERRORS.value):
            raise WorkflowRunFinished(f"workflow run {target} has already finished ({status})", run_id=str(target))
        return read_run(connection, target)  # type: ignore[return-value]

    return run_in_transaction(bind, work)


def cancel_run(connection: Connection, run_id: UUID, reason: Optional[str]) -> Optional[str]:
    """Cancel the run in the connection's transaction unless it has ended; return its status before (None: no run).

    The one cancel of a run: :func:`cancel_workflow_run`'s, and ``cancel_batch``'s for its member runs.
    """
    params = {"target_run_id": run_id, "cancel_reason": reason}
    connection.execute(_LOCK_EXCLUSIVE, params)
    status: Optional[str] = connection.execute(_RUN_FOR_UPDATE, params).scalar()
    if status in (WorkflowRunStatus.RUNNING.value, WorkflowRunStatus.WAITING_FOR_EXTERNAL.value):
        step_ids = list(connection.execute(_CANCEL_JOBS, params).scalars())
        connection.execute(_CANCEL_STEPS, params | {"step_ids": step_ids})
        connection.execute(_CANCEL_RUN, params)
    return status


# -- external steps --------------------------------------------------------------

_STEP_FOR_UPDATE = (
    select(_s.id, _s.kind, _s.status, _s.output)
    .where(_s.run_id == _RUN_ID, _s.step_key == bindparam("target_step_key"))
    .with_for_update()
)
_RUN_EXISTS = select(_r.id).where(_r.id == _RUN_ID)
_STORE_OUTPUT = (
    workflow_steps.update()
    .where(_s.id == bindparam("target_step_id", type_=PG_UUID(as_uuid=True)))
    .values(output=cast(bindparam("new_output", type_=Text), JSONB))
)


def complete_external_step(
    bind: Bind, run_id: UUID | str, step_key: str, succeeded: bool = True, output: Any = None, *,
    max_output_bytes: int = check.DEFAULT_MAX_OUTPUT_BYTES,
) -> WorkflowRunRecord:
    """Answer an external step that waits (WAITING_FOR_EXTERNAL): it succeeds or fails, and its dependents move on.

    The same answer again returns the run unchanged.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        output: a JSON value kept as the step's output (successes only); dependents read
            it with ``ctx.workflow.output_of(step_key)``.
        max_output_bytes: the largest output accepted (JSON bytes), as for a job's output.

    Raises:
        WorkflowRunNotFound, ExternalStepNotFound, ExternalStepNotExternal, ExternalStepNotWaiting: no such step waits.
        ExternalStepConflictingCompletion, ExternalStepConflictingOutput: answered differently before.
        ExternalStepInvalidTerminalStatus, ExternalStepOutputInvalidStatus: bad arguments.
        OutputTooLarge: ``output`` is larger than ``max_output_bytes``; nothing written.
        WorkflowReleaseConflict: the run is being cancelled; try again once it has been.

    Example:
        ``rl.complete_external_step(engine, run.id, "approval", succeeded=True, output={"by": "ada"})``
    """
    target = check_run_id(run_id)
    check.check_text("step_key", step_key, max_length=STEP_KEY_MAX_LENGTH)
    if not isinstance(succeeded, bool):
        raise ExternalStepInvalidTerminalStatus(f"succeeded must be True or False, got {type(succeeded).__name__}")
    if output is not None and not succeeded:
        raise ExternalStepOutputInvalidStatus("an output can only be given with succeeded=True")
    output_json = None if output is None else check.serialize_output(output, max_bytes=max_output_bytes)
    params = {"target_run_id": target, "target_step_key": step_key}

    def work(connection: Connection) -> WorkflowRunRecord:
        if lock_runs_for_release(connection, {target}):
            raise WorkflowReleaseConflict(f"workflow run {target} is being cancelled", run_id=str(target))
        step = connection.execute(_STEP_FOR_UPDATE, params).first()
        if step is None:
            if connection.execute(_RUN_EXISTS, params).first() is None:
                raise WorkflowRunNotFound(f"workflow run {target} was not found", run_id=str(target))
            raise ExternalStepNotFound(f"workflow run {target} has no step {step_key!r}", step_key=step_key)
        _check_answerable(step, succeeded, output_json)
        if step.status == WorkflowStepStatus.WAITING_FOR_EXTERNAL.value:
            connection.execute(_STORE_OUTPUT, {"target_step_id": step.id, "new_output": sealed(output_json, step.id)})
            end = (StepEnd(step.id, WorkflowStepStatus.SUCCEEDED) if succeeded else
                   StepEnd(step.id, WorkflowStepStatus.FAILED, EXTERNAL_STEP_FAILED_CODE,
                           "the external step was answered as failed"))
            finish_steps(connection, [end], {target})
        return read_run(connection, target)  # type: ignore[return-value]

    return run_in_transaction(bind, work)


def _check_answerable(step: Any, succeeded: bool, output_json: Optional[str]) -> None:
    """Raise unless the step waits for an answer or already has this very one."""
    if step.kind != WorkflowStepKind.EXTERNAL.value:
        raise ExternalStepNotExternal(f"step {step.id} is a job step; its job completes it")
    answered = {WorkflowStepStatus.SUCCEEDED.value: True, WorkflowStepStatus.FAILED.value: False}
    if step.status == WorkflowStepStatus.WAITING_FOR_EXTERNAL.value:
        return
    if step.status not in answered:
        raise ExternalStepNotWaiting(f"step {step.id} is {step.status}, not waiting for an answer")
    if answered[step.status] != succeeded:
        raise ExternalStepConflictingCompletion(f"step {step.id} was already answered as {step.status}")
    same_output = (step.output is None) if output_json is None else (
        step.output is not None and same_request(opened(step.output, step.id), output_json))
    if not same_output:
        raise ExternalStepConflictingOutput(f"step {step.id} was already answered with a different output")
