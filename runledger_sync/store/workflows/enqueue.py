"""Enqueue a workflow run: its run row, its steps and their edges, and the jobs of its first steps (spec section 11).

One transaction writes the whole run; an idempotency key makes a second enqueue
of the same definition answer with the run already written. What a step's job
does to its step later is in :mod:`runledger_sync.store.workflows.steps`.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence
from uuid import UUID

from sqlalchemy import Text, cast, literal, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from runledger_sync.core import instrumentation
from runledger_sync.core import validation as check
from runledger_sync.core.errors import EnqueueIdempotencyUnsupportedIsolation, InvalidArgument
from runledger_sync.core.encryption import DIGEST_FIELD, active_encryption, is_digest
from runledger_sync.core.encryption_errors import EncryptionKeyMissing
from runledger_sync.core.ids import uuid7
from runledger_sync.core.meta import meta_json
from runledger_sync.core.types import DEFAULT_EVENT_LOG, EventLog
from runledger_sync.core.workflow import Workflow, WorkflowRunRecord, WorkflowStep, WorkflowStepKind
from runledger_sync.core.workflow_errors import (
    WorkflowAlreadyEnqueued,
    WorkflowDefinitionNotFoundOrDisabled,
    WorkflowEnqueueConflictingRetry,
    WorkflowLegacySnapshotMissing,
)
from runledger_sync.db.schema import job_definitions
from runledger_sync.db.schema_workflows import workflow_runs, workflow_step_dependencies, workflow_steps
from runledger_sync.store.batches.members import check_batch_id, lock_open_batches
from runledger_sync.store.binds import Bind
from runledger_sync.store.sealing import sealed_object
from runledger_sync.store.enqueue.chunk import same_request
from runledger_sync.store.sql import event_log_params
from runledger_sync.store.transactions import require_read_committed, run_in_transaction
from runledger_sync.store.workflows.runs import read_run
from runledger_sync.store.workflows.steps import finish_steps, refresh_runs, release_steps

_r = workflow_runs.c


def enqueue_workflow(
    bind: Bind, workflow: Workflow, *, max_payload_bytes: int = check.DEFAULT_MAX_PAYLOAD_BYTES,
    event_log: EventLog | str = DEFAULT_EVENT_LOG, batch: Optional[UUID | str] = None,
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
        batch: the id of an OPEN batch (:func:`runledger_sync.open_batch`) the run joins as
            ONE member, pending until the run ends: counted succeeded when the run
            SUCCEEDED, failed when it COMPLETED_WITH_ERRORS, canceled when CANCELED.
            Its step jobs are not members themselves (they are released after the
            batch may have closed), and their ``ctx.batch_id`` is None: a step reads
            its batch through its run.

    Returns:
        The run with its steps.

    Raises:
        WorkflowEmpty, DuplicateStepKey, UnknownDependency, DependencyCycle: a bad definition.
        WorkflowTooManySteps: more than 10,000 steps.
        InvalidPayload: a step's payload is larger than ``max_payload_bytes`` (the error names the step).
        WorkflowTooLarge: the step payloads together are larger than 64 MiB of JSON.
        WorkflowDefinitionNotFoundOrDisabled: a step's job type has no enabled definition.
        WorkflowEnqueueConflictingRetry: the key exists with a different request (another batch too).
        BatchNotFound, BatchClosed: ``batch`` names no batch, or one not OPEN; nothing written.

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
    batch_id = None if batch is None else check_batch_id(batch)
    snapshot = _request_snapshot(workflow, batch_id)
    # Drawn before the first try: a try repeated after a lost connection (its transaction
    # rolled back) writes the same run, and the enqueue observers hear of it once.
    run_id = uuid7()
    meta = meta_json(instrumentation.observed_meta(workflow.name, str(run_id), workflow.meta)
                     if instrumentation.enqueue_observers else workflow.meta)
    return run_in_transaction(bind, lambda connection: _enqueue(connection, workflow, snapshot, run_id, meta, event_log,
                                                                batch_id))


def _request_snapshot(workflow: Workflow, batch_id: Optional[UUID]) -> str:
    request: dict[str, Any] = {"name": workflow.name, "steps": step_snapshots(workflow.steps)}
    # Only when set: the snapshots of runs enqueued before runs could join batches stay equal.
    if batch_id is not None:
        request["batch"] = str(batch_id)
    return check.serialize_json("workflow", request)


def _stored(snapshot: str) -> str:
    """The snapshot as stored: with keys, its keyed digest (the steps' payloads are in it)."""
    encryption = active_encryption()
    return snapshot if encryption is None else encryption.digest(snapshot)


def step_snapshots(steps: Sequence[WorkflowStep]) -> list[dict[str, Any]]:
    """The steps as a request compares them on a retry (an enqueue's or an append's)."""
    return [
        {"key": step.key, "kind": step.kind.value, "job_type": step.job_type, "payload": step.payload,
         "after": list(step.after), "release": step.release.value, "priority": step.priority,
         "max_attempts": step.max_attempts, "timeout_seconds": step.timeout_seconds}
        # Only when set: the snapshots of runs enqueued before steps could opt in stay equal.
        | ({"continuation": True} if step.continuation else {})
        for step in steps
    ]


def _enqueue(connection: Connection, workflow: Workflow, snapshot: str, run_id: UUID, meta: str,
             event_log: Any, batch_id: Optional[UUID]) -> WorkflowRunRecord:
    if workflow.idempotency_key is not None:
        require_read_committed(connection, EnqueueIdempotencyUnsupportedIsolation, "idempotent enqueue")
    check_definitions(connection, workflow.steps)
    if batch_id is not None:
        # The run's insert counts it (runledger_sync.db.schema_batches); this refuses first, with a code.
        lock_open_batches(connection, [batch_id])
    inserted = connection.execute(
        pg_insert(workflow_runs)
        .values(id=run_id, name=workflow.name, organization_id=workflow.organization_id,
                idempotency_key=workflow.idempotency_key, meta=cast(literal(meta, Text), JSONB), batch_id=batch_id,
                enqueue_request=None if workflow.idempotency_key is None else cast(literal(_stored(snapshot), Text), JSONB))
        .on_conflict_do_nothing()
        .returning(_r.id)
    ).first()
    if inserted is None:
        return _existing_run(connection, workflow, snapshot)
    step_ids = {step.key: uuid7() for step in workflow.steps}
    insert_steps(connection, run_id, workflow.steps, step_ids, {step.key: (len(step.after), 0) for step in workflow.steps})
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


def insert_steps(connection: Connection, run_id: UUID, steps: Sequence[WorkflowStep], step_ids: Mapping[str, UUID],
                 waiting: Mapping[str, tuple[int, int]]) -> None:
    """Write the rows of ``steps``; ``waiting`` gives each key its (pending, unsatisfied) dependency counts."""
    connection.execute(workflow_steps.insert(), [
        {"id": step_ids[step.key], "run_id": run_id, "step_key": step.key, "kind": step.kind.value,
         "job_type": step.job_type,
         # Sealed for the step's id, which its job takes when the step is released.
         "payload": None if step.kind is WorkflowStepKind.EXTERNAL else sealed_object(
             step.payload, check.serialize_json("payload", step.payload), step_ids[step.key]),
         "priority": step.priority, "max_attempts": step.max_attempts, "timeout_seconds": step.timeout_seconds,
         "allow_continuation": step.continuation, "dependencies_total": len(step.after),
         "dependencies_pending": waiting[step.key][0], "dependencies_unsatisfied": waiting[step.key][1]}
        for step in steps
    ])


def check_definitions(connection: Connection, steps: Sequence[WorkflowStep]) -> None:
    """Raise unless every job type of ``steps`` has an enabled definition."""
    job_types = {step.job_type for step in steps if step.job_type is not None}
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


def _same_snapshot(stored: Any, snapshot: str) -> bool:
    if not is_digest(stored):
        return same_request(stored, snapshot)
    encryption = active_encryption()
    if encryption is None:
        raise EncryptionKeyMissing(f"encryption key {stored[DIGEST_FIELD][0]} missing", key_id=stored[DIGEST_FIELD][0])
    return encryption.same_digest(stored, snapshot)


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
    if not _same_snapshot(existing.enqueue_request, snapshot):
        raise WorkflowEnqueueConflictingRetry(
            f"workflow {workflow.name!r} with idempotency key {workflow.idempotency_key!r} exists with a different "
            "definition", run_id=str(existing.id))
    return read_run(connection, existing.id)  # type: ignore[return-value]
