"""Queues: their settings (pause, limits), what waits in them, and why a job waits.

The settings are rows of ``job_queues``, read by every claim: a pause or a new
limit holds from the next claim of every worker. The rules themselves are in
:mod:`runledger_sync.core.flow`, the claim's use of them in
:mod:`runledger_sync.store.claim.flow`, and the concurrency-key turns in the
key trigger (:mod:`runledger_sync.db.schema_queues`).

Why a PENDING job is not running (:func:`explain_wait`) is checked in the order
a claim meets the reasons: not due yet, its queue paused, its concurrency key
busy, its queue's global limit reached, its rate budget spent, no live worker
serving its queue and type; otherwise it is ready and the next claim takes it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Iterable, Optional
from uuid import UUID

from sqlalchemy import BigInteger, Integer, Text, and_, bindparam, case, func, literal, or_, select, text, union_all
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from runledger_sync.core.errors import JobNotFound
from runledger_sync.core.flow import (
    JobWait,
    WaitReason,
    QueueLoad,
    QueueRecord,
    QueueSpec,
    RateLimit,
    check_optional_limit,
    check_optional_rate_limit,
    check_queue_name,
)
from runledger_sync.core.queue_errors import QueueNotFound
from runledger_sync.core.states import JobStatus
from runledger_sync.core.types import JobEventType
from runledger_sync.db.schema import job_definitions, job_events, job_queue, job_queues
from runledger_sync.db.schema_queues import KEY_LOCK, job_queue_rate_claims
from runledger_sync.store.binds import Bind
from runledger_sync.store.transactions import run_in_transaction
from runledger_sync.store.notify import CHANNEL
from runledger_sync.store.scope import status_is
from runledger_sync.store.workers import serves

_qs = job_queues.c
_q = job_queue.c
_e = job_events.c
_r = job_queue_rate_claims.c
_LIVE = (JobStatus.PENDING.value, JobStatus.LEASED.value)

#: An argument left out of :func:`configure_queue`: its setting stays as it is.
UNCHANGED: Any = object()

_QUEUE_COLUMNS = (
    _qs.name, _qs.paused, _qs.global_limit, _qs.key_limit, _qs.rate_limit_count, _qs.rate_limit_seconds,
    _qs.rate_limit_per_key, _qs.paused_at, _qs.created_at, _qs.updated_at,
)


def to_queue(row: Any) -> QueueRecord:
    rate = None
    if row.rate_limit_count is not None:
        rate = RateLimit(row.rate_limit_count, row.rate_limit_seconds, row.rate_limit_per_key)
    return QueueRecord(row.name, row.paused, row.global_limit, row.key_limit, rate, row.paused_at, row.created_at,
                       row.updated_at)


def _setting_values(global_limit: Any, key_limit: Any, rate_limit: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if global_limit is not UNCHANGED:
        values["global_limit"] = check_optional_limit("global_limit", global_limit)
    if key_limit is not UNCHANGED:
        values["key_limit"] = check_optional_limit("key_limit", key_limit)
    if rate_limit is not UNCHANGED:
        rate = check_optional_rate_limit(rate_limit)
        values["rate_limit_count"] = None if rate is None else rate.count
        values["rate_limit_seconds"] = None if rate is None else rate.per_seconds
        values["rate_limit_per_key"] = False if rate is None else rate.per_key
    return values


def _build_release_keys() -> Any:
    """A higher key limit (or none) lets held-back jobs of every key of the queue go.

    As many per key as the new limit leaves room for, in claim order, under the
    key lock every settling of a key takes (db.schema_queues); one another
    transaction holds (being canceled) is left to its key's next settling.
    """
    key_limit = bindparam("key_limit", type_=Integer)
    keyed = and_(_q.queue == bindparam("queue_name", type_=Text), _q.execution_resource_key.is_not(None))
    claim_order = (_q.priority.desc(), _q.next_run_at, _q.created_at, _q.id)
    live = (
        select(_q.execution_resource_key.label("k"), func.count().label("n"))
        .where(keyed, _q.status.in_([JobStatus.PENDING.value, JobStatus.LEASED.value]), ~_q.blocked_by_key)
        .group_by(_q.execution_resource_key)
        .cte("live")
    )
    waiting = (
        select(_q.id, _q.execution_resource_key.label("k"),
               func.row_number().over(partition_by=_q.execution_resource_key, order_by=claim_order).label("nth"))
        .where(keyed, _q.status == JobStatus.PENDING.value, _q.blocked_by_key)
        .cte("waiting")
    )
    within = (
        select(waiting.c.id)
        .select_from(waiting.outerjoin(live, live.c.k == waiting.c.k))
        .where(or_(key_limit.is_(None), waiting.c.nth <= key_limit - func.coalesce(live.c.n, 0)))
    )
    chosen = (
        select(_q.id)
        .where(_q.id.in_(within), _q.status == JobStatus.PENDING.value, _q.blocked_by_key)
        .order_by(_q.execution_resource_key, *claim_order)
        # Under the key lock nothing is waited for (see db.schema_queues): a job
        # another transaction holds is left to the key's next settling.
        .with_for_update(skip_locked=True)
        .cte("chosen")
    )
    return job_queue.update().where(_q.id.in_(select(chosen.c.id))).values(blocked_by_key=False, updated_at=func.now())


# Plain SQL text would not follow the engine's schema (schema_translate_map rewrites only tables).
_RELEASE_KEYS = _build_release_keys()


def configure_queue(
    bind: Bind, name: str, *, global_limit: Any = UNCHANGED, key_limit: Any = UNCHANGED, rate_limit: Any = UNCHANGED,
) -> QueueRecord:
    """Create the queue, or change its limits; an argument left out keeps its setting, None removes the limit.

    Every worker applies the new settings from its next claim; a queue's first
    global or rate limit within a second (until then its jobs wait). A higher
    ``key_limit`` lets held-back jobs of each key go at once.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        global_limit: at most this many of the queue's jobs LEASED at once, across workers.
        key_limit: at most this many live jobs per concurrency key (a new queue: 1).
        rate_limit: an :class:`~runledger_sync.core.flow.RateLimit`.

    Raises:
        InvalidQueueName, InvalidQueueSetting: a bad name or setting; nothing written.

    Example:
        ``rl.configure_queue(engine, "payments", global_limit=8, rate_limit=rl.RateLimit(100, per_seconds=60))``
    """
    check_queue_name(name, "name")
    values = _setting_values(global_limit, key_limit, rate_limit)
    insert = pg_insert(job_queues).values(name=name, **values)
    statement = (
        insert.on_conflict_do_update(index_elements=[_qs.name], set_={**values, "updated_at": func.now()})
        if values else insert.on_conflict_do_nothing()
    )

    def work(connection: Connection) -> QueueRecord:
        connection.execute(statement)
        queue = _read(connection, name)
        if "key_limit" in values:
            connection.execute(text(KEY_LOCK))
            connection.execute(_RELEASE_KEYS, {"queue_name": name, "key_limit": queue.key_limit})
        return queue

    return run_in_transaction(bind, work)


def _read(connection: Connection, name: str) -> QueueRecord:
    row = connection.execute(select(*_QUEUE_COLUMNS).where(_qs.name == name)).first()
    if row is None:
        raise QueueNotFound(f"no queue is named {name!r}; declare it with registry.queue() and sync, or create it "
                            "with configure_queue()", queue=name)
    return to_queue(row)


def _set_paused(bind: Bind, name: str, paused: bool) -> QueueRecord:
    check_queue_name(name, "name")
    statement = (
        job_queues.update().where(_qs.name == name)
        .values(paused=paused, paused_at=func.now() if paused else None)
        .returning(*_QUEUE_COLUMNS)
    )
    # Idle workers wake for the queue's types (by their definitions) instead of
    # waiting out their poll interval.
    wake = select(func.count(func.pg_notify(CHANNEL, job_definitions.c.job_type))).where(
        job_definitions.c.queue == bindparam("queue", type_=Text))

    def work(connection: Connection) -> QueueRecord:
        row = connection.execute(statement).first()
        if row is None:
            return _read(connection, name)  # raises QueueNotFound
        if not paused:
            connection.execute(wake, {"queue": name})
        return to_queue(row)

    return run_in_transaction(bind, work)


def pause_queue(bind: Bind, name: str) -> QueueRecord:
    """Stop every worker from claiming the queue's jobs; running ones finish, enqueue still works.

    Raises:
        QueueNotFound: no queue has this name.
    """
    return _set_paused(bind, name, True)


def resume_queue(bind: Bind, name: str) -> QueueRecord:
    """Let workers claim the queue's jobs again (idle workers are woken at once).

    Raises:
        QueueNotFound: no queue has this name.
    """
    return _set_paused(bind, name, False)


def get_queue(bind: Bind, name: str) -> QueueRecord:
    """One queue's settings.

    Raises:
        QueueNotFound: no queue has this name.
    """
    check_queue_name(name, "name")
    return run_in_transaction(bind, lambda connection: _read(connection, name))


def list_queues(bind: Bind) -> list[QueueRecord]:
    """Every queue's settings, by name."""
    statement = select(*_QUEUE_COLUMNS).order_by(_qs.name)
    return run_in_transaction(bind, lambda connection: [to_queue(row) for row in connection.execute(statement)])


def sync_queues(bind: Bind, declared: Iterable[QueueSpec]) -> list[QueueRecord]:
    """Write the queues code declares: their limits (a pause an operator set is kept)."""
    specs = [spec.checked() for spec in declared]

    def work(connection: Connection) -> list[QueueRecord]:
        for spec in specs:
            values = _setting_values(spec.global_limit, spec.key_limit, spec.rate_limit)
            connection.execute(
                pg_insert(job_queues).values(name=spec.name, **values)
                .on_conflict_do_update(index_elements=[_qs.name], set_={**values, "updated_at": func.now()})
            )
            connection.execute(text(KEY_LOCK))
            connection.execute(_RELEASE_KEYS, {"queue_name": spec.name, "key_limit": spec.key_limit})
        rows = connection.execute(select(*_QUEUE_COLUMNS).where(_qs.name.in_([s.name for s in specs])).order_by(_qs.name))
        return [to_queue(row) for row in rows]

    return run_in_transaction(bind, work) if specs else []


def _read_job(connection: Connection, job_id: UUID) -> Any:
    row = connection.execute(
        select(_q.id, _q.status, _q.queue, _q.job_type, _q.execution_resource_key, _q.blocked_by_key,
               _q.next_run_at, _q.run_number, func.now().label("now"))
        .where(_q.id == job_id)
    ).first()
    if row is None:
        raise JobNotFound(f"no job has id {job_id}", job_id=str(job_id))
    return row


def _missing_key(connection: Connection, job: Any) -> Optional[str]:
    """``encryption key <id> missing`` when the run's last event is a worker handing the claim back for that."""
    reason = connection.execute(
        select(_e.event_type, _e.payload["reason"].astext)
        .where(_e.job_id == job.id, _e.run_number == job.run_number)
        .order_by(_e.id.desc()).limit(1)
    ).first()
    if reason is None or reason[0] != JobEventType.REQUEUED.value or not reason[1]:
        return None
    return reason[1] if reason[1].startswith("encryption key ") and reason[1].endswith(" missing") else None


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


def _explain(connection: Connection, job_id: UUID) -> Optional[JobWait]:
    job = _read_job(connection, job_id)
    if job.status != JobStatus.PENDING.value:
        return None
    missing = _missing_key(connection, job)
    if missing is not None:
        return JobWait(WaitReason.ENCRYPTION_KEY_MISSING,
                       f"{missing}: a worker without it handed the claim back; give a worker the key "
                       f"(next try not before {job.next_run_at.isoformat()})", until=job.next_run_at)
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
    if not serves(connection, job.queue, job.job_type):
        return JobWait(WaitReason.NO_WORKER,
                       f"no live worker serves queue {job.queue!r} and type {job.job_type!r}")
    return JobWait(WaitReason.READY, f"ready: the next claim of a worker serving queue {job.queue!r} takes it")


def explain_wait(bind: Bind, job_id: UUID) -> Optional[JobWait]:
    """Why the job is not running, or None when it is not PENDING (it runs, or it is finished).

    Raises:
        JobNotFound: no job has this id.
    """
    return run_in_transaction(bind, lambda connection: _explain(connection, job_id))


def _build_loads() -> Any:
    # Read on every scrape, stats and top frame: each part names one status as a
    # constant, so it reads a partial index of the unfinished rows (as the gauges by
    # job type do), never the finished jobs that make up most of the table.
    due = _q.next_run_at <= func.now()
    none = literal(0, BigInteger)
    pending = (
        select(_q.queue, func.count().filter(due, ~_q.blocked_by_key).label("ready"),
               func.count().filter(due, _q.blocked_by_key).label("blocked_by_key"),
               func.count().filter(~due).label("scheduled"), none.label("leased"))
        .where(status_is(JobStatus.PENDING)).group_by(_q.queue)
    )
    leased = (
        select(_q.queue, none, none, none, func.count())
        .where(status_is(JobStatus.LEASED)).group_by(_q.queue)
    )
    parts = union_all(pending, leased).subquery("parts")
    counts = (
        select(parts.c.queue, *(func.sum(parts.c[name]).label(name)
                                for name in ("ready", "blocked_by_key", "scheduled", "leased")))
        .group_by(parts.c.queue)
        .subquery("counts")
    )
    r = job_queue_rate_claims.c
    rate_used = (
        select(func.count()).select_from(job_queue_rate_claims)
        .where(r.queue == _qs.name,
               r.claimed_at > func.now() - func.make_interval(0, 0, 0, 0, 0, 0, _qs.rate_limit_seconds))
        .scalar_subquery()
    )
    zero = func.coalesce
    return (
        select(
            *_QUEUE_COLUMNS,
            zero(counts.c.ready, 0).label("ready"), zero(counts.c.blocked_by_key, 0).label("blocked"),
            zero(counts.c.scheduled, 0).label("scheduled"), zero(counts.c.leased, 0).label("leased"),
            case((_qs.rate_limit_count.is_(None), 0), else_=rate_used).label("rate_used"),
        )
        .select_from(job_queues.outerjoin(counts, counts.c.queue == _qs.name))
        .order_by(_qs.name)
    )


_LOADS = _build_loads()


def queue_loads(bind: Bind) -> list[QueueLoad]:
    """Every queue with its settings and what waits in it now (ready, held by a key, scheduled, leased)."""

    def work(connection: Connection) -> list[QueueLoad]:
        return [
            QueueLoad(to_queue(row), int(row.ready), int(row.blocked), int(row.scheduled), int(row.leased),
                      int(row.rate_used))
            for row in connection.execute(_LOADS)
        ]

    return run_in_transaction(bind, work)


__all__ = [
    "explain_wait",
    "UNCHANGED",
    "configure_queue",
    "get_queue",
    "list_queues",
    "pause_queue",
    "queue_loads",
    "resume_queue",
    "sync_queues",
]
