"""What a workflow step's job does to its step, run inside the job's own transition (spec section 11).

The job statements return ``workflow_step_id``; a writer calls these functions,
in the same transaction, only when some written row has one, so plain jobs pay
nothing. A step's end is propagated here: its outgoing edges count down their
dependents, a dependent whose last prerequisite ended is released (a JOB step
gets its job, an EXTERNAL step waits for its answer) or cancelled when an
ON_SUCCESS prerequisite did not succeed, and the cancellation cascades.

Locks, always in this order: the job rows (the writer's fence), the runs'
advisory locks shared (try-locks: a cancel holding one exclusively makes the
write fail with ``workflow.release_conflict`` rather than wait), then the run
rows in id order, which serialises every propagation within a run.
"""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple, Optional, Sequence
from uuid import UUID

from sqlalchemy import Integer, Text, and_, any_, bindparam, case, cast, func, literal, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.engine import Connection

from runledger_sync.core.types import EventLog, JobEventType
from runledger_sync.core.states import JobStatus
from runledger_sync.core.workflow import (
    WorkflowReleaseMode,
    WorkflowRunStatus,
    WorkflowStepKind,
    WorkflowStepStatus,
)
from runledger_sync.core.workflow_errors import WorkflowReleaseConflict
from runledger_sync.db.schema import job_definitions, job_events, job_queue
from runledger_sync.db.schema_workflows import workflow_runs, workflow_step_dependencies, workflow_steps
from runledger_sync.store.notify import notify_due_types
from runledger_sync.store.sql import event_log_params, full_event_log

DEPENDENCY_UNSATISFIED_CODE = "workflow.dependency_unsatisfied"
DEFINITION_UNAVAILABLE_CODE = "workflow.definition_not_found_or_disabled"
#: The first key of the runs' advisory locks, so they never meet an application's own.
ADVISORY_LOCK_NAMESPACE = 0x524C5746  # "RLWF"

_s = workflow_steps.c
_r = workflow_runs.c
_d = workflow_step_dependencies.c
#: A bound array of ids (step, run or job ids).
UUIDS = ARRAY(PG_UUID(as_uuid=True))
_TERMINAL_STEP = [s.value for s in WorkflowStepStatus if s.is_terminal]
_STEP_OF_JOB = {
    JobStatus.SUCCEEDED: WorkflowStepStatus.SUCCEEDED,
    JobStatus.DEAD_LETTERED: WorkflowStepStatus.FAILED,
    JobStatus.CANCELED: WorkflowStepStatus.CANCELED,
}


class StepEnd(NamedTuple):
    """A step that ended, and why."""

    step_id: UUID
    status: WorkflowStepStatus
    error_code: Optional[str] = None
    error_message: Optional[str] = None


class JobEnd(NamedTuple):
    """A workflow job that reached a terminal status in the writer's transaction."""

    job_id: UUID
    step_id: UUID
    status: JobStatus
    error_code: Optional[str] = None
    error_message: Optional[str] = None


def run_lock_key(run_id: Any) -> tuple[Any, Any]:
    """The two keys of a run's advisory lock (``run_id`` a column or bound value)."""
    return literal(ADVISORY_LOCK_NAMESPACE), func.hashtext(cast(run_id, Text))


_STEPS_HANDED_BACK = (
    workflow_steps.update()
    .where(_s.id == any_(bindparam("step_ids", type_=UUIDS)), _s.status == WorkflowStepStatus.RUNNING.value)
    .values(status=WorkflowStepStatus.ENQUEUED.value)
)


def step_ids_of(jobs: Iterable[Any]) -> list[UUID]:
    """The workflow steps of ``jobs`` (rows or records with ``workflow_step_id``); empty for plain jobs."""
    return [job.workflow_step_id for job in jobs if job.workflow_step_id is not None]


def steps_handed_back(connection: Connection, jobs: Sequence[Any]) -> None:
    """Unstarted-release hook: the released jobs' steps are ENQUEUED again."""
    step_ids = step_ids_of(jobs)
    if step_ids:
        connection.execute(_STEPS_HANDED_BACK, {"step_ids": step_ids})


def job_ends(jobs: Iterable[Any]) -> list[JobEnd]:
    """The terminal workflow jobs among written job rows (records or rows with status and error columns)."""
    ends = []
    for job in jobs:
        status = JobStatus(job.status)
        if job.workflow_step_id is not None and status in _STEP_OF_JOB:
            ends.append(JobEnd(job.id, job.workflow_step_id, status, job.last_error_code, job.last_error_message))
    return ends


_RUNS_OF_STEPS = select(_s.id, _s.run_id).where(_s.id == any_(bindparam("step_ids", type_=UUIDS)))


def jobs_ended(connection: Connection, ends: Sequence[JobEnd]) -> None:
    """Terminal hook: end the jobs' steps and release or cancel what depends on them.

    Raises:
        WorkflowReleaseConflict: a run is being cancelled; ``details["job_ids"]``
            names the jobs of those runs. The caller's transaction must roll back.
    """
    if not ends:
        return
    run_of = dict(connection.execute(_RUNS_OF_STEPS, {"step_ids": [end.step_id for end in ends]}).all())
    conflicting = lock_runs_for_release(connection, set(run_of.values()))
    if conflicting:
        job_ids = [str(end.job_id) for end in ends if run_of.get(end.step_id) in conflicting]
        raise WorkflowReleaseConflict(
            f"workflow run {sorted(map(str, conflicting))[0]} is being cancelled; its job's outcome was not written",
            job_ids=job_ids,
        )
    finish_steps(connection, [
        StepEnd(end.step_id, _STEP_OF_JOB[end.status],
                end.error_code if end.status is JobStatus.DEAD_LETTERED else None,
                end.error_message if end.status is JobStatus.DEAD_LETTERED else None)
        for end in ends
    ], set(run_of.values()))


_TRY_SHARED = select(
    func.unnest(bindparam("run_ids", type_=UUIDS)).label("run_id")
).subquery("runs")
_TRY_SHARED_LOCKS = select(_TRY_SHARED.c.run_id).where(
    ~func.pg_try_advisory_xact_lock_shared(*run_lock_key(_TRY_SHARED.c.run_id))
)
_LOCK_RUN_ROWS = (
    select(_r.id)
    .where(_r.id == any_(bindparam("run_ids", type_=UUIDS)))
    .order_by(_r.id)
    .with_for_update()
)


def lock_runs_for_release(connection: Connection, run_ids: set[UUID]) -> set[UUID]:
    """Take the runs' advisory locks shared, then their rows; return the runs whose lock a cancel holds.

    When some are returned, nothing else was locked and the caller must not release anything.
    """
    ordered = sorted(run_ids)
    conflicting = set(connection.execute(_TRY_SHARED_LOCKS, {"run_ids": ordered}).scalars())
    if not conflicting:
        connection.execute(_LOCK_RUN_ROWS, {"run_ids": ordered}).all()
    return conflicting


def _build_end_steps() -> Any:
    ended = func.unnest(
        bindparam("step_ids", type_=UUIDS), bindparam("statuses", type_=ARRAY(Text)),
        bindparam("codes", type_=ARRAY(Text)), bindparam("messages", type_=ARRAY(Text)),
    ).table_valued("step_id", "status", "error_code", "error_message").render_derived(name="ended")
    return (
        workflow_steps.update()
        # A step ends once: a later end (an operator cancel racing the job) changes nothing.
        .where(_s.id == ended.c.step_id, _s.status.not_in(_TERMINAL_STEP))
        .values(status=ended.c.status, error_code=ended.c.error_code, error_message=ended.c.error_message,
                finished_at=func.now())
        .returning(_s.id)
    )


def _build_count_down() -> Any:
    prerequisite = workflow_steps.alias("prerequisite")
    not_succeeded = and_(
        _d.release_mode == WorkflowReleaseMode.ON_SUCCESS.value,
        prerequisite.c.status != WorkflowStepStatus.SUCCEEDED.value,
    )
    edges = (
        select(
            _d.step_id,
            func.count().label("ended"),
            func.count().filter(not_succeeded).label("unsatisfied"),
        )
        .select_from(workflow_step_dependencies.join(prerequisite, prerequisite.c.id == _d.prerequisite_step_id))
        .where(_d.prerequisite_step_id == any_(bindparam("step_ids", type_=UUIDS)))
        .group_by(_d.step_id)
        .subquery("edges")
    )
    return (
        workflow_steps.update()
        .where(_s.id == edges.c.step_id)
        .values(
            dependencies_pending=_s.dependencies_pending - edges.c.ended,
            dependencies_unsatisfied=_s.dependencies_unsatisfied + edges.c.unsatisfied,
        )
        .returning(_s.id, _s.kind, _s.status, _s.dependencies_pending, _s.dependencies_unsatisfied)
    )


_END_STEPS = _build_end_steps()
_COUNT_DOWN = _build_count_down()


def unsatisfied_end(step_id: UUID) -> StepEnd:
    """The end of a ready step that a prerequisite released on success let down: cancelled, never started."""
    return StepEnd(step_id, WorkflowStepStatus.CANCELED, DEPENDENCY_UNSATISFIED_CODE,
                   "a prerequisite released on success did not succeed")


def finish_steps(connection: Connection, ends: Sequence[StepEnd], run_ids: set[UUID]) -> None:
    """End steps, count down their dependents, release or cancel the ready ones, cascade; refresh the runs.

    The caller holds the runs' locks (:func:`lock_runs_for_release`).
    """
    while ends:
        ended = connection.execute(_END_STEPS, {
            "step_ids": [end.step_id for end in ends], "statuses": [end.status.value for end in ends],
            "codes": [end.error_code for end in ends], "messages": [end.error_message for end in ends],
        }).scalars().all()
        if not ended:
            break
        counted = connection.execute(_COUNT_DOWN, {"step_ids": list(ended)}).all()
        ready = [row for row in counted
                 if row.status == WorkflowStepStatus.BLOCKED.value and row.dependencies_pending == 0]
        ends = [unsatisfied_end(row.id) for row in ready if row.dependencies_unsatisfied > 0]
        # The job ends that release dependents are written without the worker's
        # level at hand, so their released jobs keep the ENQUEUED row whatever it is.
        ends += release_steps(connection, [(row.id, row.kind) for row in ready if row.dependencies_unsatisfied == 0],
                              event_log=EventLog.FULL)
    refresh_runs(connection, run_ids)


def _build_release_jobs() -> Any:
    wanted = func.unnest(
        bindparam("step_ids", type_=UUIDS), bindparam("job_ids", type_=UUIDS),
    ).table_valued("step_id", "job_id").render_derived(name="wanted")
    definition = job_definitions.alias("definition")
    rows = (
        select(
            wanted.c.job_id, _s.job_type, _r.organization_id, _s.payload,
            func.coalesce(_s.priority, definition.c.default_priority),
            func.coalesce(_s.max_attempts, definition.c.max_attempts),
            func.coalesce(_s.timeout_seconds, definition.c.default_timeout_seconds),
            _s.id,
            definition.c.queue,
            _r.meta,
        )
        .select_from(
            wanted.join(workflow_steps, _s.id == wanted.c.step_id)
            .join(workflow_runs, _r.id == _s.run_id)
            .join(definition, and_(definition.c.job_type == _s.job_type, definition.c.is_enabled))
        )
    )
    inserted = (
        job_queue.insert()
        .from_select(["id", "job_type", "organization_id", "payload", "priority", "max_attempts", "timeout_seconds",
                      "workflow_step_id", "queue", "meta"], rows)
        .returning(job_queue.c.id, job_queue.c.job_type, job_queue.c.run_number, job_queue.c.stage,
                   job_queue.c.next_run_at, job_queue.c.workflow_step_id)
        .cte("inserted")
    )
    event = job_events.insert().from_select(
        ["job_id", "run_number", "attempt", "event_type", "stage", "payload"],
        select(inserted.c.id, inserted.c.run_number, literal(None, Integer), literal(JobEventType.ENQUEUED.value),
               inserted.c.stage, func.jsonb_build_object("job_type", inserted.c.job_type)).where(full_event_log()),
    ).cte("enqueued_event")
    linked = (
        workflow_steps.update()
        .where(_s.id == inserted.c.workflow_step_id)
        .values(status=WorkflowStepStatus.ENQUEUED.value, job_id=inserted.c.id)
        .cte("linked")
    )
    # Delivered on commit only, like enqueue's, so idle workers wake for the released jobs.
    notified = notify_due_types(inserted)
    return select(inserted.c.workflow_step_id).add_cte(event, linked).where(notified >= 0)


_RELEASE_JOBS = _build_release_jobs()
_WAIT_FOR_EXTERNAL = (
    workflow_steps.update()
    .where(_s.id == any_(bindparam("step_ids", type_=UUIDS)))
    .values(status=WorkflowStepStatus.WAITING_FOR_EXTERNAL.value)
)


def release_steps(connection: Connection, steps: Sequence[tuple[UUID, str]], *, event_log: Any) -> list[StepEnd]:
    """Release ready steps: a job for each JOB step, WAITING_FOR_EXTERNAL for the others.

    ``event_log`` decides whether each released job gets its ENQUEUED event row (``full``).

    Returns the JOB steps whose type has no enabled definition any more, as failed ends.
    """
    jobs = [step_id for step_id, kind in steps if kind == WorkflowStepKind.JOB.value]
    externals = [step_id for step_id, kind in steps if kind == WorkflowStepKind.EXTERNAL.value]
    if externals:
        connection.execute(_WAIT_FOR_EXTERNAL, {"step_ids": externals})
    if not jobs:
        return []
    released = set(connection.execute(
        # A step's job takes the step's id: a payload sealed for the step opens on its job.
        _RELEASE_JOBS, {"step_ids": jobs, "job_ids": jobs} | event_log_params(event_log)).scalars())
    return [
        StepEnd(step_id, WorkflowStepStatus.FAILED, DEFINITION_UNAVAILABLE_CODE,
                "the step's job type has no enabled definition")
        for step_id in jobs if step_id not in released
    ]


def _build_refresh_runs() -> Any:
    """The run status rule (spec section 11, with its [EXT] note on gates).

    Any ENQUEUED or RUNNING step makes the run RUNNING. Otherwise a run with a
    step waiting for its answer is WAITING_FOR_EXTERNAL, even with BLOCKED steps:
    once propagation is done, every BLOCKED step waits (perhaps through other
    BLOCKED steps) on one that has not ended, so with nothing running it waits on
    a gate. A run whose steps all ended is SUCCEEDED or COMPLETED_WITH_ERRORS.
    """
    running = (WorkflowStepStatus.ENQUEUED.value, WorkflowStepStatus.RUNNING.value)
    errors = (WorkflowStepStatus.FAILED.value, WorkflowStepStatus.CANCELED.value)
    summary = (
        select(
            _s.run_id,
            func.bool_or(_s.status.in_(running)).label("running"),
            func.bool_or(_s.status == WorkflowStepStatus.WAITING_FOR_EXTERNAL.value).label("waiting"),
            func.bool_or(_s.status.not_in(_TERMINAL_STEP)).label("open"),
            func.bool_or(_s.status.in_(errors)).label("errors"),
        )
        .where(_s.run_id == any_(bindparam("run_ids", type_=UUIDS)))
        .group_by(_s.run_id)
        .subquery("summary")
    )
    status = case(
        (summary.c.running, WorkflowRunStatus.RUNNING.value),
        (summary.c.waiting, WorkflowRunStatus.WAITING_FOR_EXTERNAL.value),
        # BLOCKED steps with nothing running or waiting cannot stay so after propagation;
        # should one, the run is not called finished.
        (summary.c.open, WorkflowRunStatus.RUNNING.value),
        (summary.c.errors, WorkflowRunStatus.COMPLETED_WITH_ERRORS.value),
        else_=WorkflowRunStatus.SUCCEEDED.value,
    )
    finished = ~summary.c.open
    return (
        workflow_runs.update()
        # A cancelled run stays so, whatever its running steps end with.
        .where(_r.id == summary.c.run_id, _r.status != WorkflowRunStatus.CANCELED.value)
        .values(status=status, finished_at=case((finished, func.coalesce(_r.finished_at, func.now()))))
    )


_REFRESH_RUNS = _build_refresh_runs()


def refresh_runs(connection: Connection, run_ids: set[UUID]) -> None:
    """Set each run's status from its steps (spec section 11's rule)."""
    if run_ids:
        connection.execute(_REFRESH_RUNS, {"run_ids": sorted(run_ids)})
