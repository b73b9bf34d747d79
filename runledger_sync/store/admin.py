"""Operator reads and actions: get, list, count, cancel, requeue, history, stats.

Every call takes an optional ``organization_id`` scope: given one, only that
organization's jobs are seen or touched, and a job of another organization is
reported as not found.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional
from uuid import UUID

from sqlalchemy import Text, bindparam, func, literal, literal_column, select, union_all
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.errors import InvalidArgument, InvalidStateTransition, JobNotFound
from runledger_sync.core.records import DeadLetterRecord, JobAttemptRecord, JobEventRecord, JobRecord
from runledger_sync.core.types import JobEventType, JobStage, JobStatus
from runledger_sync.db.schema import job_attempts, job_dead_letters, job_events, job_queue
from runledger_sync.store._binds import Bind
from runledger_sync.store._errors import run_in_transaction
from runledger_sync.store._rows import ATTEMPT_COLUMNS, DEAD_LETTER_COLUMNS, EVENT_COLUMNS, JOB_COLUMNS, to_job, to_record

_q = job_queue.c
DEFAULT_LIST_LIMIT = 100
CANCELABLE = (JobStatus.PENDING.value, JobStatus.LEASED.value)
REQUEUABLE = (JobStatus.SUCCEEDED.value, JobStatus.DEAD_LETTERED.value, JobStatus.CANCELED.value)


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


def _check_job_id(job_id: Any) -> UUID:
    if isinstance(job_id, str):
        try:
            return UUID(job_id)
        except ValueError:
            pass
    if not isinstance(job_id, UUID):
        raise InvalidArgument("job_id", job_id, "a UUID")
    return job_id


def _scope(statement: Any, organization_id: Optional[str]) -> Any:
    if organization_id is None:
        return statement
    check.check_organization_id(organization_id)
    return statement.where(_q.organization_id == organization_id)


def _read(bind: Bind, statement: Any) -> Any:
    return run_in_transaction(bind, lambda connection: connection.execute(statement).all())


def get_job(bind: Bind, job_id: UUID | str, *, organization_id: Optional[str] = None) -> Optional[JobRecord]:
    """Return the job, or None when it does not exist in the scope.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
    """
    statement = _scope(select(*JOB_COLUMNS).where(_q.id == _check_job_id(job_id)), organization_id)
    rows = _read(bind, statement)
    return to_job(rows[0]) if rows else None


def _filtered(statement: Any, job_type: Optional[str], organization_id: Optional[str]) -> Any:
    if job_type is not None:
        statement = statement.where(_q.job_type == check.check_job_type(job_type))
    return _scope(statement, organization_id)


# The listing indexes leave LEASED rows out (db/schema.py), so a query reaches them
# only when its text proves status <> 'LEASED': each status is written into the
# SQL (they come from JobStatus, never from the caller), and a query over every
# status is split into parts that each name theirs.
def _status_is(status: JobStatus) -> Any:
    return _q.status == literal_column(f"'{status.value}'", Text)


_RESTING = _q.status != literal_column(f"'{JobStatus.LEASED.value}'", Text)


def _parts(status: Optional[JobStatus]) -> list[Any]:
    """WHERE clauses that together select ``status`` (None: every status), each served by one index."""
    if status is not None:
        return [_status_is(status)]
    return [_RESTING, _status_is(JobStatus.LEASED)]


def list_jobs(
    bind: Bind,
    *,
    status: Optional[JobStatus | str] = None,
    job_type: Optional[str] = None,
    organization_id: Optional[str] = None,
    limit: int = DEFAULT_LIST_LIMIT,
    offset: int = 0,
) -> list[JobRecord]:
    """Return jobs matching the filters, newest first.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).

    Raises:
        InvalidArgument: a filter is malformed (an unknown status raises ValueError's
            coded form, InvalidArgument).
    """
    check.check_int("limit", limit, check.LIMIT_RANGE)
    check.check_int("offset", offset, (0, 2**31 - 1))
    status = _check_status(status)
    # One part per status, each with its own ORDER BY and LIMIT: planned on its own,
    # a part knows its status is a constant, reads its index newest first and stops
    # at the page's end, and the parts are merged. (Without the inner LIMIT,
    # PostgreSQL flattens the UNION ALL, loses that, and sorts the whole table.)
    statuses = [status] if status is not None else list(JobStatus)
    newest_first = (_q.created_at.desc(), _q.id.desc())
    parts = [
        _filtered(select(*JOB_COLUMNS).where(_status_is(s)), job_type, organization_id).order_by(*newest_first)
        for s in statuses
    ]
    if len(parts) == 1:
        statement = parts[0].limit(limit).offset(offset)
    else:
        jobs = union_all(*(part.limit(limit + offset) for part in parts)).subquery("jobs")
        statement = select(jobs).order_by(jobs.c.created_at.desc(), jobs.c.id.desc()).limit(limit).offset(offset)
    return [to_job(row) for row in _read(bind, statement)]


def count_jobs(
    bind: Bind,
    *,
    status: Optional[JobStatus | str] = None,
    job_type: Optional[str] = None,
    organization_id: Optional[str] = None,
) -> int:
    """Return how many jobs match the filters.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
    """
    status = _check_status(status)
    counts = [
        _filtered(select(func.count().label("n")).select_from(job_queue).where(part), job_type, organization_id)
        for part in _parts(status)
    ]
    return sum(int(row[0]) for row in _read(bind, union_all(*counts)))


def _check_status(status: Any) -> Optional[JobStatus]:
    if status is None:
        return None
    try:
        return JobStatus(status)
    except ValueError:
        raise InvalidArgument("status", status, f"one of {', '.join(s.value for s in JobStatus)}") from None


def list_attempts(bind: Bind, job_id: UUID | str) -> list[JobAttemptRecord]:
    """Return a job's attempts, oldest first.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
    """
    statement = (
        select(*ATTEMPT_COLUMNS)
        .where(job_attempts.c.job_id == _check_job_id(job_id))
        .order_by(job_attempts.c.run_number, job_attempts.c.attempt)
    )
    return [to_record(JobAttemptRecord, row) for row in _read(bind, statement)]


def list_events(bind: Bind, job_id: UUID | str) -> list[JobEventRecord]:
    """Return a job's events in the order they were written.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
    """
    statement = select(*EVENT_COLUMNS).where(job_events.c.job_id == _check_job_id(job_id)).order_by(job_events.c.id)
    return [to_record(JobEventRecord, row) for row in _read(bind, statement)]


def get_dead_letter(bind: Bind, job_id: UUID | str) -> Optional[DeadLetterRecord]:
    """Return the job's dead-letter row, or None.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
    """
    statement = select(*DEAD_LETTER_COLUMNS).where(job_dead_letters.c.job_id == _check_job_id(job_id))
    rows = _read(bind, statement)
    return to_record(DeadLetterRecord, rows[0]) if rows else None


def list_dead_letters(
    bind: Bind,
    *,
    job_type: Optional[str] = None,
    organization_id: Optional[str] = None,
    since: Optional[datetime] = None,
    limit: int = DEFAULT_LIST_LIMIT,
) -> list[DeadLetterRecord]:
    """Return dead letters, most recent failure first.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
    """
    check.check_int("limit", limit, check.LIMIT_RANGE)
    dl = job_dead_letters.c
    statement = select(*DEAD_LETTER_COLUMNS).order_by(dl.failed_at.desc()).limit(limit)
    if job_type is not None:
        statement = statement.where(dl.job_type == check.check_job_type(job_type))
    if organization_id is not None:
        statement = statement.where(
            dl.organization_id == check.check_organization_id(organization_id)
        )
    if since is not None:
        statement = statement.where(dl.failed_at >= check.check_run_at(since, "since"))
    return [to_record(DeadLetterRecord, row) for row in _read(bind, statement)]


def _reason_event(changed: Any, event_type: JobEventType, run_number: Any, attempt: Any) -> Any:
    """The event row of an operator's action on the ``changed`` rows, carrying its reason."""
    return job_events.insert().from_select(
        ["job_id", "run_number", "attempt", "event_type", "stage", "payload"],
        select(
            changed.c.id,
            run_number,
            func.nullif(attempt, 0),
            literal(event_type.value),
            changed.c.stage,
            func.jsonb_build_object("reason", changed.c.status_reason),
        ),
    ).cte(f"{event_type.value.lower()}_event")


def _build_cancel() -> Any:
    reason = bindparam("reason", type_=Text)
    canceled = (
        job_queue.update()
        .where(_q.id == bindparam("target_id"), _q.status.in_(CANCELABLE))
        # lease_expires_at is kept on purpose: a requeue must not let a new attempt
        # overlap the fenced handler that may still be running.
        .values(
            status=JobStatus.CANCELED.value,
            last_heartbeat_at=None,
            worker_id=None,
            finished_at=func.now(),
            status_reason=func.coalesce(reason, "CANCELED"),
        )
        .returning(*JOB_COLUMNS)
    )
    return canceled


def _cancel_statement(organization_id: Optional[str]) -> Any:
    canceled = _scope(_build_cancel(), organization_id).cte("canceled")
    closed = (
        job_attempts.update()
        .where(
            job_attempts.c.job_id == canceled.c.id,
            job_attempts.c.run_number == canceled.c.run_number,
            job_attempts.c.attempt == canceled.c.attempt,
            job_attempts.c.finished_at.is_(None),
        )
        .values(finished_at=func.now())
        .cte("closed_attempt")
    )
    event = _reason_event(canceled, JobEventType.CANCELED, canceled.c.run_number, canceled.c.attempt)
    return select(*canceled.c).add_cte(closed, event)


def cancel_job(
    bind: Bind,
    job_id: UUID | str,
    *,
    reason: Optional[str] = None,
    organization_id: Optional[str] = None,
) -> JobRecord:
    """Cancel a PENDING or LEASED job.

    A running handler is not interrupted here: its next heartbeat finds the lease
    gone and sets its cancellation flag, and any write it attempts is refused.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).

    Raises:
        JobNotFound: no such job in the scope.
        InvalidStateTransition: the job has already finished.
    """
    target = _check_job_id(job_id)
    if reason is not None:
        check.check_text("reason", reason, max_length=255)
    statement = _cancel_statement(organization_id)

    def work(connection: Connection) -> JobRecord:
        row = connection.execute(statement, {"target_id": target, "reason": reason}).first()
        if row is not None:
            return to_job(row)
        raise _transition_error(connection, target, organization_id, "canceled", CANCELABLE)

    return run_in_transaction(bind, work)


def _transition_error(
    connection: Connection, job_id: UUID, organization_id: Optional[str], verb: str, allowed: tuple[str, ...]
) -> Exception:
    found = connection.execute(_scope(select(_q.status).where(_q.id == job_id), organization_id)).first()
    if found is None:
        return JobNotFound(f"job {job_id} was not found", job_id=str(job_id))
    return InvalidStateTransition(
        f"job {job_id} is {found.status} and cannot be {verb}; only {', '.join(allowed)} can",
        job_id=str(job_id),
        status=found.status,
    )


def _requeue_statement(organization_id: Optional[str]) -> Any:
    previous = _scope(
        select(_q.id, _q.run_number, _q.attempt).where(_q.id == bindparam("target_id"), _q.status.in_(REQUEUABLE)),
        organization_id,
    ).with_for_update().subquery("previous")
    requeued = (
        job_queue.update()
        .where(_q.id == previous.c.id)
        .values(
            status=JobStatus.PENDING.value,
            stage=JobStage.QUEUED.value,
            progress_done=None,
            progress_total=None,
            checkpoint=None,
            output=None,
            run_number=_q.run_number + 1,
            attempt=0,
            lease_expires_at=None,
            last_heartbeat_at=None,
            worker_id=None,
            started_at=None,
            finished_at=None,
            next_run_at=func.now(),
            status_reason=func.coalesce(bindparam("reason", type_=Text), "REQUEUED"),
            last_error_code=None,
            last_error_message=None,
        )
        .returning(*JOB_COLUMNS, previous.c.run_number.label("previous_run"), previous.c.attempt.label("previous_attempt"))
        .cte("requeued")
    )
    event = _reason_event(requeued, JobEventType.REQUEUED, requeued.c.previous_run, requeued.c.previous_attempt)
    return select(*requeued.c).add_cte(event)


def requeue_job(
    bind: Bind,
    job_id: UUID | str,
    *,
    reason: Optional[str] = None,
    organization_id: Optional[str] = None,
) -> JobRecord:
    """Run a finished job again: a new run (run_number + 1) from attempt 0.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).

    Raises:
        JobNotFound: no such job in the scope.
        InvalidStateTransition: the job is still PENDING or LEASED.
    """
    target = _check_job_id(job_id)
    if reason is not None:
        check.check_text("reason", reason, max_length=255)
    statement = _requeue_statement(organization_id)

    def work(connection: Connection) -> JobRecord:
        row = connection.execute(statement, {"target_id": target, "reason": reason}).first()
        if row is not None:
            return to_job(row)
        raise _transition_error(connection, target, organization_id, "requeued", REQUEUABLE)

    return run_in_transaction(bind, work)


def pending_timing_statement(organization_id: Optional[str] = None) -> Any:
    """Due-now and scheduled-for-later counts, the oldest due age and the next run time, in one pass.

    The status = 'PENDING' predicate matches idx_job_queue_claim's WHERE, so the
    pass reads only that partial index (which holds next_run_at), never the
    finished jobs that make up most of a long-lived table; scoped to an
    organization, it reads that organization's PENDING entries of
    idx_job_queue_resting_org.
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
    return _scope(statement, organization_id)


def queue_stats(bind: Bind, *, organization_id: Optional[str] = None) -> QueueStats:
    """Return counts by status and by type, due and scheduled PENDING jobs, and expired leases.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
    """
    by_type = union_all(*(
        _scope(select(_q.job_type, _q.status, func.count()).where(part).group_by(_q.job_type, _q.status), organization_id)
        for part in _parts(None)
    ))
    pending = pending_timing_statement(organization_id)
    expired = _scope(
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
