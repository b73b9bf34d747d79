"""Pieces of SQL the lifecycle statements share: intervals, event rows, attempt rows, identity checks."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    and_,
    any_,
    bindparam,
    cast,
    func,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import UUID as PG_UUID

from runledger_sync.core.errors import InvalidArgument
from runledger_sync.core.types import EventLog
from runledger_sync.core.states import JobStatus
from runledger_sync.db.schema import job_attempts, job_events, job_queue

_q = job_queue.c
_a = job_attempts.c
_LEASED = JobStatus.LEASED.value


def seconds(name: str) -> Any:
    return func.make_interval(0, 0, 0, 0, 0, 0, bindparam(name, type_=Float))


def milliseconds(value: Any) -> Any:
    """An interval of ``value`` milliseconds: a bound parameter's name, or a column."""
    if isinstance(value, str):
        value = bindparam(value, type_=BigInteger)
    return func.make_interval(0, 0, 0, 0, 0, 0, value / 1000.0)


def ordinals(count: int) -> Any:
    """Rows 1..count, to write several events from one updated row in a fixed order.

    generate_series rather than a VALUES list: SQLAlchemy cannot cache a
    statement holding literal VALUES data, and these statements are on the hot path.
    """
    return func.generate_series(1, count).table_valued("ord").render_derived(name="kinds")


def event_insert(source: Any, *event_columns: Any, where: Any = None) -> Any:
    """INSERT INTO job_events from ``source`` rows (one statement, ids in select order), those meeting ``where``."""
    names = ["job_id", "run_number", "attempt", "event_type", "stage", "progress_done", "progress_total", "payload"]
    rows = select(*event_columns).select_from(source)
    return job_events.insert().from_select(names, rows if where is None else rows.where(where))


def full_event_log() -> Any:
    """Condition of the event rows that only the ``full`` event log writes (ENQUEUED, LEASED, STAGE_CHANGED running, HEARTBEAT).

    A bound flag rather than a second statement: each statement stays one text,
    prepared once per connection whatever the level, and with the flag false
    PostgreSQL skips the event rows' SELECT as a one-time filter.
    """
    return bindparam("full_event_log", type_=Boolean)


def event_log_params(event_log: Any) -> dict[str, bool]:
    """The parameter of :func:`full_event_log` for an ``event_log`` level (an EventLog or its value)."""
    try:
        level = EventLog(event_log)
    except ValueError:
        raise InvalidArgument(
            "event_log", event_log, f"one of {', '.join(level.value for level in EventLog)}"
        ) from None
    return {"full_event_log": level is EventLog.FULL}


def ids_of(rows: Any) -> Any:
    """The ``id`` column of ``rows`` (a CTE) as one uuid array.

    Compared with ``= ANY``, it reaches a table through its index on that key
    in whatever order the planner joins the rest: no plan can read the table whole.
    """
    return cast(select(func.array_agg(rows.c.id)).scalar_subquery(), ARRAY(PG_UUID(as_uuid=True)))


def attempt_of(jobs: Any) -> Any:
    """WHERE clause: the job_attempts row of each written job's current attempt (``jobs``: a CTE of job rows)."""
    return and_(
        _a.job_id == jobs.c.id, _a.run_number == jobs.c.run_number, _a.attempt == jobs.c.attempt,
        _a.job_id == any_(ids_of(jobs)),
    )
