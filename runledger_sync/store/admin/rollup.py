"""The dashboard's rollup: sample each closed minute into job_rollup_minutes, read a range of it back.

The sample is one short transaction that reads only indexes:

- attempts finished in the minute are the outcome events written with them
  (SUCCEEDED, RETRY_SCHEDULED, DEAD_LETTERED, CANCELED), a range of
  idx_job_events_type_occurred per event type, each joined to its job by the
  primary key for the queue; so it reads the minute's events and nothing older;
- what waits now is the claimable PENDING jobs due by the sample's clock,
  per queue, from idx_job_queue_claim (partial on exactly those rows).

Nothing is written on the claim or completion path: the events are there already.
An event carries its transaction's start time, so a minute is sampled only
:data:`SETTLE_SECONDS` after it closed, once the transactions that started in it
have committed. A minute is written once (its rows' key is the minute and the
queue); a transaction-scoped advisory lock keeps two workers' samplers from
counting the same minute at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Optional

from sqlalchemy import DateTime, Integer, Text, bindparam, func, literal_column, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.states import JobStatus
from runledger_sync.core.types import JobEventType
from runledger_sync.db.schema import job_events, job_queue, job_queues
from runledger_sync.db.schema_rollup import job_rollup_minutes
from runledger_sync.store.binds import Bind
from runledger_sync.store.transactions import run_in_transaction

_q = job_queue.c
_e = job_events.c
_r = job_rollup_minutes.c

#: Key of the transaction-scoped advisory lock a sample takes (``b"rlrollup"`` as a signed 64-bit integer).
SAMPLE_LOCK_KEY = int.from_bytes(b"rlrollup", "big", signed=True)
#: Wait after a minute closes before it is counted: an outcome's event is stamped with
#: its transaction's start, and the hot path's transactions last milliseconds.
SETTLE_SECONDS = 10
#: The outcome events counted, by the rollup column each goes to.
COUNTED_EVENTS = {
    "succeeded": JobEventType.SUCCEEDED,
    "retried": JobEventType.RETRY_SCHEDULED,
    "dead_lettered": JobEventType.DEAD_LETTERED,
    "canceled": JobEventType.CANCELED,
}
DEFAULT_WINDOW_MINUTES = 60
WINDOW_RANGE = (1, 7 * 24 * 60)

_NOW = bindparam("now", type_=DateTime(timezone=True))
_MINUTE = bindparam("minute", type_=DateTime(timezone=True))
_ONE_MINUTE: Any = literal_column("interval '1 minute'")
# Planned with the literals in the text, so the planner can prove the claim index's predicate.
_PENDING_IN_TEXT = literal_column(f"'{JobStatus.PENDING.value}'", Text)


@dataclass(frozen=True)
class RollupSample:
    """What one turn of the sampler did.

    Attributes:
        minute: The closed minute it sampled (or found sampled already).
        rows: Rows it wrote, one per queue; 0 when the minute was written before or the lock was taken.
        contended: Another sampler held the lock; nothing was read.
        next_in_seconds: How long until the next minute is due to be sampled.
    """

    minute: datetime
    rows: int
    contended: bool
    next_in_seconds: float


@dataclass(frozen=True)
class RollupPoint:
    """One sampled minute, every queue together (or the one queue asked for).

    Attributes:
        minute: The start of the minute.
        succeeded, retried, dead_lettered, canceled: Attempts that ended so in the minute
            (retried: failed with a retry scheduled; canceled: jobs canceled).
        ready: Due, claimable jobs waiting just after the minute closed.
        oldest_due_wait_seconds: How long the oldest of them had been due then (the
            longest over the queues); None when none was.
    """

    minute: datetime
    succeeded: int
    retried: int
    dead_lettered: int
    canceled: int
    ready: int
    oldest_due_wait_seconds: Optional[float]


@dataclass(frozen=True)
class Rollup:
    """A range of sampled minutes.

    Attributes:
        as_of: The database's clock when it was read.
        window_minutes: How many minutes back the range reaches.
        points: The sampled minutes in the range, oldest first; a minute nobody sampled is missing.
    """

    as_of: datetime
    window_minutes: int
    points: list[RollupPoint]


def _clock() -> Any:
    now = func.coalesce(_NOW, func.now())
    settled = func.date_trunc("minute", now - func.make_interval(0, 0, 0, 0, 0, 0, SETTLE_SECONDS))
    return select(now, settled - _ONE_MINUTE)


def _finished() -> Any:
    """The minute's outcome events per queue, one count per kind."""
    kinds = {column: literal_column(f"'{event.value}'", Text) for column, event in COUNTED_EVENTS.items()}
    counts = [func.count().filter(_e.event_type == kind).label(column) for column, kind in kinds.items()]
    return (
        select(_q.queue, *counts)
        .select_from(job_events.join(job_queue, _q.id == _e.job_id))
        .where(_e.event_type.in_(list(kinds.values())), _e.occurred_at >= _MINUTE,
               _e.occurred_at < _MINUTE + _ONE_MINUTE)
        .group_by(_q.queue)
        .cte("finished")
    )


def _waiting() -> Any:
    """Due, claimable jobs per queue, and when the oldest of them fell due."""
    now = func.coalesce(_NOW, func.now())
    return (
        select(_q.queue, func.count().label("ready"), func.min(_q.next_run_at).label("oldest_due_at"))
        .where(_q.status == _PENDING_IN_TEXT, ~_q.blocked_by_key, _q.next_run_at <= now)
        .group_by(_q.queue)
        .cte("waiting")
    )


def _build_sample() -> Any:
    finished, waiting = _finished(), _waiting()
    now = func.coalesce(_NOW, func.now())
    zero = func.coalesce
    rows = select(
        _MINUTE, job_queues.c.name,
        *(zero(finished.c[column], 0) for column in COUNTED_EVENTS),
        zero(waiting.c.ready, 0), func.extract("epoch", now - waiting.c.oldest_due_at),
    ).select_from(
        job_queues.outerjoin(finished, finished.c.queue == job_queues.c.name)
        .outerjoin(waiting, waiting.c.queue == job_queues.c.name)
    )
    columns = ["minute", "queue", *COUNTED_EVENTS, "ready", "oldest_due_wait_seconds"]
    return insert(job_rollup_minutes).from_select(columns, rows).on_conflict_do_nothing(
        index_elements=["minute", "queue"])


SAMPLE_STATEMENT = _build_sample()
_SAMPLED = select(func.count()).where(_r.minute == _MINUTE)
_TRY_LOCK = select(func.pg_try_advisory_xact_lock(bindparam("lock_key")))


def sample_rollup(bind: Bind, *, now: Optional[datetime] = None) -> RollupSample:
    """Write the last closed minute into job_rollup_minutes, one row per queue, unless it is there.

    The minute is the last one that closed at least :data:`SETTLE_SECONDS` ago. Its
    rows hold the outcome events of the minute per queue and what waited when the
    sample ran. Running it again for the same minute writes nothing; while another
    sample holds the lock it reads nothing and says ``contended``.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg
            connection whose open transaction the call joins (the caller commits).
        now: the clock to sample by (None: the database's ``now()``).
    """

    def work(connection: Connection) -> RollupSample:
        clock, minute = connection.execute(_clock(), {"now": now}).one()
        due_in = (minute + timedelta(minutes=2, seconds=SETTLE_SECONDS) - clock).total_seconds()
        if not connection.execute(_TRY_LOCK, {"lock_key": SAMPLE_LOCK_KEY}).scalar_one():
            return RollupSample(minute, 0, True, due_in)
        if connection.execute(_SAMPLED, {"minute": minute}).scalar_one():
            return RollupSample(minute, 0, False, due_in)
        written = connection.execute(SAMPLE_STATEMENT, {"now": now, "minute": minute}).rowcount
        return RollupSample(minute, int(written), False, due_in)

    return run_in_transaction(bind, work)


def _series(by_queue: bool) -> Any:
    since = func.date_trunc("minute", func.now()) - func.make_interval(
        0, 0, 0, 0, 0, bindparam("window_minutes", type_=Integer))
    statement = (
        select(_r.minute, func.sum(_r.succeeded), func.sum(_r.retried), func.sum(_r.dead_lettered),
               func.sum(_r.canceled), func.sum(_r.ready), func.max(_r.oldest_due_wait_seconds))
        .where(_r.minute >= since)
        .group_by(_r.minute)
        .order_by(_r.minute)
    )
    return statement.where(_r.queue == bindparam("queue", type_=Text)) if by_queue else statement


def rollup_series(bind: Bind, *, window_minutes: int = DEFAULT_WINDOW_MINUTES,
                  queue: Optional[str] = None) -> Rollup:
    """Read the sampled minutes of the last ``window_minutes``, every queue summed (or one ``queue``).

    Reads a range of job_rollup_minutes' key, never the jobs.

    Raises:
        InvalidArgument: ``window_minutes`` is out of range.
    """
    check.check_int("window_minutes", window_minutes, WINDOW_RANGE)
    params: dict[str, Any] = {"window_minutes": window_minutes, "queue": queue}

    def work(connection: Connection) -> Rollup:
        rows = connection.execute(_series(queue is not None), params).all()
        return Rollup(
            as_of=connection.execute(select(func.now())).scalar_one(),
            window_minutes=window_minutes,
            points=[RollupPoint(minute, int(ok), int(retried), int(dead), int(canceled), int(ready),
                                None if oldest is None else float(oldest))
                    for minute, ok, retried, dead, canceled, ready, oldest in rows],
        )

    return run_in_transaction(bind, work)
