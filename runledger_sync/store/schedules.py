"""Cron schedules: write, read, pause, resume, trigger, delete, and sync those declared in code (spec section 8).

The scheduler's tick, which turns due schedules into jobs, is in
:mod:`runledger_sync.store.maintenance.schedule_tick`. A write that moves an active
schedule's next fire notifies the scheduler loops (``runledger_schedules``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime, timezone
from typing import Any, Optional, Sequence
from uuid import UUID

from sqlalchemy import Text, bindparam, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.cron import names_no_time_after, next_fire_at, parse_cron
from runledger_sync.core.encryption import SealedValue
from runledger_sync.core.encryption_errors import DecryptionFailed, EncryptionKeyMissing
from runledger_sync.core.errors import InvalidArgument, ScheduleDeclaredInCode, ScheduleNotFound
from runledger_sync.core.ids import uuid7
from runledger_sync.core.records import (
    SCHEDULE_NAME_MAX_LENGTH,
    JobRecord,
    JobSpec,
    ScheduleRecord,
    ScheduleSpec,
)
from runledger_sync.core.store_errors import DefinitionNotFound
from runledger_sync.core.states import JobStage
from runledger_sync.db.schema import job_definitions
from runledger_sync.db.schema_schedules import job_schedules
from runledger_sync.store.binds import Bind
from runledger_sync.store.transactions import run_in_transaction
from runledger_sync.store.enqueue.enqueue import enqueue_many
from runledger_sync.store.notify import notify_schedules_changed
from runledger_sync.store.sealing import opened, sealed_object

_s = job_schedules.c
SCHEDULE_COLUMNS = tuple(job_schedules.c[f.name] for f in fields(ScheduleRecord))


def _to_schedule(row: Any) -> ScheduleRecord:
    """A schedule row as a record, its template opened here (or a SealedValue naming the key this process lacks)."""
    values = {f.name: row._mapping[f.name] for f in fields(ScheduleRecord)}
    values["payload_template"] = opened(row.payload_template, row.id)
    return ScheduleRecord(**values)


def _stored_template(spec: ScheduleSpec, schedule_id: UUID) -> Any:
    """The template as written: sealed for the schedule's id when keys are configured."""
    return sealed_object(spec.template, check.serialize_json("payload_template", spec.template), schedule_id)


# -- writes ---------------------------------------------------------------------

_LOCK_BY_NAME = select(*SCHEDULE_COLUMNS, func.now().label("db_now")).where(
    _s.name == bindparam("name", type_=Text)).with_for_update()
_NOW = select(func.now())
# KEY SHARE: the definition cannot be deleted before the schedule that names it commits.
_DEFINITION = select(job_definitions.c.job_type).where(
    job_definitions.c.job_type == bindparam("job_type", type_=Text)).with_for_update(key_share=True)


def upsert_schedule(
    bind: Bind,
    name: str,
    *,
    cron_expr: str,
    job_type: str,
    payload_template: Any = None,
    organization_id: Optional[str] = None,
    is_active: Optional[bool] = True,
    max_jitter_seconds: int = 0,
    timezone: str = "UTC",
    source: str = "api",
) -> ScheduleRecord:
    """Create or replace the schedule called ``name``.

    Its next fire is computed afresh when it is new, when its timing (cron, zone,
    jitter) changed, or when it is made active again; otherwise the stored one is
    kept, so writing the same schedule at every deploy never skips a due fire.

    Args:
        bind: an Engine (committed here), or a Connection whose transaction the call joins.
        cron_expr: 5 fields (crontab), 6-7 seconds first (Runledger), or an @-nickname.
        payload_template: the payload of each job, plus a ``_schedule`` key.
        is_active: False writes it paused; None keeps a stored schedule's pause as it is.
        timezone: the IANA zone the cron's wall-clock times are in.

    Raises:
        InvalidCron, InvalidTimezone, InvalidArgument, InvalidPayload: nothing written.
        DefinitionNotFound: ``job_type`` has no definition (the message names the schedule and the type).
    """
    spec = ScheduleSpec(name, cron_expr, job_type, payload_template, organization_id, max_jitter_seconds,
                        timezone).checked()
    if is_active is not None and not isinstance(is_active, bool):
        raise InvalidArgument("is_active", is_active, "True, False or None")
    return run_in_transaction(bind, lambda connection: _upsert(connection, spec, is_active, source))


def _upsert(connection: Connection, spec: ScheduleSpec, is_active: Optional[bool], source: str) -> ScheduleRecord:
    values = {
        "job_type": spec.job_type, "organization_id": spec.organization_id,
        "cron_expr": spec.cron_expr, "timezone": spec.timezone,
        "max_jitter_seconds": spec.max_jitter_seconds, "source": source,
    }
    if connection.execute(_DEFINITION, {"job_type": spec.job_type}).first() is None:
        # Checked here rather than left to the foreign key, whose message names neither.
        raise DefinitionNotFound(
            f"schedule {spec.name!r} names job type {spec.job_type!r}, which has no definition: register a handler "
            "for it (registry.job) and sync the definitions (registry.sync_definitions, or start a worker) first",
            schedule_name=spec.name, job_type=spec.job_type,
        )
    current = connection.execute(_LOCK_BY_NAME, {"name": spec.name}).first()
    if current is None:
        new_id = uuid7()
        now = connection.execute(_NOW).scalar_one()
        inserted = connection.execute(
            pg_insert(job_schedules)
            .values(id=new_id, name=spec.name, is_active=True if is_active is None else is_active,
                    next_fire_at=_next_or_refuse(spec, new_id, now),
                    payload_template=_stored_template(spec, new_id), **values)
            .on_conflict_do_nothing(index_elements=[_s.name])
            .returning(*SCHEDULE_COLUMNS)
        ).first()
        if inserted is not None:
            if inserted.is_active:
                notify_schedules_changed(connection)
            return _to_schedule(inserted)
        # Written meanwhile by another upsert: replace it like any stored one.
        current = connection.execute(_LOCK_BY_NAME, {"name": spec.name}).one()
    active = current.is_active if is_active is None else is_active
    timing_changed = (current.cron_expr, current.timezone, current.max_jitter_seconds) != (
        spec.cron_expr, spec.timezone, spec.max_jitter_seconds)
    woken = active and not current.is_active
    moved = active and (timing_changed or woken)
    next_at = _next_or_refuse(spec, current.id, current.db_now) if timing_changed or woken else current.next_fire_at
    if moved:
        notify_schedules_changed(connection)
    row = connection.execute(
        job_schedules.update().where(_s.id == current.id)
        .values(is_active=active, next_fire_at=next_at, payload_template=_stored_template(spec, current.id), **values)
        .returning(*SCHEDULE_COLUMNS)
    ).one()
    return _to_schedule(row)


def next_fire(spec: ScheduleSpec, schedule_id: UUID, now: datetime) -> Optional[datetime]:
    """A schedule's first fire after ``now``, jitter included; None when its cron names no later instant."""
    return next_fire_at(parse_cron(spec.cron_expr, spec.timezone), schedule_id, spec.max_jitter_seconds, now)


def _next_or_refuse(spec: ScheduleSpec, schedule_id: UUID, now: datetime) -> datetime:
    """The next fire of a schedule being written or resumed; one that could never fire is refused."""
    next_at = next_fire(spec, schedule_id, now)
    if next_at is None:
        raise names_no_time_after(spec.name, spec.cron_expr, now)
    return next_at


def pause_schedule(bind: Bind, name: str) -> ScheduleRecord:
    """Stop a schedule firing until it is resumed.

    Raises:
        ScheduleNotFound: no schedule has this name.
    """
    return _set_active(bind, name, False)


def resume_schedule(bind: Bind, name: str) -> ScheduleRecord:
    """Let a paused schedule fire again, from its first instant after now (missed ones are not fired).

    Raises:
        ScheduleNotFound: no schedule has this name.
        InvalidCron: its cron names no instant after now (it has finished).
    """
    return _set_active(bind, name, True)


def _set_active(bind: Bind, name: str, active: bool) -> ScheduleRecord:
    check.check_text("name", name, max_length=SCHEDULE_NAME_MAX_LENGTH)

    def work(connection: Connection) -> ScheduleRecord:
        current = _locked(connection, name)
        next_at = current.next_fire_at
        if active and not current.is_active:
            next_at = _next_or_refuse(spec_of(current), current.id, current.db_now)
            notify_schedules_changed(connection)
        row = connection.execute(
            job_schedules.update().where(_s.id == current.id)
            .values(is_active=active, next_fire_at=next_at).returning(*SCHEDULE_COLUMNS)
        ).one()
        return _to_schedule(row)

    return run_in_transaction(bind, work)


def delete_schedule(bind: Bind, name: str, *, force: bool = False) -> ScheduleRecord:
    """Delete a schedule; the jobs it enqueued stay.

    A schedule declared in code (``source`` ``code``) is refused unless ``force``:
    the next ``sync_definitions`` of code that still declares it would write it
    again. Pause it instead (sync keeps a pause), or remove it from the code
    and then delete it with ``force=True``.

    Returns:
        The schedule as it was.

    Raises:
        ScheduleNotFound: no schedule has this name.
        ScheduleDeclaredInCode: it is declared in code and ``force`` is False; nothing is deleted.
    """
    check.check_text("name", name, max_length=SCHEDULE_NAME_MAX_LENGTH)
    if not isinstance(force, bool):
        raise InvalidArgument("force", force, "True or False")

    def work(connection: Connection) -> ScheduleRecord:
        current = _locked(connection, name)
        if current.source == "code" and not force:
            raise ScheduleDeclaredInCode(
                f"schedule {name!r} is declared in code (registry.schedule): the next sync_definitions would write "
                "it again. Pause it instead (a pause is kept), or remove it from the code and then delete it "
                "with force=True (--force)",
                schedule_name=name,
            )
        row = connection.execute(job_schedules.delete().where(_s.id == current.id).returning(*SCHEDULE_COLUMNS)).one()
        return _to_schedule(row)

    return run_in_transaction(bind, work)


def trigger_schedule(bind: Bind, name: str) -> JobRecord:
    """Enqueue one extra fire of a schedule now, paused or not; its next fire is unchanged.

    Raises:
        ScheduleNotFound: no schedule has this name.
        DefinitionNotFoundOrDisabled: its job type is unknown or disabled.
    """
    check.check_text("name", name, max_length=SCHEDULE_NAME_MAX_LENGTH)

    def work(connection: Connection) -> JobRecord:
        current = _locked(connection, name)
        [job] = enqueue_many(connection, [fire_job_spec(current, current.db_now)])
        connection.execute(job_schedules.update().where(_s.id == current.id).values(last_fired_at=func.now()))
        return job

    return run_in_transaction(bind, work)


def _locked(connection: Connection, name: str) -> Any:
    row = connection.execute(_LOCK_BY_NAME, {"name": name}).first()
    if row is None:
        raise ScheduleNotFound(f"no schedule is named {name!r}")
    return row


# -- reads ----------------------------------------------------------------------


def get_schedule(bind: Bind, name: str) -> Optional[ScheduleRecord]:
    """Return the schedule called ``name``, or None."""
    check.check_text("name", name, max_length=SCHEDULE_NAME_MAX_LENGTH)
    statement = select(*SCHEDULE_COLUMNS).where(_s.name == name)
    return run_in_transaction(bind, lambda connection: _first(connection.execute(statement).first()))


def _first(row: Any) -> Optional[ScheduleRecord]:
    return None if row is None else _to_schedule(row)


def list_schedules(bind: Bind, active: Optional[bool] = None) -> list[ScheduleRecord]:
    """Return every schedule (or only the active or the paused ones), by name."""
    statement = select(*SCHEDULE_COLUMNS).order_by(_s.name)
    if active is not None:
        statement = statement.where(_s.is_active.is_(bool(active)))
    return run_in_transaction(bind, lambda connection: [_to_schedule(r) for r in connection.execute(statement)])


# -- what a fire is (shared with the tick, store/maintenance/schedule_tick.py) ---------------


def spec_of(row: Any) -> ScheduleSpec:
    """The timing and target of a stored schedule row, as its next fire is computed from."""
    return ScheduleSpec(row.name, row.cron_expr, row.job_type, timezone=row.timezone,
                        max_jitter_seconds=row.max_jitter_seconds)


def fire_job_spec(row: Any, scheduled_for: datetime) -> JobSpec:
    """The job of one fire: the template plus ``_schedule`` (a non-object template is wrapped).

    Raises:
        EncryptionKeyMissing, DecryptionFailed: the template is sealed under a key this process
            lacks, or that does not open it; the tick keeps the schedule due (its failure path).
    """
    template = opened(row.payload_template, row.id)
    if isinstance(template, SealedValue):
        error = EncryptionKeyMissing if template.problem == "missing" else DecryptionFailed
        raise error(f"schedule {row.name!r} cannot fire here: its payload template's {template}",
                    key_id=template.key_id)
    marker = {
        "schedule_id": str(row.id),
        "schedule_name": row.name,
        "scheduled_for": scheduled_for.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }
    payload = {**template, "_schedule": marker} if isinstance(template, dict) else {"payload": template,
                                                                                   "_schedule": marker}
    return JobSpec(row.job_type, payload, organization_id=row.organization_id, stage=JobStage.SCHEDULED)


@dataclass(frozen=True)
class DeclaredScheduleSync:
    """What writing the schedules declared in code did."""

    written: tuple[ScheduleRecord, ...]
    #: Schedules of these job types written from code before, which the code no longer declares.
    undeclared: tuple[ScheduleRecord, ...]
    #: True when those were paused (``deactivate_undeclared``).
    deactivated: bool


def sync_declared_schedules(
    bind: Bind, declared: Sequence[ScheduleSpec], *, job_types: Sequence[str], deactivate_undeclared: bool = False,
) -> DeclaredScheduleSync:
    """Write the schedules declared in code, in one transaction; find those the code dropped.

    A declared schedule keeps an operator's pause; only its definition is replaced.
    A schedule written from code earlier, of one of ``job_types``, that the code no
    longer declares is reported, and paused only with ``deactivate_undeclared``:
    another process, running older code, may still declare it.
    """
    checked = [spec.checked() for spec in declared]
    names = [spec.name for spec in checked]
    undeclared_query = select(*SCHEDULE_COLUMNS).where(
        _s.source == "code",
        _s.job_type.in_(bindparam("job_types", list(job_types), expanding=True)),
        _s.name.not_in(bindparam("declared", names, expanding=True)),
    ).order_by(_s.name).with_for_update()

    def work(connection: Connection) -> DeclaredScheduleSync:
        written = tuple(_upsert(connection, spec, None, "code") for spec in checked)
        undeclared = tuple(_to_schedule(row) for row in connection.execute(undeclared_query)) if job_types else ()
        if undeclared and deactivate_undeclared:
            connection.execute(job_schedules.update().where(_s.id.in_([s.id for s in undeclared])).values(
                is_active=False))
        return DeclaredScheduleSync(written, undeclared, bool(undeclared) and deactivate_undeclared)

    return run_in_transaction(bind, work)
