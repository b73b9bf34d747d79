"""Append steps to a running workflow run at an open window (spec section 11, ``workflow_run_mutations``).

One transaction does it all. It first takes the run's locks as a release does
(the advisory lock shared, then the run's row), so an answer to the window or a
job end that releases the run's steps waits for it, or it waits for them: the
window cannot close half-way through. It then finds the append by its mutation
key (the same steps again change nothing), checks the run and the window, and
checks the new steps against the run's own graph. It writes the steps and
their edges, makes every step that waits for the window wait for each new step
too, releases the new steps that wait for nothing still running, and records
the mutation.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any
from uuid import UUID

from sqlalchemy import Integer, bindparam, select
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.errors import InvalidArgument
from runledger_sync.core.encryption import active_encryption
from runledger_sync.core.ids import uuid7
from runledger_sync.core.types import DEFAULT_EVENT_LOG
from runledger_sync.core.workflow import (
    WorkflowAppend,
    WorkflowReleaseMode,
    WorkflowRunRecord,
    WorkflowRunStatus,
    WorkflowStep,
    WorkflowStepKind,
    WorkflowStepStatus,
)
from runledger_sync.core.workflow_errors import (
    WorkflowAppendConflictingRetry,
    WorkflowAppendMutationKeyBlank,
    WorkflowAppendTerminalRun,
    WorkflowAppendWindowMissing,
    WorkflowAppendWindowNotExternal,
    WorkflowAppendWindowNotOpen,
    WorkflowReleaseConflict,
    WorkflowRunNotFound,
)
from runledger_sync.db.schema_workflows import (
    workflow_run_mutations,
    workflow_runs,
    workflow_step_dependencies,
    workflow_steps,
)
from runledger_sync.store.binds import Bind
from runledger_sync.store.transactions import run_in_transaction
from runledger_sync.store.workflows.enqueue import check_definitions, insert_steps, step_snapshots
from runledger_sync.store.workflows.runs import check_run_id, read_run
from runledger_sync.store.workflows.steps import (
    UUIDS,
    finish_steps,
    lock_runs_for_release,
    refresh_runs,
    release_steps,
    unsatisfied_end,
)

MUTATION_KEY_MAX_LENGTH = 255

_s = workflow_steps.c
_r = workflow_runs.c
_d = workflow_step_dependencies.c
_m = workflow_run_mutations.c
_RUN_ID = bindparam("target_run_id", type_=PG_UUID(as_uuid=True))
_ENDED_RUN = (WorkflowRunStatus.SUCCEEDED.value, WorkflowRunStatus.COMPLETED_WITH_ERRORS.value,
              WorkflowRunStatus.CANCELED.value)

_RUN_STATUS = select(_r.status).where(_r.id == _RUN_ID)
_MUTATION_DIGEST = select(_m.request_digest).where(_m.run_id == _RUN_ID, _m.mutation_key == bindparam("mutation_key"))
_RUN_STEPS = select(_s.id, _s.step_key, _s.kind, _s.status).where(_s.run_id == _RUN_ID)
_RUN_EDGES = (
    select(_d.step_id, _d.prerequisite_step_id, _d.release_mode)
    .select_from(workflow_step_dependencies.join(workflow_steps, _s.id == _d.step_id))
    .where(_s.run_id == _RUN_ID)
)
_WAIT_FOR_MORE = (
    workflow_steps.update()
    .where(_s.id == bindparam("step_ids", type_=UUIDS).any_())
    .values(dependencies_total=_s.dependencies_total + bindparam("added", type_=Integer),
            dependencies_pending=_s.dependencies_pending + bindparam("added", type_=Integer))
)


def append_workflow_steps(
    bind: Bind, run_id: UUID | str, more: WorkflowAppend, *, mutation_key: str,
    max_payload_bytes: int = check.DEFAULT_MAX_PAYLOAD_BYTES,
) -> WorkflowRunRecord:
    """Add steps to a running run at an open window: the window's dependents wait for them too.

    The window (``more.window``) is an external step of the run not yet answered.
    The steps that wait for it also wait for every appended step, so a fan-in
    after the window runs once, after the appended work. New steps whose
    prerequisites have all ended (or that have none) are released at once.
    ``mutation_key`` names the append in the run: the same steps again under it
    return the run unchanged (a retried handler appends once).

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        more: the steps to add (:class:`runledger_sync.WorkflowAppend`).
        mutation_key: this append's name in the run, at most 255 characters.
        max_payload_bytes: the largest payload of a step (JSON bytes), as for :func:`runledger_sync.enqueue`.

    Returns:
        The run with its steps and its mutations.

    Raises:
        WorkflowAppendMutationKeyBlank: ``mutation_key`` is blank.
        WorkflowRunNotFound: no such run.
        WorkflowAppendConflictingRetry: the key was used for different steps.
        WorkflowAppendTerminalRun: the run has ended or was cancelled.
        WorkflowAppendWindowMissing, WorkflowAppendWindowNotExternal, WorkflowAppendWindowNotOpen: no open window.
        WorkflowEmpty, DuplicateStepKey, UnknownDependency, DependencyCycle, WorkflowTooManySteps: the steps
            do not fit the run.
        WorkflowDefinitionNotFoundOrDisabled: a step's job type has no enabled definition.
        WorkflowReleaseConflict: the run is being cancelled.

    Example:
        ``more = rl.WorkflowAppend(window="collect")``, ``more.job("page-1", "crawl.page", {"n": 1})``,
        then ``rl.append_workflow_steps(engine, run.id, more, mutation_key="pages")``.
    """
    target = check_run_id(run_id)
    if not isinstance(more, WorkflowAppend):
        raise InvalidArgument("more", type(more).__name__, "a WorkflowAppend")
    _check_mutation_key(mutation_key)
    check.check_int("max_payload_bytes", max_payload_bytes, check.MAX_PAYLOAD_BYTES_RANGE)
    more.check_payload_sizes(max_payload_bytes=max_payload_bytes)
    digest = request_digest(more)
    return run_in_transaction(bind, lambda connection: _append(connection, target, more, mutation_key, digest))


def _check_mutation_key(mutation_key: Any) -> None:
    if not isinstance(mutation_key, str):
        raise InvalidArgument("mutation_key", type(mutation_key).__name__, "text")
    if not mutation_key.strip():
        raise WorkflowAppendMutationKeyBlank("mutation_key must not be blank: it names the append, so a retry "
                                             "of it changes nothing")
    check.check_text("mutation_key", mutation_key, max_length=MUTATION_KEY_MAX_LENGTH)


def request_digest(more: WorkflowAppend) -> str:
    """sha256 of the append as canonical JSON: equal for the same window and steps, whatever their dicts' order."""
    request = {"window": more.window, "steps": step_snapshots(more.steps)}
    text = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    encryption = active_encryption()
    if encryption is not None:
        # The steps' payloads are in the request: with keys, a plain hash of them could be reversed.
        return "hmac:" + encryption.keyed_hash(text)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _append(connection: Connection, target: UUID, more: WorkflowAppend, mutation_key: str,
            digest: str) -> WorkflowRunRecord:
    params = {"target_run_id": target, "mutation_key": mutation_key}
    if lock_runs_for_release(connection, {target}):
        raise WorkflowReleaseConflict(f"workflow run {target} is being cancelled", run_id=str(target))
    status = connection.execute(_RUN_STATUS, params).scalar()
    if status is None:
        raise WorkflowRunNotFound(f"workflow run {target} was not found", run_id=str(target))
    stored = connection.execute(_MUTATION_DIGEST, params).scalar()
    if stored is not None:
        if stored != digest:
            raise WorkflowAppendConflictingRetry(
                f"workflow run {target} already has an append {mutation_key!r} with different steps",
                run_id=str(target), mutation_key=mutation_key)
        return read_run(connection, target)  # type: ignore[return-value]
    if status in _ENDED_RUN:
        raise WorkflowAppendTerminalRun(f"workflow run {target} has ended ({status}); nothing can be appended",
                                        run_id=str(target))
    steps = {row.step_key: row for row in connection.execute(_RUN_STEPS, params)}
    window = _open_window(steps, more.window, target)
    key_of = {row.id: key for key, row in steps.items()}
    after: dict[str, list[str]] = {key: [] for key in steps}
    #: Each step that waits for the window, with the release mode of its edge to it.
    dependents: dict[str, str] = {}
    for edge in connection.execute(_RUN_EDGES, params):
        after[key_of[edge.step_id]].append(key_of[edge.prerequisite_step_id])
        if edge.prerequisite_step_id == window.id:
            dependents[key_of[edge.step_id]] = edge.release_mode
    more.validate_against(after, dependents)
    check_definitions(connection, more.steps)

    step_ids = {step.key: uuid7() for step in more.steps}
    ids = {key: row.id for key, row in steps.items()} | step_ids
    ended = {key: row.status for key, row in steps.items() if WorkflowStepStatus(row.status).is_terminal}
    waiting = {step.key: _waiting(step, ended) for step in more.steps}
    insert_steps(connection, target, more.steps, step_ids, waiting)
    edges = [{"step_id": step_ids[step.key], "prerequisite_step_id": ids[key], "release_mode": step.release.value}
             for step in more.steps for key in step.after]
    edges += [{"step_id": steps[key].id, "prerequisite_step_id": step_ids[step.key], "release_mode": mode}
              for key, mode in dependents.items() for step in more.steps]
    if edges:
        connection.execute(workflow_step_dependencies.insert(), edges)
    if dependents:
        connection.execute(_WAIT_FOR_MORE, {"step_ids": [steps[key].id for key in dependents],
                                            "added": len(more.steps)})
    connection.execute(workflow_run_mutations.insert().values(
        run_id=target, mutation_key=mutation_key, window_step_key=more.window,
        step_keys=[step.key for step in more.steps], request_digest=digest))

    ready = [step for step in more.steps if waiting[step.key][0] == 0]
    ends = [unsatisfied_end(step_ids[step.key]) for step in ready if waiting[step.key][1] > 0]
    ends += release_steps(connection, [(step_ids[step.key], step.kind.value) for step in ready
                                       if waiting[step.key][1] == 0], event_log=DEFAULT_EVENT_LOG)
    if ends:
        finish_steps(connection, ends, {target})
    else:
        refresh_runs(connection, {target})
    return read_run(connection, target)  # type: ignore[return-value]


def _open_window(steps: dict[str, Any], key: str, target: UUID) -> Any:
    window = steps.get(key)
    if window is None:
        raise WorkflowAppendWindowMissing(f"workflow run {target} has no step {key!r} to append at",
                                          run_id=str(target), step_key=key)
    if window.kind != WorkflowStepKind.EXTERNAL.value:
        raise WorkflowAppendWindowNotExternal(
            f"step {key!r} of workflow run {target} is a job step; append at an external step", step_key=key)
    if WorkflowStepStatus(window.status).is_terminal:
        raise WorkflowAppendWindowNotOpen(
            f"step {key!r} of workflow run {target} is {window.status}: its dependents no longer wait for it",
            step_key=key)
    return window


def _waiting(step: WorkflowStep, ended: dict[str, str]) -> tuple[int, int]:
    """(pending, unsatisfied) for a new step: a prerequisite that has ended is counted down already."""
    done = [ended[key] for key in step.after if key in ended]
    unsatisfied = 0
    if step.release is WorkflowReleaseMode.ON_SUCCESS:
        unsatisfied = sum(1 for status in done if status != WorkflowStepStatus.SUCCEEDED.value)
    return len(step.after) - len(done), unsatisfied
