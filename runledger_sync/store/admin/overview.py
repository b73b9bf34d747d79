"""The dashboard's overview figures beyond queue_stats: recent throughput, workers holding leases, failures by code.

Each read stays on an index however long the tables grow: the event reads on
idx_job_events_type_occurred (event type, then newest first), the worker read on
idx_job_queue_leased_expiry (LEASED rows only).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

from sqlalchemy import Integer, bindparam, func, select
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.types import JobEventType
from runledger_sync.core.states import JobStatus
from runledger_sync.db.schema import job_events, job_queue
from runledger_sync.store.binds import Bind
from runledger_sync.store.transactions import run_in_transaction
from runledger_sync.store.scope import scoped

_q = job_queue.c
_e = job_events.c

#: The events that end an attempt, counted as throughput.
FINISHING_EVENTS = (JobEventType.SUCCEEDED, JobEventType.FAILED)
DEFAULT_WINDOW_MINUTES = 60
WINDOW_RANGE = (1, 24 * 60)


@dataclass(frozen=True)
class WorkerSeen:
    """A worker that holds leases now, as its leased jobs show it.

    Attributes:
        worker_id: The worker's id as written on its leases.
        leased_jobs: How many jobs it holds.
        last_heartbeat_at: Its most recent heartbeat on any of them (None: not started yet).
        expired_leases: How many of its leases have run out (a stopped worker's, for the reaper).
    """

    worker_id: str
    leased_jobs: int
    last_heartbeat_at: Optional[datetime]
    expired_leases: int


@dataclass(frozen=True)
class Overview:
    """Recent activity over a window of minutes.

    Attributes:
        as_of: The database's clock when the figures were read.
        window_minutes: How far back the figures reach.
        finished_per_minute: (minute, SUCCEEDED count, FAILED count), oldest first, minutes without any left out.
        failures_by_code: (error code, count) of failed attempts, most frequent first.
        workers: The workers holding leases now, busiest first.
    """

    as_of: datetime
    window_minutes: int
    finished_per_minute: list[tuple[datetime, int, int]]
    failures_by_code: list[tuple[str, int]]
    workers: list[WorkerSeen]

    @property
    def succeeded(self) -> int:
        return sum(ok for _, ok, _ in self.finished_per_minute)

    @property
    def failed(self) -> int:
        return sum(failed for _, _, failed in self.finished_per_minute)


def _recent(event_type: JobEventType, organization_id: Optional[str]) -> Any:
    """Events of one type within the window; scoped through their job when an organization is given."""
    since = func.now() - func.make_interval(0, 0, 0, 0, 0, bindparam("window_minutes", type_=Integer))
    statement = select(_e.occurred_at, _e.payload).where(_e.event_type == event_type.value, _e.occurred_at >= since)
    if organization_id is not None:
        statement = scoped(statement.join_from(job_events, job_queue, _q.id == _e.job_id), organization_id)
    return statement.subquery(event_type.value.lower())


def _per_minute(event_type: JobEventType, organization_id: Optional[str]) -> Any:
    events = _recent(event_type, organization_id)
    minute = func.date_trunc("minute", events.c.occurred_at)
    return select(minute.label("minute"), func.count().label("n")).group_by(minute)


def _failures_by_code(organization_id: Optional[str]) -> Any:
    failed = _recent(JobEventType.FAILED, organization_id)
    code = func.coalesce(failed.c.payload["error_code"].astext, "")
    return select(code, func.count().label("n")).group_by(code).order_by(func.count().desc(), code)


def _workers(organization_id: Optional[str]) -> Any:
    expired = func.count().filter(_q.lease_expires_at < func.now())
    statement = (
        select(_q.worker_id, func.count(), func.max(_q.last_heartbeat_at), expired)
        .where(_q.status == JobStatus.LEASED.value, _q.worker_id.is_not(None))
        .group_by(_q.worker_id)
        .order_by(func.count().desc(), _q.worker_id)
    )
    return scoped(statement, organization_id)


def recent_overview(
    bind: Bind, *, organization_id: Optional[str] = None, window_minutes: int = DEFAULT_WINDOW_MINUTES
) -> Overview:
    """Return throughput per minute, failures by code and the workers holding leases.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        window_minutes: How many minutes back the throughput and failures reach.

    Raises:
        InvalidArgument: ``window_minutes`` is out of range, or the organization id is malformed.
    """
    check.check_int("window_minutes", window_minutes, WINDOW_RANGE)
    if organization_id is not None:
        check.check_organization_id(organization_id)
    params = {"window_minutes": window_minutes}

    def work(connection: Connection) -> Overview:
        minutes: dict[datetime, list[int]] = {}
        for column, event_type in enumerate(FINISHING_EVENTS):
            for minute, count in connection.execute(_per_minute(event_type, organization_id), params):
                minutes.setdefault(minute, [0, 0])[column] = int(count)
        failures = connection.execute(_failures_by_code(organization_id), params).all()
        workers = connection.execute(_workers(organization_id)).all()
        return Overview(
            as_of=connection.execute(select(func.now())).scalar_one(),
            window_minutes=window_minutes,
            finished_per_minute=[(minute, ok, failed) for minute, (ok, failed) in sorted(minutes.items())],
            failures_by_code=[(code, int(count)) for code, count in failures],
            workers=[WorkerSeen(w, int(n), beat, int(expired)) for w, n, beat, expired in workers],
        )

    return run_in_transaction(bind, work)
