"""Batches: open one, close it, read it, list them, cancel one (runledger_sync.core.batch).

A batch's counts and its finish are the schema's (:mod:`runledger_sync.db.schema_batches`):
every write here is one short statement on the batch row, and the triggers do the
rest in the same transaction. Members join through any enqueue with ``batch=``.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Mapping, Optional
from uuid import UUID

from sqlalchemy import Text, bindparam, cast, func, literal, select, tuple_
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.engine import Connection, Row

from runledger_sync.core import validation as check
from runledger_sync.core.batch import (
    CALLBACK_BATCH_ID_KEY,
    BatchCallback,
    BatchRecord,
    BatchStatus,
    check_callback,
    with_batch_id,
)
from runledger_sync.core.batch_errors import BatchClosed, BatchFinished, BatchNotFound
from runledger_sync.core.encryption import active_encryption
from runledger_sync.core.errors import DefinitionNotFoundOrDisabled, InvalidArgument, JobStateError
from runledger_sync.core.ids import uuid7
from runledger_sync.core.meta import meta_json
from runledger_sync.core.records import JobRecord
from runledger_sync.core.workflow import WorkflowRunRecord, WorkflowRunStatus
from runledger_sync.db.schema import job_definitions, job_queue
from runledger_sync.db.schema_batches import job_batches
from runledger_sync.db.schema_workflows import workflow_runs
from runledger_sync.store.admin.actions import CANCELABLE, cancel_statement, written_jobs
from runledger_sync.store.batches.members import check_batch_id
from runledger_sync.store.binds import Bind
from runledger_sync.store.sealing import opened, sealed
from runledger_sync.store.rows import JOB_COLUMNS, to_job
from runledger_sync.store.transactions import run_in_transaction
from runledger_sync.store.workflows.actions import cancel_run
from runledger_sync.store.workflows.runs import RUN_COLUMNS, run_record

_b = job_batches.c
_q = job_queue.c
_BATCH_COLUMNS = (*job_batches.c, select(func.count()).where(workflow_runs.c.batch_id == _b.id)
                  .correlate(job_batches).scalar_subquery().label("runs"))
_OPEN_OR_CLOSED = (BatchStatus.OPEN.value, BatchStatus.CLOSED.value)
_BATCH_ID = bindparam("target_batch", type_=PG_UUID(as_uuid=True))
_READ = select(*_BATCH_COLUMNS).where(_b.id == _BATCH_ID)


def batch_record(row: Row[Any]) -> BatchRecord:
    """A job_batches row as a record (a callback job id shows once the batch finished and enqueued it)."""
    status = BatchStatus(row.status)
    finished = status in (BatchStatus.SUCCEEDED, BatchStatus.COMPLETED_WITH_ERRORS)
    return BatchRecord(
        id=row.id, status=status, total=row.total, pending=row.pending, succeeded=row.succeeded,
        failed=row.failed, canceled=row.canceled, meta=row.meta,
        on_success=_callback(row.on_success_type, row.on_success_payload, row.on_success_job_id),
        on_complete=_callback(row.on_complete_type, row.on_complete_payload, row.on_complete_job_id),
        on_success_job_id=row.on_success_job_id if status is BatchStatus.SUCCEEDED else None,
        on_complete_job_id=row.on_complete_job_id if finished else None,
        status_reason=row.status_reason, created_at=row.created_at, closed_at=row.closed_at,
        finished_at=row.finished_at, runs=row.runs,
    )


def _callback(job_type: Optional[str], payload: Any, job_id: Optional[UUID]) -> Optional[BatchCallback]:
    """A callback as given to open_batch: opened where it was sealed (or a SealedValue naming the missing key)."""
    if job_type is None:
        return None
    opened_payload = opened(payload, job_id)
    if isinstance(opened_payload, dict) and payload is not opened_payload:
        # Sealed with the batch id the trigger adds to a clear one: shown as it was given.
        opened_payload = {key: value for key, value in opened_payload.items() if key != CALLBACK_BATCH_ID_KEY}
    return BatchCallback(job_type, opened_payload)


def _sealed_payload(payload_json: str, batch_id: UUID, job_id: UUID) -> Any:
    """A callback's payload as stored: clear (the finish trigger adds the batch id), or sealed with it for its job."""
    if active_encryption() is None:
        return cast(literal(payload_json, Text), JSONB)
    return cast(literal(sealed(with_batch_id(payload_json, batch_id), job_id), Text), JSONB)


def read_batch(connection: Connection, batch_id: UUID) -> Optional[BatchRecord]:
    row = connection.execute(_READ, {"target_batch": batch_id}).first()
    return None if row is None else batch_record(row)


def open_batch(
    bind: Bind,
    *,
    on_success: Any = None,
    on_complete: Any = None,
    meta: Optional[Mapping[str, str]] = None,
    max_payload_bytes: int = check.DEFAULT_MAX_PAYLOAD_BYTES,
) -> BatchRecord:
    """Open a batch: a group of jobs that ends once, and then enqueues its callbacks.

    Add members with ``batch=batch.id`` on any enqueue while the batch is OPEN
    (from a member's handler too), then :func:`close_batch`. When the batch is
    closed and its last member ends, the transaction that ends it enqueues
    ``on_success`` (only if every member succeeded) and ``on_complete`` (always),
    each exactly once. Each callback's payload gets ``"batch_id"``: the batch's id.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        on_success: ``(job_type, payload)`` (a JSON object), or None.
        on_complete: ``(job_type, payload)``, or None.
        meta: text keys to text values kept with the batch; its callback jobs are enqueued with them.

    Returns:
        The OPEN batch.

    Raises:
        InvalidBatchCallback: a callback is not a (job type, JSON object) pair, or its payload has ``batch_id``.
        InvalidMeta, InvalidPayload: bad meta, or a callback payload over ``max_payload_bytes``.
        DefinitionNotFoundOrDisabled: a callback's job type has no enabled definition.

    Example:
        ``batch = rl.open_batch(engine, on_success=("report.send", {"to": "ops@example.com"}))``
    """
    success = check_callback("on_success", on_success, max_payload_bytes=max_payload_bytes)
    complete = check_callback("on_complete", on_complete, max_payload_bytes=max_payload_bytes)
    batch_id = uuid7()
    values: dict[str, Any] = {"id": batch_id, "meta": cast(literal(meta_json(meta), Text), JSONB)}
    for name, checked in (("on_success", success), ("on_complete", complete)):
        if checked is not None:
            callback, payload_json = checked
            job_id = uuid7()
            values |= {f"{name}_type": callback.job_type, f"{name}_job_id": job_id,
                       f"{name}_payload": _sealed_payload(payload_json, batch_id, job_id)}
    job_types = {checked[0].job_type for checked in (success, complete) if checked is not None}

    def work(connection: Connection) -> BatchRecord:
        _require_definitions(connection, job_types)
        row = connection.execute(job_batches.insert().values(values).returning(*_BATCH_COLUMNS)).one()
        return batch_record(row)

    return run_in_transaction(bind, work)


def _require_definitions(connection: Connection, job_types: set[str]) -> None:
    if not job_types:
        return
    enabled = set(connection.execute(
        select(job_definitions.c.job_type).where(job_definitions.c.job_type.in_(sorted(job_types)),
                                                 job_definitions.c.is_enabled)).scalars())
    missing = sorted(job_types - enabled)
    if missing:
        raise DefinitionNotFoundOrDisabled(
            f"callback job type {missing[0]!r} has no enabled definition; register its handler and call "
            "registry.sync_definitions(engine), or enable it", job_types=missing)


_CLOSE = (
    job_batches.update()
    .where(_b.id == _BATCH_ID, _b.status == BatchStatus.OPEN.value)
    .values(status=BatchStatus.CLOSED.value, closed_at=func.now())
    .returning(*_BATCH_COLUMNS)
)


def close_batch(bind: Bind, batch_id: UUID | str) -> BatchRecord:
    """Say no more members will come; the batch finishes when its last pending member ends.

    A batch whose members have all ended (or that has none) finishes here, and
    its callbacks are enqueued in this transaction.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).

    Returns:
        The batch: CLOSED, or SUCCEEDED / COMPLETED_WITH_ERRORS when it finished here.

    Raises:
        BatchNotFound: no such batch.
        BatchClosed: the batch is not OPEN (closed, finished or canceled).
    """
    target = check_batch_id(batch_id, "batch_id")

    def work(connection: Connection) -> BatchRecord:
        row = connection.execute(_CLOSE, {"target_batch": target}).first()
        if row is None:
            raise _not_open(connection, target, BatchClosed, "cannot be closed")
        # The finish trigger ran after this row: read what it left.
        return read_batch(connection, target)  # type: ignore[return-value]

    return run_in_transaction(bind, work)


def _not_open(connection: Connection, batch_id: UUID, error: type[JobStateError], what: str) -> JobStateError:
    """Why a write guarded on the batch's status changed nothing: no such batch, or ``error``."""
    found = read_batch(connection, batch_id)
    if found is None:
        return BatchNotFound(f"batch {batch_id} was not found", batch_id=str(batch_id))
    return error(f"batch {batch_id} is {found.status.value} and {what}", batch_id=str(batch_id),
                 status=found.status.value)


def get_batch(bind: Bind, batch_id: UUID | str) -> Optional[BatchRecord]:
    """Return the batch with its counts, or None.

    Args:
        bind: an Engine, or a Connection, ORM Session or psycopg (2 or 3) connection.
    """
    target = check_batch_id(batch_id, "batch_id")
    return run_in_transaction(bind, lambda connection: read_batch(connection, target), one_query=True)


def list_batches(
    bind: Bind,
    *,
    status: Optional[BatchStatus | str] = None,
    limit: int = 100,
    before: Optional[BatchRecord] = None,
) -> list[BatchRecord]:
    """Return batches newest first.

    Args:
        status: only batches in this status.
        before: the last batch of the previous page: only older ones (by ``created_at``, then ``id``).
    """
    check.check_int("limit", limit, check.LIMIT_RANGE)
    conditions = []
    if status is not None:
        try:
            conditions.append(_b.status == BatchStatus(status).value)
        except ValueError:
            raise InvalidArgument("status", status, f"one of {', '.join(s.value for s in BatchStatus)}") from None
    if before is not None:
        if not isinstance(before, BatchRecord):
            raise InvalidArgument("before", type(before).__name__, "a BatchRecord")
        conditions.append(tuple_(_b.created_at, _b.id) < tuple_(before.created_at, before.id))
    statement = select(*_BATCH_COLUMNS).where(*conditions).order_by(_b.created_at.desc(), _b.id.desc()).limit(limit)
    return run_in_transaction(bind, lambda connection: [batch_record(row) for row in connection.execute(statement)])


def list_batch_members(bind: Bind, batch_id: UUID | str, *, limit: int = 100,
                       after: Optional[JobRecord] = None) -> list[JobRecord]:
    """Return a batch's members in the order they were added.

    Args:
        after: the last member of the previous page: only later ones.
    """
    target = check_batch_id(batch_id, "batch_id")
    check.check_int("limit", limit, check.LIMIT_RANGE)
    conditions = [_q.batch_id == target]
    if after is not None:
        conditions.append(tuple_(_q.created_at, _q.id) > tuple_(after.created_at, after.id))
    statement = select(*JOB_COLUMNS).where(*conditions).order_by(_q.created_at, _q.id).limit(limit)
    return run_in_transaction(bind, lambda connection: [to_job(row) for row in connection.execute(statement)])


def list_batch_runs(bind: Bind, batch_id: UUID | str, *, limit: int = 100,
                    after: Optional[WorkflowRunRecord] = None) -> list[WorkflowRunRecord]:
    """Return a batch's member workflow runs in the order they were added, without their steps.

    Args:
        after: the last run of the previous page: only later ones.
    """
    target = check_batch_id(batch_id, "batch_id")
    check.check_int("limit", limit, check.LIMIT_RANGE)
    _r = workflow_runs.c
    conditions = [_r.batch_id == target]
    if after is not None:
        conditions.append(tuple_(_r.created_at, _r.id) > tuple_(after.created_at, after.id))
    statement = select(*RUN_COLUMNS).where(*conditions).order_by(_r.created_at, _r.id).limit(limit)
    return run_in_transaction(bind, lambda connection: [run_record(row) for row in connection.execute(statement)])


_MARK_CANCELED = (
    job_batches.update()
    .where(_b.id == _BATCH_ID, _b.status.in_(_OPEN_OR_CLOSED))
    .values(status=BatchStatus.CANCELED.value, finished_at=func.now(),
            status_reason=func.coalesce(bindparam("reason", type_=Text), "CANCELED"))
    .returning(_b.id)
)


# An operator's cancel of each pending member, the statement cancel_job and cancel_jobs
# write (LEASED ones are told through the canceled channel): every member row is
# locked, in id order, before the batch row is counted, the order a worker's outcome
# write takes them in.
_CANCEL_MEMBERS = cancel_statement(picked=(
    select(_q.id).where(_q.batch_id == _BATCH_ID, _q.status.in_(CANCELABLE)).order_by(_q.id).with_for_update()
))
_PENDING_RUNS = (
    select(workflow_runs.c.id)
    .where(workflow_runs.c.batch_id == _BATCH_ID,
           workflow_runs.c.status.in_((WorkflowRunStatus.RUNNING.value, WorkflowRunStatus.WAITING_FOR_EXTERNAL.value)))
    .order_by(workflow_runs.c.created_at, workflow_runs.c.id)
)


def cancel_batch(bind: Bind, batch_id: UUID | str, reason: Optional[str] = None) -> BatchRecord:
    """Cancel a batch: it takes no more members, its pending members are canceled, no callback is enqueued.

    A member workflow run still running is canceled as :func:`runledger_sync.cancel_workflow_run`
    cancels it (its steps not started are canceled; a step's job a worker holds runs to its end).

    A LEASED member gets an operator's cancel, as :func:`runledger_sync.cancel_job`
    gives it: its worker tells the handler, and its outcome is not written. The
    batch is marked CANCELED first, in a transaction of its own, so that no
    member ending meanwhile can finish it; its members are then canceled in one
    statement. Calling it again on a CANCELED batch cancels any member left pending.

    Args:
        bind: an Engine. A Connection's transaction takes both steps, holding the batch's row
            while it cancels the members: a worker ending one of them then waits for it.
        reason: kept as the batch's and the members' ``status_reason`` (default ``CANCELED``).

    Returns:
        The CANCELED batch, with its counts.

    Raises:
        BatchNotFound: no such batch.
        BatchFinished: the batch already finished (SUCCEEDED or COMPLETED_WITH_ERRORS).
    """
    target = check_batch_id(batch_id, "batch_id")
    if reason is not None:
        check.check_text("reason", reason, max_length=255)
    params = {"target_batch": target, "reason": reason}

    def mark(connection: Connection) -> None:
        if connection.execute(_MARK_CANCELED, params).first() is None:
            found = read_batch(connection, target)
            if found is None or found.status is not BatchStatus.CANCELED:
                raise _not_open(connection, target, BatchFinished, "cannot be canceled")

    run_in_transaction(bind, mark)

    # Each member run through the workflow cancel, in a transaction of its own: a run's
    # row is locked before the batch row, as a step's end takes them, and none is held
    # while the next run's is waited for.
    def pending_runs(connection: Connection) -> list[UUID]:
        return list(connection.execute(_PENDING_RUNS, params).scalars())

    for run_id in run_in_transaction(bind, pending_runs):
        run_in_transaction(bind, partial(cancel_run, run_id=run_id, reason=reason))

    def cancel_members(connection: Connection) -> BatchRecord:
        written_jobs(connection, _CANCEL_MEMBERS, params)
        return read_batch(connection, target)  # type: ignore[return-value]

    return run_in_transaction(bind, cancel_members)
