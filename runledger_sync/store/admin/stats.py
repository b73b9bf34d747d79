"""The numbers an operator looks at first: counts by status and type, due and scheduled jobs, expired leases."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

from sqlalchemy import func, select, union_all
from sqlalchemy.engine import Connection

from runledger_sync.core.states import JobStatus
from runledger_sync.db.schema import job_queue
from runledger_sync.store.binds import Bind
from runledger_sync.store.transactions import run_in_transaction
from runledger_sync.store.scope import scoped, status_parts

_q = job_queue.c


@dataclass(frozen=True)
class QueueStats:
    """Counts an operator looks at first.

    PENDING jobs are split by their next_run_at: those due now (a worker may
    claim them) and those scheduled for later (delayed, or waiting out a retry
    backoff), so a backlog is not mistaken for an idle queue or the reverse.

    Attributes:
        by_status: Jobs per status, every status present.
        by_type_and_status: Jobs per (job type, status) that has any.
        due_now: PENDING jobs whose next_run_at has come.
        oldest_due_age_seconds: How long the longest-waiting due job has been due; None if none is.
        scheduled_for_later: PENDING jobs whose next_run_at is still ahead.
        next_scheduled_at: The soonest of those next_run_at; None if there are none.
        expired_leases: LEASED jobs whose lease has run out (the reaper's work).
    """

    by_status: dict[str, int]
    by_type_and_status: dict[tuple[str, str], int]
    due_now: int
    oldest_due_age_seconds: Optional[float]
    scheduled_for_later: int
    next_scheduled_at: Optional[datetime]
    expired_leases: int

    @property
    def oldest_pending_age_seconds(self) -> Optional[float]:
        """The name this figure had before scheduled jobs were counted apart; same as oldest_due_age_seconds."""
        return self.oldest_due_age_seconds


def pending_timing_statement(organization_id: Optional[str] = None) -> Any:
    """Due-now and scheduled-for-later counts, the oldest due age and the next run time, in one pass.

    The status = 'PENDING' predicate reads the PENDING entries of
    idx_job_queue_resting_status (the claim index leaves out jobs held back by
    their concurrency key, which count here too), never the finished jobs that
    make up most of a long-lived table; scoped to an organization, it reads that
    organization's PENDING entries of idx_job_queue_resting_org.
    """
    now = func.now()
    due = _q.next_run_at <= now
    later = _q.next_run_at > now
    statement = select(
        func.count().filter(due),
        func.extract("epoch", now - func.min(_q.next_run_at).filter(due)),
        func.count().filter(later),
        func.min(_q.next_run_at).filter(later),
    ).where(_q.status == JobStatus.PENDING.value)
    return scoped(statement, organization_id)


def queue_stats(bind: Bind, *, organization_id: Optional[str] = None) -> QueueStats:
    """Return counts by status and by type, due and scheduled PENDING jobs, and expired leases.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
    """
    by_type = union_all(*(
        scoped(select(_q.job_type, _q.status, func.count()).where(part).group_by(_q.job_type, _q.status), organization_id)
        for part in status_parts(None)
    ))
    pending = pending_timing_statement(organization_id)
    expired = scoped(
        select(func.count()).where(_q.status == JobStatus.LEASED.value, _q.lease_expires_at < func.now()),
        organization_id,
    )

    def work(connection: Connection) -> QueueStats:
        pairs = {(row[0], row[1]): int(row[2]) for row in connection.execute(by_type)}
        by_status: dict[str, int] = {status.value: 0 for status in JobStatus}
        for (_, status), count in pairs.items():
            by_status[status] += count
        due_now, age, later, next_at = connection.execute(pending).one()
        return QueueStats(
            by_status=by_status,
            by_type_and_status=pairs,
            due_now=int(due_now),
            oldest_due_age_seconds=None if age is None else float(age),
            scheduled_for_later=int(later),
            next_scheduled_at=next_at,
            expired_leases=int(connection.execute(expired).scalar_one()),
        )

    return run_in_transaction(bind, work)
