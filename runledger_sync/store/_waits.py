"""Why a PENDING job is not running, in an operator's words, and the worker rows that answer "is anyone serving it".

The reasons are checked in the order a claim meets them: not due yet, its queue
paused, its concurrency key busy, its queue's global limit reached, its rate
budget spent, no live worker serving its queue and type; otherwise it is ready
and the next claim takes it.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any, Optional, Sequence
from uuid import UUID

from sqlalchemy import Text, any_, bindparam, func, literal, or_, select
from sqlalchemy.dialects.postgresql import ARRAY, insert as pg_insert
from sqlalchemy.engine import Connection

from runledger_sync.core.errors import JobNotFound
from runledger_sync.core.flow import JobWait, WaitReason
from runledger_sync.core.types import JobStatus
from runledger_sync.db.schema import job_queue, job_queues
from runledger_sync.db.schema_queues import job_queue_rate_claims, job_workers
from runledger_sync.store._binds import Bind
from runledger_sync.store._errors import run_in_transaction

#: A worker row not written for this long is a worker gone (workers write theirs every few seconds).
WORKER_SEEN_WITHIN_SECONDS = 60.0

_q = job_queue.c
_qs = job_queues.c
_r = job_queue_rate_claims.c
_w = job_workers.c
_LIVE = (JobStatus.PENDING.value, JobStatus.LEASED.value)


def _read_job(connection: Connection, job_id: UUID) -> Any:
    row = connection.execute(
        select(_q.id, _q.status, _q.queue, _q.job_type, _q.execution_resource_key, _q.blocked_by_key,
               _q.next_run_at, func.now().label("now"))
        .where(_q.id == job_id)
    ).first()
    if row is None:
        raise JobNotFound(f"no job has id {job_id}", job_id=str(job_id))
    return row


def _key_holder(connection: Connection, job: Any) -> Optional[UUID]:
    """The live job of the key that holds its turn: a running one first, else the next in line."""
    return connection.execute(
        select(_q.id)
        .where(_q.queue == job.queue, _q.execution_resource_key == job.execution_resource_key,
               _q.status.in_(_LIVE), ~_q.blocked_by_key)
        .order_by((_q.status == JobStatus.LEASED.value).desc(), _q.priority.desc(), _q.next_run_at,
                  _q.created_at, _q.id)
        .limit(1)
    ).scalar()


def _rate_wait(connection: Connection, job: Any, queue: Any) -> Optional[JobWait]:
    window = timedelta(seconds=queue.rate_limit_seconds)
    conditions = [_r.queue == job.queue, _r.claimed_at > job.now - window]
    scope = f"queue {job.queue!r}"
    if queue.rate_limit_per_key:
        conditions.append(_r.concurrency_key.is_not_distinct_from(job.execution_resource_key))
        scope = f"key {job.execution_resource_key!r} of queue {job.queue!r}"
    used, oldest = connection.execute(
        select(func.count(), func.min(_r.claimed_at)).where(*conditions)).one()
    if used < queue.rate_limit_count:
        return None
    until = oldest + window
    return JobWait(WaitReason.RATE_LIMITED,
                   f"rate limit of {scope} spent: {used} of {queue.rate_limit_count} claims in the last "
                   f"{queue.rate_limit_seconds:g} s; the next may go at {until.isoformat()}", until=until)


def _served(connection: Connection, job: Any) -> bool:
    return connection.execute(
        select(func.count()).where(
            _w.last_seen_at > func.now() - timedelta(seconds=WORKER_SEEN_WITHIN_SECONDS),
            # any_() on the right: func.any() would be written first, `any(...) = 'x'`, which is not SQL.
            or_(_w.queues.is_(None), literal(job.queue, Text) == any_(_w.queues)),
            literal(job.job_type, Text) == any_(_w.job_types),
        )
    ).scalar_one() > 0


def _explain(connection: Connection, job_id: UUID) -> Optional[JobWait]:
    job = _read_job(connection, job_id)
    if job.status != JobStatus.PENDING.value:
        return None
    if job.next_run_at > job.now:
        return JobWait(WaitReason.NOT_DUE, f"not due until {job.next_run_at.isoformat()}", until=job.next_run_at)
    queue = connection.execute(select(job_queues).where(_qs.name == job.queue)).one()
    if queue.paused:
        return JobWait(WaitReason.QUEUE_PAUSED, f"queue {job.queue!r} is paused"
                       + (f" since {queue.paused_at.isoformat()}" if queue.paused_at else ""))
    if job.blocked_by_key:
        holder = _key_holder(connection, job)
        return JobWait(WaitReason.KEY_BUSY,
                       f"concurrency key {job.execution_resource_key!r} is busy (key_limit {queue.key_limit})"
                       + (f": job {holder} holds its turn" if holder else ""), blocking_job_id=holder)
    if queue.global_limit is not None:
        leased = connection.execute(
            select(func.count()).where(_q.status == JobStatus.LEASED.value, _q.queue == job.queue)).scalar_one()
        if leased >= queue.global_limit:
            return JobWait(WaitReason.GLOBAL_LIMIT,
                           f"queue {job.queue!r} has {leased} of {queue.global_limit} jobs running (global_limit)")
    if queue.rate_limit_count is not None:
        rate = _rate_wait(connection, job, queue)
        if rate is not None:
            return rate
    if not _served(connection, job):
        return JobWait(WaitReason.NO_WORKER,
                       f"no live worker serves queue {job.queue!r} and type {job.job_type!r}")
    return JobWait(WaitReason.READY, f"ready: the next claim of a worker serving queue {job.queue!r} takes it")


def explain_wait(bind: Bind, job_id: UUID) -> Optional[JobWait]:
    """Why the job is not running, or None when it is not PENDING (it runs, or it is finished).

    Raises:
        JobNotFound: no job has this id.
    """
    return run_in_transaction(bind, lambda connection: _explain(connection, job_id))


def record_worker(bind: Bind, worker_id: str, *, queues: Optional[Sequence[str]], job_types: Sequence[str]) -> None:
    """Say that ``worker_id`` is alive and what it serves (written again every few seconds while it runs)."""
    values = {"worker_id": worker_id, "hostname": socket.gethostname(), "pid": os.getpid(),
              "queues": None if queues is None else list(queues), "job_types": list(job_types)}
    statement = pg_insert(job_workers).values(
        **{k: bindparam(k, type_=ARRAY(Text)) if k in ("queues", "job_types") else v for k, v in values.items()})
    statement = statement.on_conflict_do_update(
        index_elements=[_w.worker_id],
        set_={"queues": statement.excluded.queues, "job_types": statement.excluded.job_types,
              "last_seen_at": func.now()},
    )
    run_in_transaction(bind, lambda connection: connection.execute(
        statement, {"queues": values["queues"], "job_types": values["job_types"]}))


def forget_worker(bind: Bind, worker_id: str) -> None:
    """Remove a stopping worker's row (and the rows of workers long gone)."""
    statement = job_workers.delete().where(or_(
        _w.worker_id == worker_id,
        _w.last_seen_at < func.now() - timedelta(seconds=10 * WORKER_SEEN_WITHIN_SECONDS),
    ))
    run_in_transaction(bind, lambda connection: connection.execute(statement))

