"""Operator reads of jobs: get, list and count them, read their attempts, events and dead letter.

The operator's other calls are beside this module: the actions (cancel, requeue)
in :mod:`~runledger_sync.store.admin.actions`, the dead letters chosen by a filter
(list, count, bulk replay) in :mod:`~runledger_sync.store.admin.dead_letters`, the
figures in :mod:`~runledger_sync.store.admin.stats`, :mod:`~runledger_sync.store.admin.gauges`,
:mod:`~runledger_sync.store.admin.overview` and :mod:`~runledger_sync.store.admin.rollup`.

Every call takes an optional ``organization_id`` scope: given one, only that
organization's jobs are seen or touched, and a job of another organization is
reported as not found.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence
from uuid import UUID

from sqlalchemy import BigInteger, Integer, Select, exists, func, literal, null, select, tuple_, union_all

from runledger_sync.core import validation as check
from runledger_sync.core.bulk import JobFilter
from runledger_sync.core.errors import InvalidArgument
from runledger_sync.core.records import DeadLetterRecord, JobAttemptRecord, JobEventRecord, JobRecord
from runledger_sync.core.states import JobStatus
from runledger_sync.core.types import JobEventType
from runledger_sync.db.schema import job_attempts, job_dead_letters, job_events, job_queue
from runledger_sync.store.binds import Bind
from runledger_sync.store.transactions import run_in_transaction
from runledger_sync.store.rows import (
    ATTEMPT_COLUMNS, DEAD_LETTER_COLUMNS, DEAD_LETTERS, EVENT_COLUMNS, JOB_COLUMNS, to_dead_letter, to_job, to_record,
)
from runledger_sync.store.scope import check_job_id, meta_contains, scoped, status_is, status_parts

_q = job_queue.c
DEFAULT_LIST_LIMIT = 100


def _read(bind: Bind, statement: Any) -> Any:
    return run_in_transaction(bind, lambda connection: connection.execute(statement).all())


def get_job(bind: Bind, job_id: UUID | str, *, organization_id: Optional[str] = None) -> Optional[JobRecord]:
    """Return the job, or None when it does not exist in the scope.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
    """
    statement = scoped(select(*JOB_COLUMNS).where(_q.id == check_job_id(job_id)), organization_id)
    rows = _read(bind, statement)
    return to_job(rows[0]) if rows else None


def _filtered(statement: Any, job_type: Optional[str], organization_id: Optional[str], search: Optional[str] = None) -> Any:
    if job_type is not None:
        statement = statement.where(_q.job_type == check.check_job_type(job_type))
    if search is not None:
        statement = statement.where(_matching(search))
    return scoped(statement, organization_id)


def _matching(search: str) -> Any:
    """A whole job id finds that job (by primary key); other text is an idempotency key prefix."""
    check.check_text("search", search, max_length=check.IDEMPOTENCY_KEY_MAX_LENGTH)
    try:
        return _q.id == UUID(search.strip())
    except ValueError:
        # autoescape: a % or _ typed by the operator matches itself, not any text.
        return _q.idempotency_key.startswith(search, autoescape=True)


def list_jobs(
    bind: Bind,
    *,
    status: Optional[JobStatus | str] = None,
    job_type: Optional[str] = None,
    organization_id: Optional[str] = None,
    limit: int = DEFAULT_LIST_LIMIT,
    offset: int = 0,
    before: Optional[JobRecord] = None,
    search: Optional[str] = None,
    meta: Optional[Mapping[str, str]] = None,
) -> list[JobRecord]:
    """Return jobs matching the filters, newest first.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        before: the last job of the previous page: only jobs older than it (by
            ``created_at``, then ``id``) are returned. Unlike ``offset``, a page found
            this way costs the same however deep it is.
        search: a whole job id (that job only), or the start of an idempotency key.
            A key prefix is checked on each row the listing walks, newest first, so
            a rare key is found only as fast as the filters narrow the walk.
        meta: only jobs whose metadata holds each of these keys with its value
            (``{"tenant": "acme"}``; other keys may be there too), found through
            the GIN index on ``job_queue.meta``.

    Raises:
        InvalidArgument: a filter is malformed (an unknown status raises ValueError's
            coded form, InvalidArgument).
    """
    check.check_int("limit", limit, check.LIMIT_RANGE)
    check.check_int("offset", offset, (0, 2**31 - 1))
    status = _check_status(status)
    narrowed = [] if before is None else [tuple_(_q.created_at, _q.id) < tuple_(*_cursor(before))]
    if meta is not None:
        narrowed.append(meta_contains(JobFilter(meta=meta).meta))
    # One part per status, each with its own ORDER BY and LIMIT: planned on its own,
    # a part knows its status is a constant, reads its index newest first and stops
    # at the page's end, and the parts are merged. (Without the inner LIMIT,
    # PostgreSQL flattens the UNION ALL, loses that, and sorts the whole table.)
    statuses = [status] if status is not None else list(JobStatus)
    newest_first = (_q.created_at.desc(), _q.id.desc())
    parts = [
        _filtered(select(*JOB_COLUMNS).where(status_is(s), *narrowed), job_type, organization_id, search)
        .order_by(*newest_first)
        for s in statuses
    ]
    if len(parts) == 1:
        statement = parts[0].limit(limit).offset(offset)
    else:
        jobs = union_all(*(part.limit(limit + offset) for part in parts)).subquery("jobs")
        statement = select(jobs).order_by(jobs.c.created_at.desc(), jobs.c.id.desc()).limit(limit).offset(offset)
    return [to_job(row) for row in _read(bind, statement)]


def _cursor(before: Any) -> tuple[Any, UUID]:
    if not isinstance(before, JobRecord):
        raise InvalidArgument("before", before, "the JobRecord of the previous page's last job")
    return before.created_at, before.id


def job_statuses(
    bind: Bind, job_ids: Sequence[UUID | str], *, organization_id: Optional[str] = None
) -> dict[UUID, JobStatus]:
    """Return the status of each of the jobs that exist in the scope, in one primary-key read.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
    """
    ids = [check_job_id(job_id) for job_id in job_ids]
    if not ids:
        return {}
    statement = scoped(select(_q.id, _q.status).where(_q.id.in_(ids)), organization_id)
    return {row.id: JobStatus(row.status) for row in _read(bind, statement)}


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
        for part in status_parts(status)
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
    """Return a job's attempts, oldest first, each failed one with its exception's ``error_type`` and ``traceback``.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
    """
    statement = (
        select(*ATTEMPT_COLUMNS)
        .where(job_attempts.c.job_id == check_job_id(job_id))
        .order_by(job_attempts.c.run_number, job_attempts.c.attempt)
    )
    return [to_record(JobAttemptRecord, row) for row in _read(bind, statement)]


def list_events(bind: Bind, job_id: UUID | str) -> list[JobEventRecord]:
    """Return a job's events in the order they were written, opening with its ENQUEUED entry.

    A job enqueued at the ``transitions`` event log level (the default) has no
    ENQUEUED row; its entry is drawn from the job row instead: id 0, run 1, the
    row's ``created_at`` and ``{"job_type": ...}``, as the event row would have
    said, and no stage (the row no longer knows the stage it was enqueued at).

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
    """
    job = check_job_id(job_id)
    written = select(*EVENT_COLUMNS).where(job_events.c.job_id == job)
    enqueued_row = exists().where(job_events.c.job_id == job,
                                  job_events.c.event_type == JobEventType.ENQUEUED.value)
    drawn_values: tuple[Any, ...] = (
        literal(0, BigInteger), job_queue.c.id, literal(1, Integer), null(), literal(JobEventType.ENQUEUED.value),
        null(), null(), null(), func.jsonb_build_object("job_type", job_queue.c.job_type),
        job_queue.c.created_at,
    )
    drawn: Select[Any] = select(*(value.label(column.name) for value, column in zip(
        drawn_values, EVENT_COLUMNS, strict=True))).where(job_queue.c.id == job, ~enqueued_row)
    statement = union_all(written, drawn).order_by(job_events.c.id.name)
    return [to_record(JobEventRecord, row) for row in _read(bind, statement)]


def get_dead_letter(bind: Bind, job_id: UUID | str) -> Optional[DeadLetterRecord]:
    """Return the job's dead-letter row, or None.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
    """
    statement = (select(*DEAD_LETTER_COLUMNS).select_from(DEAD_LETTERS)
                 .where(job_dead_letters.c.job_id == check_job_id(job_id)))
    rows = _read(bind, statement)
    return to_dead_letter(rows[0]) if rows else None


__all__ = [
    "count_jobs",
    "get_dead_letter",
    "get_job",
    "job_statuses",
    "list_attempts",
    "list_events",
    "list_jobs",
]
