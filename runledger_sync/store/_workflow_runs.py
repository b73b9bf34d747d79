"""How a workflow run is read back: its row, its steps and their dependencies, as records.

Shared by the reads in :mod:`runledger_sync.store.workflows` and the actions in
:mod:`runledger_sync.store._workflow_actions`, which answer with the run they changed.
"""

from __future__ import annotations

from typing import Any, Optional
from uuid import UUID

from sqlalchemy import bindparam, func, select
from sqlalchemy.engine import Connection

from runledger_sync.core.errors import InvalidArgument
from runledger_sync.core.workflow import (
    WorkflowReleaseMode,
    WorkflowRunRecord,
    WorkflowRunStatus,
    WorkflowStepKind,
    WorkflowStepRecord,
    WorkflowStepStatus,
)
from runledger_sync.db.schema import job_queue
from runledger_sync.db.schema_workflows import workflow_runs, workflow_step_dependencies, workflow_steps
from runledger_sync.store._scope import check_job_id

_s = workflow_steps.c
_r = workflow_runs.c
_d = workflow_step_dependencies.c
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


def run_record(row: Any, steps: tuple[WorkflowStepRecord, ...] = ()) -> WorkflowRunRecord:
    return WorkflowRunRecord(
        id=row.id, name=row.name, status=WorkflowRunStatus(row.status), organization_id=row.organization_id,
        idempotency_key=row.idempotency_key, status_reason=row.status_reason, created_at=row.created_at,
        updated_at=row.updated_at, finished_at=row.finished_at, steps=steps, meta=row.meta,
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
            dependencies_unsatisfied=row.dependencies_unsatisfied, output=row.output, error_code=row.error_code,
            error_message=row.error_message, created_at=row.created_at, finished_at=row.finished_at,
        )
        for row in connection.execute(_STEP_ROWS, {"run_id": run_id})
    )
    return run_record(run, steps)


def check_run_id(run_id: Any) -> UUID:
    try:
        return check_job_id(run_id)
    except InvalidArgument:
        raise InvalidArgument("run_id", run_id, "a UUID") from None
