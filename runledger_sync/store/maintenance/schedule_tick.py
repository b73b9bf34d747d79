"""The scheduler's tick: enqueue a job for each due schedule and move it to its next fire (spec section 8).

The schedule rows are the lock. A tick takes the due rows with ``FOR UPDATE
SKIP LOCKED``, so any number of processes can tick at once and each due
instant is enqueued by one of them only; the job and the schedule's new
``next_fire_at`` commit together. Catch-up is coalesced: a schedule that missed
several instants while nothing ticked fires once, then waits for its first
instant after now. A schedule whose cron names no instant after the one it
fires (a year field's last year) fires that last one and is made inactive:
it has finished, and nothing is left for a tick to try.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Optional
from uuid import UUID

from sqlalchemy import DateTime, bindparam, func, select, true
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.errors import RunledgerError
from runledger_sync.core.records import JobSpec, ScheduleFailure, ScheduleTick
from runledger_sync.core.types import DEFAULT_EVENT_LOG, EventLog
from runledger_sync.db.errors import translate
from runledger_sync.db.schema_schedules import job_schedules
from runledger_sync.store.binds import Bind
from runledger_sync.store.transactions import run_in_transaction
from runledger_sync.store.sql import event_log_params
from runledger_sync.store.enqueue.enqueue import enqueue_many
from runledger_sync.store.schedules import SCHEDULE_COLUMNS, fire_job_spec, next_fire, spec_of

_s = job_schedules.c
#: A schedule that failed to fire is tried again this long after (spec section 8).
FAILED_FIRE_RETRY_SECONDS = 30

_DUE = (
    select(*SCHEDULE_COLUMNS, func.now().label("db_now"))
    .where(_s.is_active.is_(true()), _s.next_fire_at <= func.now())
    .order_by(_s.next_fire_at)
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
)
_FIRED_NOW = (
    func.unnest(
        bindparam("fired_ids", type_=ARRAY(PG_UUID(as_uuid=True))),
        bindparam("next_fires", type_=ARRAY(DateTime(timezone=True))),
    )
    .table_valued("id", "next_at")
    .render_derived(name="fired")
)
# A schedule with no next instant (NULL) has fired its last one: it is made
# inactive, and keeps that instant as its next_fire_at, which is never NULL.
_MARK_FIRED = (
    job_schedules.update()
    .where(_s.id == _FIRED_NOW.c.id)
    .values(last_fired_at=func.now(), next_fire_at=func.coalesce(_FIRED_NOW.c.next_at, _s.next_fire_at),
            is_active=_FIRED_NOW.c.next_at.is_not(None),
            last_error_code=None, last_error_message=None, last_error_at=None)
)
_NEXT_DUE = select(func.extract("epoch", func.min(_s.next_fire_at) - func.clock_timestamp())).where(
    _s.is_active.is_(true()))


def fire_due_schedules(bind: Bind, *, limit: int, event_log: EventLog | str = DEFAULT_EVENT_LOG) -> ScheduleTick:
    """Enqueue one job for each of up to ``limit`` due schedules, and move each to its next fire.

    One transaction; a schedule that cannot fire (its job type disabled, its cron
    or zone edited into something invalid) is rolled back alone and tried again
    30 s later, with its error kept on its row, and never blocks the others. A
    schedule whose cron names no later instant fires its last one and is made
    inactive; the tick names it in ``finished``. ``event_log`` is the level the
    jobs are enqueued at (the scheduler passes ``JobsConfig.event_log``).
    """
    check.check_int("limit", limit, (1, 10_000))
    event_log_params(event_log)  # an unknown level is refused here, not taken for a schedule's failure
    return run_in_transaction(bind, lambda connection: _tick(connection, limit, event_log))


def _tick(connection: Connection, limit: int, event_log: Any) -> ScheduleTick:
    due = connection.execute(_DUE, {"limit": limit}).all()
    failed: list[ScheduleFailure] = []
    planned: list[tuple[Any, JobSpec, Optional[datetime]]] = []
    for row in due:
        try:
            planned.append((row, fire_job_spec(row, row.next_fire_at), next_fire(spec_of(row), row.id, row.db_now)))
        except RunledgerError as error:
            failed.append(_record_failure(connection, row, error))
    if planned and not _fire_together(connection, planned, event_log):
        for item in planned:
            outcome = _fire_alone(connection, item, event_log)
            if outcome is not None:
                failed.append(outcome)
    fired = len(due) - len(failed)
    failed_names = {failure.name for failure in failed}
    finished = tuple(row.name for row, _, next_at in planned if next_at is None and row.name not in failed_names)
    next_due = connection.execute(_NEXT_DUE).scalar()
    return ScheduleTick(fired, tuple(failed), len(due) == limit, None if next_due is None else float(next_due),
                        finished)


def _fire_together(connection: Connection, planned: list[tuple[Any, JobSpec, Optional[datetime]]],
                   event_log: Any) -> bool:
    """Fire the whole batch in one savepoint; False (nothing written) if any one of them fails."""
    savepoint = connection.begin_nested()
    try:
        enqueue_many(connection, [spec for _, spec, _ in planned], event_log=event_log)
        _mark_fired(connection, [(row.id, next_at) for row, _, next_at in planned])
    except (RunledgerError, sa_exc.DBAPIError):
        savepoint.rollback()
        return False
    savepoint.commit()
    return True


def _fire_alone(connection: Connection, item: tuple[Any, JobSpec, Optional[datetime]],
                event_log: Any) -> Optional[ScheduleFailure]:
    row, spec, next_at = item
    savepoint = connection.begin_nested()
    try:
        enqueue_many(connection, [spec], event_log=event_log)
        _mark_fired(connection, [(row.id, next_at)])
    except sa_exc.DBAPIError as exc:
        savepoint.rollback()
        return _record_failure(connection, row, translate(exc))
    except RunledgerError as error:
        savepoint.rollback()
        return _record_failure(connection, row, error)
    savepoint.commit()
    return None


def _mark_fired(connection: Connection, fired: list[tuple[UUID, Optional[datetime]]]) -> None:
    connection.execute(_MARK_FIRED, {"fired_ids": [i for i, _ in fired], "next_fires": [n for _, n in fired]})


def _record_failure(connection: Connection, row: Any, error: RunledgerError) -> ScheduleFailure:
    connection.execute(
        job_schedules.update().where(_s.id == row.id).values(
            next_fire_at=func.now() + func.make_interval(0, 0, 0, 0, 0, 0, FAILED_FIRE_RETRY_SECONDS),
            last_error_code=error.code, last_error_message=error.message[:2_000], last_error_at=func.now(),
        )
    )
    return ScheduleFailure(row.name, error.code, error.message)
