"""The statements of one lease's transitions: success, failure (retry or dead letter), unstarted release.

The store's single-lease writes (:mod:`runledger_sync.store.attempt.ends`) and the
reaper build their statements here, each with its own guard, so a transition is
written the same way whoever makes it; and the one read a failure's dead-letter
rule needs besides the row (:func:`earlier_attempts`). The worker's grouped
outcomes are written by :mod:`runledger_sync.store.attempt.outcomes`.
"""

from __future__ import annotations

from typing import Any, Sequence
from uuid import UUID

from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    Text,
    bindparam,
    case,
    cast,
    func,
    literal,
    null,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.evidence import NO_EVIDENCE, FailureEvidence, bounded_error_type, bounded_traceback
from runledger_sync.core.outcomes import EarlierAttempts
from runledger_sync.core.types import ClaimOrigin, JobEventType, JobFailure
from runledger_sync.core.states import JobStage, JobStatus
from runledger_sync.db.schema import job_attempts, job_dead_letters, job_events, job_queue
from runledger_sync.store.attempt.fence import held_under, one_lease
from runledger_sync.store.notify import notify_ended
from runledger_sync.store.prepared import PreparedStatement
from runledger_sync.store.rows import JOB_COLUMNS
from runledger_sync.store.sql import attempt_of, event_insert, full_event_log, milliseconds, ordinals

_q = job_queue.c
_a = job_attempts.c
_LEASED = JobStatus.LEASED.value


def build_running(guard: Any, *, returning: Sequence[Any]) -> Any:
    """The write of stage ``running`` with the attempt's execution marker and (full event log) its event.

    ``returning`` must hold the id, run, attempt, stage and progress columns the attempt and event rows use.
    """
    running = (
        job_queue.update()
        .where(guard)
        .values(stage=JobStage.RUNNING.value)
        .returning(*returning)
        .cte("running")
    )
    marker = (
        job_attempts.update()
        .where(attempt_of(running), _a.execution_started_persisted_at.is_(None))
        .values(execution_started_persisted_at=func.now())
        .cte("execution_marker")
    )
    events = event_insert(
        running,
        running.c.id, running.c.run_number, running.c.attempt, literal(JobEventType.STAGE_CHANGED.value),
        running.c.stage, running.c.progress_done, running.c.progress_total, func.jsonb_build_object(),
        where=full_event_log(),
    ).cte("running_events")
    return select(*running.c).add_cte(marker, events)


def build_success(
    guard: Any, *, done: Any, total: Any, checkpoint: Any, output: Any, returning: Sequence[Any] = JOB_COLUMNS,
) -> Any:
    """The SUCCEEDED write with its attempt and event rows; the new values are columns or binds.

    ``returning`` must hold the id, run, attempt, stage and progress columns the attempt and event rows use.
    """
    succeeded = (
        job_queue.update()
        .where(guard)
        .values(
            status=JobStatus.SUCCEEDED.value,
            lease_expires_at=None,
            last_heartbeat_at=None,
            worker_id=None,
            finished_at=func.now(),
            stage=JobStage.COMPLETED.value,
            progress_done=func.coalesce(done, _q.progress_done),
            progress_total=func.coalesce(total, _q.progress_total),
            checkpoint=func.coalesce(checkpoint, _q.checkpoint),
            output=output,
            status_reason=None,
            last_error_code=None,
            last_error_message=None,
        )
        .returning(*returning)
        .cte("succeeded")
    )
    attempt = (
        job_attempts.update()
        .where(attempt_of(succeeded))
        .values(finished_at=func.now(), outcome=None, error_code=None, error_message=None, retry_delay_ms=None)
        .cte("finished_attempt")
    )
    events = event_insert(
        succeeded,
        succeeded.c.id, succeeded.c.run_number, succeeded.c.attempt, literal(JobEventType.SUCCEEDED.value),
        succeeded.c.stage, succeeded.c.progress_done, succeeded.c.progress_total, func.jsonb_build_object(),
    ).cte("succeeded_event")
    return select(*succeeded.c).add_cte(attempt, events).where(notify_ended(succeeded))


def one_failure() -> dict[str, Any]:
    """The failure values of a single write, as bound values (see :func:`failure_params`)."""
    return {
        "kind": bindparam("kind", type_=Text),
        "code": bindparam("code", type_=Text),
        "message": bindparam("message", type_=Text),
        "retry_delay": bindparam("retry_delay", type_=BigInteger),
        # Decided before the write, by the one rule (core.outcomes.dead_letter_reason).
        "dead_letter": bindparam("dead_letter", type_=Boolean),
        "event_extra": bindparam("event_extra", type_=Text),
        # The failing exception's, for the attempt row (None when no exception caused the failure).
        "error_type": bindparam("error_type", type_=Text),
        "traceback": bindparam("traceback", type_=Text),
    }


def build_failure(guard: Any) -> Any:
    """The retry-or-dead-letter write of one lease, shared by the worker's single write and the reaper (expired).

    The failure's values (``kind``, ``code``, ``message``, ``retry_delay``,
    ``dead_letter``, ``event_extra``, ``error_type``, ``traceback``) are bound
    values (:func:`one_failure`). The failed row returns them beside the job's
    columns, so the attempt, dead-letter and event rows take them from it.
    """
    values = one_failure()
    dead = values["dead_letter"]
    failed = (
        job_queue.update()
        .where(guard)
        .values(
            status=case((dead, JobStatus.DEAD_LETTERED.value), else_=JobStatus.PENDING.value),
            next_run_at=case((dead, _q.next_run_at), else_=func.now() + milliseconds(values["retry_delay"])),
            finished_at=case((dead, func.now()), else_=_q.finished_at),
            lease_expires_at=None,
            last_heartbeat_at=None,
            worker_id=None,
            status_reason=values["kind"],
            last_error_code=values["code"],
            last_error_message=values["message"],
        )
        .returning(*JOB_COLUMNS, *(values[name].label(f"failure_{name}") for name in (
            "kind", "code", "message", "retry_delay", "event_extra", "error_type", "traceback")))
        .cte("failed")
    )
    kind, code, message = failed.c.failure_kind, failed.c.failure_code, failed.c.failure_message
    delay_ms = failed.c.failure_retry_delay
    is_dead = failed.c.status == JobStatus.DEAD_LETTERED.value
    attempt = (
        job_attempts.update()
        .where(attempt_of(failed))
        .values(
            finished_at=func.now(),
            outcome=kind,
            error_code=code,
            error_message=message,
            retry_delay_ms=case((is_dead, null()), else_=delay_ms),
            error_type=failed.c.failure_error_type,
            traceback=failed.c.failure_traceback,
        )
        .cte("failed_attempt")
    )
    dead_letter_insert = pg_insert(job_dead_letters).from_select(
        ["job_id", "job_type", "organization_id", "run_number", "attempt", "error_code", "error_message",
         "payload_snapshot", "checkpoint_snapshot"],
        select(
            failed.c.id, failed.c.job_type, failed.c.organization_id, failed.c.run_number, failed.c.attempt,
            code, message, failed.c.payload, failed.c.checkpoint,
        ).where(is_dead),
    )
    excluded = dead_letter_insert.excluded
    dead_letter = dead_letter_insert.on_conflict_do_update(
        index_elements=[job_dead_letters.c.job_id],
        set_={
            name: excluded[name]
            for name in ("job_type", "organization_id", "run_number", "attempt", "error_code", "error_message",
                         "payload_snapshot", "checkpoint_snapshot")
        }
        | {"failed_at": func.now()},
    ).cte("dead_letter")
    extra = cast(failed.c.failure_event_extra, JSONB)
    kinds = ordinals(2)
    event_type = case(
        (kinds.c.ord == 1, JobEventType.FAILED.value),
        (is_dead, JobEventType.DEAD_LETTERED.value),
        else_=JobEventType.RETRY_SCHEDULED.value,
    )
    payload = case(
        (kinds.c.ord == 1, func.jsonb_build_object("kind", kind, "error_code", code, "error_message", message)),
        (is_dead, func.jsonb_build_object("kind", kind, "error_code", code)),
        else_=func.jsonb_build_object("kind", kind, "retry_delay_ms", delay_ms, "next_run_at", failed.c.next_run_at),
    ).op("||")(extra)
    events = job_events.insert().from_select(
        ["job_id", "run_number", "attempt", "event_type", "stage", "progress_done", "progress_total", "payload"],
        select(
            failed.c.id, failed.c.run_number, failed.c.attempt, event_type, failed.c.stage,
            failed.c.progress_done, failed.c.progress_total, payload,
        )
        .select_from(failed.join(kinds, true()))
        .order_by(kinds.c.ord),
    ).cte("failure_events")
    # Only a dead letter notifies: a retry is not an end.
    return select(*failed.c).add_cte(attempt, dead_letter, events).where(notify_ended(failed))


def failure_params(
    failure: JobFailure, delay_ms: int, extra: dict[str, Any], evidence: FailureEvidence = NO_EVIDENCE,
) -> dict[str, Any]:
    """The failure statement's values but ``dead_letter``, which the writer adds once it has read the row."""
    # The code, message and evidence are made storable, not refused: a handler's
    # message often repeats a file name or an upstream reply, and a refused write
    # would lose the failure (the lease would expire and the job run again).
    return {
        "kind": failure.kind.value,
        "code": check.check_failure_code(failure.code),
        "message": check.storable_text(str(failure.message)),
        "retry_delay": delay_ms,
        "event_extra": check.serialize_json("event", extra),
        "error_type": None if evidence.error_type is None else bounded_error_type(str(evidence.error_type)),
        "traceback": None if evidence.traceback is None else bounded_traceback(str(evidence.traceback)),
    }


_EARLIER_CODES = (
    select(_a.error_code)
    .where(
        _a.job_id == bindparam("job_id", type_=PG_UUID(as_uuid=True)),
        _a.run_number == bindparam("run_number", type_=Integer),
        _a.attempt < bindparam("attempt", type_=Integer),
    )
    .order_by(_a.attempt)
)


def earlier_attempts(connection: Connection, job_id: UUID, run_number: int, attempt: int) -> EarlierAttempts:
    """The run's attempts before claim number ``attempt``, as the dead-letter rule counts them.

    One row per earlier attempt of the run, read by the attempts' unique index.
    """
    codes = connection.execute(_EARLIER_CODES, {"job_id": job_id, "run_number": run_number, "attempt": attempt})
    return EarlierAttempts.of(codes.scalars())


def build_release() -> Any:
    job_id, run_number, attempt, worker_id = one_lease()
    unstarted_attempt = (
        select(_a.id)
        .where(
            _a.job_id == job_id,
            _a.run_number == run_number,
            _a.attempt == attempt,
            _a.claim_origin == ClaimOrigin.WORKER_PRESTART.value,
            _a.execution_started_persisted_at.is_(None),
        )
        .scalar_subquery()
    )
    released = (
        job_queue.update()
        # No live-lease test: handing back an unstarted claim is what the reaper does
        # once the lease has run out, so an expired lease changes nothing here.
        .where(held_under(job_id, run_number, attempt, worker_id), unstarted_attempt.is_not(None))
        .values(
            status=JobStatus.PENDING.value,
            attempt=_q.attempt - 1,
            lease_expires_at=None,
            last_heartbeat_at=None,
            worker_id=None,
            next_run_at=func.now() + milliseconds("delay_ms"),
            started_at=case((_q.attempt == 1, null()), else_=_q.started_at),
            status_reason=None,
            last_error_code=None,
            last_error_message=None,
        )
        .returning(*JOB_COLUMNS)
        .cte("released")
    )
    removed = (
        job_attempts.delete()
        # Keyed by the bound lease, not joined to the released row: a join could be
        # planned, once, as a walk over the whole attempts index.
        .where(
            _a.job_id == job_id,
            _a.run_number == run_number,
            _a.attempt == attempt,
            select(released.c.id).scalar_subquery().is_not(None),
        )
        .cte("removed_attempt")
    )
    events = event_insert(
        released,
        released.c.id, released.c.run_number, attempt, literal(JobEventType.REQUEUED.value),
        released.c.stage, null(), null(), func.jsonb_build_object("reason", bindparam("reason", type_=Text)),
    ).cte("released_event")
    return select(*released.c).add_cte(removed, events)


RELEASE = PreparedStatement("release", build_release())
