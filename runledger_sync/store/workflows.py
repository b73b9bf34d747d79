"""Workflow runs: enqueue one, read them, cancel one, answer an external step (spec section 11).

The public store path for workflows. Cancelling a run and answering an external
step are written in :mod:`runledger_sync.store._workflow_actions` and answer here;
what a step's job does to its step, within the job's own transitions, is in
:mod:`runledger_sync.store._workflow_steps`.
"""

from __future__ import annotations

from typing import Any, Optional
from uuid import UUID

from sqlalchemy import Text, and_, bindparam, cast, func, literal, select, tuple_
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from runledger_sync.core import instrumentation
from runledger_sync.core import validation as check
from runledger_sync.core.errors import InvalidArgument
from runledger_sync.core.ids import uuid7
from runledger_sync.core.meta import meta_json
from runledger_sync.core.types import DEFAULT_EVENT_LOG, EventLog
from runledger_sync.core.workflow import (
    STEP_KEY_MAX_LENGTH,
    Workflow,
    WorkflowRunRecord,
    WorkflowRunStatus,
    WorkflowStepKind,
)
from runledger_sync.core.workflow_errors import (
    WorkflowAlreadyEnqueued,
    WorkflowDefinitionNotFoundOrDisabled,
    WorkflowEnqueueConflictingRetry,
    WorkflowLegacySnapshotMissing,
    WorkflowStepNotFound,
)
from runledger_sync.db.schema import job_definitions, job_queue
from runledger_sync.db.schema_workflows import workflow_runs, workflow_step_dependencies, workflow_steps
from runledger_sync.store._binds import Bind
from runledger_sync.store._enqueue_batch import require_read_committed
from runledger_sync.store._enqueue_batch import same_request
from runledger_sync.store._errors import run_in_transaction
from runledger_sync.store._sql import event_log_params
from runledger_sync.store._workflow_actions import cancel_workflow_run, complete_external_step  # noqa: F401
from runledger_sync.store._workflow_runs import RUN_COLUMNS, check_run_id, read_run, run_record
from runledger_sync.store._workflow_steps import finish_steps, refresh_runs, release_steps

DEFAULT_LIST_LIMIT = 100

_s = workflow_steps.c
_r = workflow_runs.c
_d = workflow_step_dependencies.c


# -- enqueue ---------------------------------------------------------------------


def enqueue_workflow(
    bind: Bind, workflow: Workflow, *, max_payload_bytes: int = check.DEFAULT_MAX_PAYLOAD_BYTES,
    event_log: EventLog | str = DEFAULT_EVENT_LOG,
) -> WorkflowRunRecord:
    """Write a workflow run: its steps, their dependencies, and the jobs of the steps that wait for nothing.

    The whole definition is checked first (and its job types against their
    definitions); a bad one raises and writes nothing. With an idempotency key,
    the same request again returns the existing run.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        max_payload_bytes: the largest payload of a step (JSON bytes), as for :func:`runledger_sync.enqueue`.
        event_log: whether the jobs of the steps released now get their ENQUEUED event
            row, as for :func:`runledger_sync.enqueue` (steps released later, when their
            prerequisites end, always get it).

    Returns:
        The run with its steps.

    Raises:
        WorkflowEmpty, DuplicateStepKey, UnknownDependency, DependencyCycle: a bad definition.
        WorkflowTooManySteps: more than 10,000 steps.
        InvalidPayload: a step's payload is larger than ``max_payload_bytes`` (the error names the step).
        WorkflowTooLarge: the step payloads together are larger than 64 MiB of JSON.
        WorkflowDefinitionNotFoundOrDisabled: a step's job type has no enabled definition.
        WorkflowEnqueueConflictingRetry: the key exists with a different request.

    Example:
        ``run = rl.enqueue_workflow(engine, wf)``; in your transaction,
        ``with engine.begin() as conn: rl.enqueue_workflow(conn, wf)``.
    """
    if not isinstance(workflow, Workflow):
        raise InvalidArgument("workflow", type(workflow).__name__, "a Workflow")
    check.check_int("max_payload_bytes", max_payload_bytes, check.MAX_PAYLOAD_BYTES_RANGE)
    event_log_params(event_log)  # an unknown level is refused here, before anything is written
    workflow.validate()
    workflow.check_payload_sizes(max_payload_bytes=max_payload_bytes)
    snapshot = _request_snapshot(workflow)
    # Drawn before the first try: a try repeated after a lost connection (its transaction
    # rolled back) writes the same run, and the enqueue observers hear of it once.
    run_id = uuid7()
    meta = meta_json(instrumentation.observed_meta(workflow.name, str(run_id), workflow.meta)
                     if instrumentation.enqueue_observers else workflow.meta)
    return run_in_transaction(bind, lambda connection: _enqueue(connection, workflow, snapshot, run_id, meta, event_log))


def _request_snapshot(workflow: Workflow) -> str:
    steps = [
        {"key": step.key, "kind": step.kind.value, "job_type": step.job_type, "payload": step.payload,
         "after": list(step.after), "release": step.release.value, "priority": step.priority,
         "max_attempts": step.max_attempts, "timeout_seconds": step.timeout_seconds}
        # Only when set: the snapshots of runs enqueued before steps could opt in stay equal.
        | ({"continuation": True} if step.continuation else {})
        for step in workflow.steps
    ]
    return check.serialize_json("workflow", {"name": workflow.name, "steps": steps})


def _enqueue(connection: Connection, workflow: Workflow, snapshot: str, run_id: UUID, meta: str,
             event_log: Any) -> WorkflowRunRecord:
    if workflow.idempotency_key is not None:
        require_read_committed(connection)
    _check_definitions(connection, {step.job_type for step in workflow.steps if step.job_type is not None})
    inserted = connection.execute(
        pg_insert(workflow_runs)
        .values(id=run_id, name=workflow.name, organization_id=workflow.organization_id,
                idempotency_key=workflow.idempotency_key, meta=cast(literal(meta, Text), JSONB),
                enqueue_request=None if workflow.idempotency_key is None else cast(literal(snapshot, Text), JSONB))
        .on_conflict_do_nothing()
        .returning(_r.id)
    ).first()
    if inserted is None:
        return _existing_run(connection, workflow, snapshot)
    step_ids = {step.key: uuid7() for step in workflow.steps}
    connection.execute(workflow_steps.insert(), [
        {"id": step_ids[step.key], "run_id": run_id, "step_key": step.key, "kind": step.kind.value,
         "job_type": step.job_type,
         "payload": None if step.kind is WorkflowStepKind.EXTERNAL else step.payload,
         "priority": step.priority, "max_attempts": step.max_attempts, "timeout_seconds": step.timeout_seconds,
         "allow_continuation": step.continuation,
         "dependencies_total": len(step.after), "dependencies_pending": len(step.after)}
        for step in workflow.steps
    ])
    edges = [{"step_id": step_ids[step.key], "prerequisite_step_id": step_ids[key], "release_mode": step.release.value}
             for step in workflow.steps for key in step.after]
    if edges:
        connection.execute(workflow_step_dependencies.insert(), edges)
    roots = [(step_ids[step.key], step.kind.value) for step in workflow.steps if not step.after]
    failed = release_steps(connection, roots, event_log=event_log)
    if failed:
        finish_steps(connection, failed, {run_id})
    else:
        refresh_runs(connection, {run_id})
    return read_run(connection, run_id)  # type: ignore[return-value]


def _check_definitions(connection: Connection, job_types: set[str]) -> None:
    if not job_types:
        return
    enabled = set(connection.execute(
        select(job_definitions.c.job_type).where(
            job_definitions.c.job_type.in_(sorted(job_types)), job_definitions.c.is_enabled)
    ).scalars())
    missing = sorted(job_types - enabled)
    if missing:
        raise WorkflowDefinitionNotFoundOrDisabled(
            f"job type {missing[0]!r} has no enabled definition; register its handler and call "
            "registry.sync_definitions(engine), or enable it",
            job_types=missing,
        )


def _existing_run(connection: Connection, workflow: Workflow, snapshot: str) -> WorkflowRunRecord:
    existing = connection.execute(
        select(_r.id, _r.enqueue_request)
        .where(_r.name == workflow.name, _r.idempotency_key == workflow.idempotency_key,
               _r.organization_id.is_not_distinct_from(cast(workflow.organization_id, Text)))
        .with_for_update()
    ).first()
    if existing is None:
        # The conflicting run was deleted between the insert and this read.
        raise WorkflowAlreadyEnqueued(
            f"workflow {workflow.name!r} with idempotency key {workflow.idempotency_key!r} already exists")
    if existing.enqueue_request is None:
        raise WorkflowLegacySnapshotMissing(f"workflow run {existing.id} has no request snapshot to compare")
    if not same_request(existing.enqueue_request, snapshot):
        raise WorkflowEnqueueConflictingRetry(
            f"workflow {workflow.name!r} with idempotency key {workflow.idempotency_key!r} exists with a different "
            "definition", run_id=str(existing.id))
    return read_run(connection, existing.id)  # type: ignore[return-value]


# -- reads -------------------------------------------------------------------------


def get_workflow_run(bind: Bind, run_id: UUID | str) -> Optional[WorkflowRunRecord]:
    """Return the run with its steps (each with its deps, job id, output or error), or None.

    Args:
        bind: an Engine, or a Connection, ORM Session or psycopg (2 or 3) connection.
    """
    target = check_run_id(run_id)
    return run_in_transaction(bind, lambda connection: read_run(connection, target))


def list_workflow_runs(
    bind: Bind,
    *,
    status: Optional[WorkflowRunStatus | str] = None,
    organization_id: Optional[str] = None,
    limit: int = DEFAULT_LIST_LIMIT,
    before: Optional[WorkflowRunRecord] = None,
) -> list[WorkflowRunRecord]:
    """Return runs newest first, without their steps (read one with :func:`get_workflow_run`).

    Args:
        status: only runs in this status.
        organization_id: only this organization's runs.
        before: the last run of the previous page: only older runs (by ``created_at``,
            then ``id``), read from an index at the same cost however deep the page.
    """
    check.check_int("limit", limit, check.LIMIT_RANGE)
    conditions = []
    if status is not None:
        try:
            conditions.append(_r.status == WorkflowRunStatus(status).value)
        except ValueError:
            raise InvalidArgument(
                "status", status, f"one of {', '.join(s.value for s in WorkflowRunStatus)}") from None
    if organization_id is not None:
        conditions.append(_r.organization_id == check.check_organization_id(organization_id))
    if before is not None:
        if not isinstance(before, WorkflowRunRecord):
            raise InvalidArgument("before", type(before).__name__, "a WorkflowRunRecord")
        conditions.append(tuple_(_r.created_at, _r.id) < tuple_(before.created_at, before.id))
    statement = (
        select(*RUN_COLUMNS).where(*conditions).order_by(_r.created_at.desc(), _r.id.desc()).limit(limit)
    )
    return run_in_transaction(bind, lambda connection: [run_record(row) for row in connection.execute(statement)])


# -- what a step's handler reads (ctx.workflow) ------------------------------------

_STEP_OF_ID = select(_s.run_id, _s.step_key).where(_s.id == bindparam("step_id", type_=PG_UUID(as_uuid=True)))
_OUTPUT_OF_KEY = (
    select(func.coalesce(job_queue.c.output, _s.output).label("output"))
    .select_from(workflow_steps.outerjoin(
        job_queue, and_(job_queue.c.id == _s.job_id, job_queue.c.status == "SUCCEEDED")))
    .where(_s.run_id == bindparam("run_id", type_=PG_UUID(as_uuid=True)), _s.step_key == bindparam("step_key"))
)


def load_step(bind: Bind, step_id: UUID) -> tuple[UUID, str]:
    """The run id and key of a step (for ``ctx.workflow``).

    Raises:
        WorkflowStepNotFound: the step is gone (its run was deleted).
    """
    row = run_in_transaction(bind, lambda connection: connection.execute(_STEP_OF_ID, {"step_id": step_id}).first())
    if row is None:
        raise WorkflowStepNotFound(f"workflow step {step_id} was not found")
    return row.run_id, row.step_key


_STEP_ALLOWS_CONTINUATION = select(_s.allow_continuation).where(
    _s.id == bindparam("step_id", type_=PG_UUID(as_uuid=True)))


def step_allows_continuation(bind: Bind, step_id: UUID) -> bool:
    """Whether the step was built with ``continuation=True`` (False once the step is gone)."""
    return bool(run_in_transaction(bind, lambda connection: connection.execute(
        _STEP_ALLOWS_CONTINUATION, {"step_id": step_id}).scalar()))


def step_output(bind: Bind, run_id: UUID, step_key: str) -> Any:
    """A step's stored output: its succeeded job's, or an external step's answer; None before that.

    Raises:
        WorkflowStepNotFound: the run has no step ``step_key``.
    """
    check.check_text("step_key", step_key, max_length=STEP_KEY_MAX_LENGTH)
    params = {"run_id": run_id, "step_key": step_key}
    row = run_in_transaction(bind, lambda connection: connection.execute(_OUTPUT_OF_KEY, params).first())
    if row is None:
        raise WorkflowStepNotFound(f"workflow run {run_id} has no step {step_key!r}", step_key=step_key)
    return row.output

