"""How a workflow run is read back: its row, its steps and their dependencies, as records; and what a step's handler reads.

The public reads (:func:`get_workflow_run`, :func:`list_workflow_runs`) and the
actions of :mod:`runledger_sync.store.workflows.actions`, which answer with the
run they changed, share :func:`read_run`. A running step's handler reads its
step and its prerequisites' outputs through ``ctx.workflow`` (:func:`load_step`,
:func:`step_output`).
"""

from __future__ import annotations

from typing import Any, Optional
from uuid import UUID

from sqlalchemy import and_, bindparam, func, select, tuple_
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.errors import InvalidArgument
from runledger_sync.core.workflow import (
    STEP_KEY_MAX_LENGTH,
    WorkflowMutationRecord,
    WorkflowReleaseMode,
    WorkflowRunRecord,
    WorkflowRunStatus,
    WorkflowStepKind,
    WorkflowStepRecord,
    WorkflowStepStatus,
)
from runledger_sync.core.workflow_errors import WorkflowStepNotFound
from runledger_sync.db.schema import job_queue
from runledger_sync.db.schema_workflows import (
    workflow_run_mutations,
    workflow_runs,
    workflow_step_dependencies,
    workflow_steps,
)
from runledger_sync.store.binds import Bind
from runledger_sync.store.sealing import opened
from runledger_sync.store.scope import check_job_id
from runledger_sync.store.transactions import run_in_transaction

DEFAULT_LIST_LIMIT = 100

_s = workflow_steps.c
_r = workflow_runs.c
_d = workflow_step_dependencies.c
_m = workflow_run_mutations.c
RUN_COLUMNS = (_r.id, _r.name, _r.status, _r.organization_id, _r.idempotency_key, _r.status_reason,
               _r.created_at, _r.updated_at, _r.finished_at, _r.meta)

_STEP_ROWS = (
    select(
        _s.id, _s.step_key, _s.kind, _s.status, _s.job_type, _s.job_id, _s.dependencies_total,
        _s.dependencies_pending, _s.dependencies_unsatisfied, _s.error_code, _s.error_message, _s.created_at,
        _s.finished_at,
        func.coalesce(job_queue.c.output, _s.output).label("output"),
    )
    .select_from(workflow_steps.outerjoin(job_queue, job_queue.c.id == _s.job_id))
    .where(_s.run_id == bindparam("run_id"))
    .order_by(_s.created_at, _s.id)
)
_EDGE_ROWS = (
    select(_d.step_id, _d.release_mode, workflow_steps.c.step_key.label("prerequisite_key"))
    .select_from(workflow_step_dependencies.join(workflow_steps, workflow_steps.c.id == _d.prerequisite_step_id))
    .where(workflow_steps.c.run_id == bindparam("run_id"))
    .order_by(workflow_steps.c.created_at, workflow_steps.c.id)
)


_MUTATION_ROWS = (
    select(_m.mutation_key, _m.window_step_key, _m.step_keys, _m.created_at)
    .where(_m.run_id == bindparam("run_id"))
    .order_by(_m.created_at, _m.mutation_key)
)


def run_record(row: Any, steps: tuple[WorkflowStepRecord, ...] = (),
               mutations: tuple[WorkflowMutationRecord, ...] = ()) -> WorkflowRunRecord:
    return WorkflowRunRecord(
        id=row.id, name=row.name, status=WorkflowRunStatus(row.status), organization_id=row.organization_id,
        idempotency_key=row.idempotency_key, status_reason=row.status_reason, created_at=row.created_at,
        updated_at=row.updated_at, finished_at=row.finished_at, steps=steps, meta=row.meta, mutations=mutations,
    )


def read_run(connection: Connection, run_id: UUID) -> Optional[WorkflowRunRecord]:
    run = connection.execute(select(*RUN_COLUMNS).where(_r.id == run_id)).first()
    if run is None:
        return None
    deps: dict[UUID, list[str]] = {}
    release: dict[UUID, str] = {}
    for edge in connection.execute(_EDGE_ROWS, {"run_id": run_id}):
        deps.setdefault(edge.step_id, []).append(edge.prerequisite_key)
        release[edge.step_id] = edge.release_mode
    steps = tuple(
        WorkflowStepRecord(
            id=row.id, key=row.step_key, kind=WorkflowStepKind(row.kind), status=WorkflowStepStatus(row.status),
            job_type=row.job_type, job_id=row.job_id, deps=tuple(deps.get(row.id, ())),
            release=WorkflowReleaseMode(release.get(row.id, WorkflowReleaseMode.ON_TERMINAL.value)),
            dependencies_total=row.dependencies_total, dependencies_pending=row.dependencies_pending,
            dependencies_unsatisfied=row.dependencies_unsatisfied,
            # A job step's output is sealed for its job, an external step's for the step.
            output=opened(row.output, row.job_id or row.id), error_code=row.error_code,
            error_message=row.error_message, created_at=row.created_at, finished_at=row.finished_at,
        )
        for row in connection.execute(_STEP_ROWS, {"run_id": run_id})
    )
    mutations = tuple(
        WorkflowMutationRecord(mutation_key=row.mutation_key, window=row.window_step_key,
                               step_keys=tuple(row.step_keys), created_at=row.created_at)
        for row in connection.execute(_MUTATION_ROWS, {"run_id": run_id})
    )
    return run_record(run, steps, mutations)


def check_run_id(run_id: Any) -> UUID:
    try:
        return check_job_id(run_id)
    except InvalidArgument:
        raise InvalidArgument("run_id", run_id, "a UUID") from None


# -- the public reads ----------------------------------------------------------------


def get_workflow_run(bind: Bind, run_id: UUID | str) -> Optional[WorkflowRunRecord]:
    """Return the run with its steps (each with its deps, job id, output or error) and its appends, or None.

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
    select(func.coalesce(job_queue.c.output, _s.output).label("output"),
           func.coalesce(job_queue.c.id, _s.id).label("sealed_for"))
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
    return opened(row.output, row.sealed_for)

