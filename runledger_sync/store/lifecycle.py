"""The worker's fenced writes to one claimed job: mark running, progress, heartbeat, success, failure, release.

Every one goes through the lease fence of :mod:`runledger_sync.store._fence`:
the row is locked first, then written by one statement that judges the lease
as the last committer left it and writes the attempt and event rows the step
implies. The claim is in :mod:`~runledger_sync.store.claim`, the grouped writes
in :mod:`~runledger_sync.store.lifecycle_batch`, the reaper's recovery in
:mod:`~runledger_sync.store.reaper`; their functions are importable from here
too, the store's lifecycle as one name space.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence
from uuid import UUID

from sqlalchemy import (
    BigInteger,
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
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.errors import (
    InvalidCompletionProgress,
    InvalidLeaseDuration,
    InvalidProgress,
    LeaseOwnerMismatch,
    UnstartedClaimReleaseNotApplicable,
)
from runledger_sync.core.outcomes import LEASE_EXPIRED_CODE, LEASE_EXPIRED_MESSAGE, dead_letter_reason
from runledger_sync.core.records import JobRecord, LeaseIdentity
from runledger_sync.core.types import (
    EventLog,
    JobCompletion,
    JobEventType,
    JobFailure,
    JobStage,
    JobStatus,
)
from runledger_sync.db.schema import job_attempts, job_events, job_queue
from runledger_sync.store._binds import Bind
from runledger_sync.store._errors import run_in_transaction
from runledger_sync.store._fence import LOCK_LEASES, lease_mismatch, lease_params, live_lease, one_lease, write_fenced
from runledger_sync.store._prepared import PreparedStatement
from runledger_sync.store._rows import JOB_COLUMNS, to_job
from runledger_sync.store._sql import attempt_of, check_identity, event_insert, ordinals, seconds
from runledger_sync.store._sql import event_log_params, full_event_log
from runledger_sync.store._transitions import RELEASE, build_failure, build_success, failure_params
from runledger_sync.store._workflow_steps import job_ends, jobs_ended, steps_handed_back
from runledger_sync.store.claim import MAX_CLAIM_LIMIT, claim_jobs, claim_prestart_jobs_for_types
from runledger_sync.store.reaper import LEASE_EXPIRED_BEFORE_RUNNING_PERSISTED, reap_expired_leases

__all__ = [
    "DEFAULT_HEARTBEAT_LOCK_TIMEOUT_MS",
    "LEASE_EXPIRED_BEFORE_RUNNING_PERSISTED",
    "LEASE_EXPIRED_CODE",
    "LEASE_EXPIRED_MESSAGE",
    "MAX_CLAIM_LIMIT",
    "LeaseIdentity",
    "claim_jobs",
    "claim_prestart_jobs_for_types",
    "complete_job_failure",
    "complete_job_success",
    "heartbeat_job",
    "lease_mismatch",
    "mark_job_running",
    "reap_expired_leases",
    "release_unstarted_job_claim",
    "update_job_progress",
]

DEFAULT_HEARTBEAT_LOCK_TIMEOUT_MS = 5_000

_q = job_queue.c
_a = job_attempts.c
_LEASED = JobStatus.LEASED.value


def _build_progress_update() -> Any:
    stage = bindparam("new_stage", type_=Text)
    done = bindparam("new_progress_done", type_=BigInteger)
    total = bindparam("new_progress_total", type_=BigInteger)
    checkpoint = cast(bindparam("new_checkpoint", type_=Text), JSONB)
    updated = (
        job_queue.update()
        .where(live_lease(*one_lease()))
        .values(
            stage=func.coalesce(stage, _q.stage),
            progress_done=func.coalesce(done, _q.progress_done),
            progress_total=func.coalesce(total, _q.progress_total),
            checkpoint=func.coalesce(checkpoint, _q.checkpoint),
        )
        .returning(*JOB_COLUMNS)
        .cte("updated")
    )
    marker = (
        job_attempts.update()
        .where(
            attempt_of(updated),
            _a.execution_started_persisted_at.is_(None),
            bindparam("new_stage", type_=Text) == JobStage.RUNNING.value,
        )
        .values(execution_started_persisted_at=func.now())
        .cte("execution_marker")
    )
    kinds = ordinals(2)
    # STAGE_CHANGED to running belongs to the full event log only; other stages are always logged.
    stage_logged = stage.is_not(None) & (full_event_log() | (stage != JobStage.RUNNING.value))
    wanted = case((kinds.c.ord == 1, stage_logged), else_=done.is_not(None) | total.is_not(None))
    event_type = case((kinds.c.ord == 1, JobEventType.STAGE_CHANGED.value), else_=JobEventType.PROGRESS.value)
    events = job_events.insert().from_select(
        ["job_id", "run_number", "attempt", "event_type", "stage", "progress_done", "progress_total", "payload"],
        select(
            updated.c.id, updated.c.run_number, updated.c.attempt, event_type, updated.c.stage,
            updated.c.progress_done, updated.c.progress_total, func.jsonb_build_object(),
        )
        .select_from(updated.join(kinds, true()))
        .where(wanted)
        .order_by(kinds.c.ord),
    ).cte("progress_events")
    return select(*updated.c).add_cte(marker, events)


_PROGRESS_UPDATE = PreparedStatement("progress", _build_progress_update())


def update_job_progress(
    bind: Bind,
    *,
    job_id: UUID,
    run_number: int,
    attempt: int,
    worker_id: str,
    stage: Optional[JobStage] = None,
    progress_done: Optional[int] = None,
    progress_total: Optional[int] = None,
    checkpoint: Any = None,
    event_log: EventLog | str = EventLog.FULL,
) -> JobRecord:
    """Record stage, progress and checkpoint under the lease; None keeps a stored value.

    Setting stage ``running`` also stamps the attempt's execution marker, after
    which the claim can no longer be released unstarted.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        event_log: ``transitions`` leaves out the STAGE_CHANGED event of stage
            ``running``; other stages and PROGRESS events are written at either level.

    Raises:
        InvalidArgument: ``event_log`` is not a level of :class:`EventLog`.
        LeaseOwnerMismatch: the lease is not this worker's or has expired.
        InvalidProgress: the values, or the values merged with stored ones, are invalid.
    """
    identity = check_identity(job_id, run_number, attempt, worker_id)
    check.check_progress_values(progress_done, progress_total, completion=False)
    params = identity.params() | {
        "new_stage": None if stage is None else JobStage(stage).value,
        "new_progress_done": progress_done,
        "new_progress_total": progress_total,
        "new_checkpoint": None if checkpoint is None else check.serialize_json("checkpoint", checkpoint),
    } | event_log_params(event_log)
    return run_in_transaction(bind, lambda connection: _guarded_write(connection, _PROGRESS_UPDATE, params, identity))


def mark_job_running(bind: Bind, identity: LeaseIdentity, *, event_log: EventLog | str = EventLog.FULL) -> JobRecord:
    """Persist stage ``running`` for a claimed job: the step before its handler starts.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        event_log: ``full`` writes a STAGE_CHANGED event; ``transitions`` does not
            (the worker passes ``JobsConfig.event_log``).
    """
    return update_job_progress(bind, **identity.keywords(), stage=JobStage.RUNNING, event_log=event_log)


def _guarded_write(
    connection: Connection, statement: PreparedStatement, params: dict[str, Any], identity: LeaseIdentity,
    *, settings: Sequence[PreparedStatement] = (),
) -> JobRecord:
    row = write_fenced(connection, (statement,), [identity], params, settings=settings).first()
    if row is None:
        raise lease_mismatch(identity)
    return to_job(row)


def _build_heartbeat() -> Any:
    renewed = (
        job_queue.update()
        .where(live_lease(*one_lease()))
        .values(lease_expires_at=func.now() + seconds("lease_seconds"), last_heartbeat_at=func.now())
        .returning(*JOB_COLUMNS)
        .cte("renewed")
    )
    events = event_insert(
        renewed,
        renewed.c.id, renewed.c.run_number, renewed.c.attempt, literal(JobEventType.HEARTBEAT.value), renewed.c.stage,
        null(), null(), func.jsonb_build_object("worker_id", renewed.c.worker_id),
        where=full_event_log(),
    ).cte("heartbeat_event")
    return select(*renewed.c).add_cte(events)


_HEARTBEAT = PreparedStatement("heartbeat", _build_heartbeat())
_LOCK_TIMEOUT = PreparedStatement(
    "lock_timeout", select(func.set_config("lock_timeout", bindparam("lock_timeout", type_=Text), True))
)


def heartbeat_job(
    bind: Bind,
    *,
    job_id: UUID,
    run_number: int,
    attempt: int,
    worker_id: str,
    lease_ttl_seconds: float,
    lock_timeout_ms: int = DEFAULT_HEARTBEAT_LOCK_TIMEOUT_MS,
    event_log: EventLog | str = EventLog.FULL,
) -> JobRecord:
    """Extend a live lease to now + ``lease_ttl_seconds``.

    The row-lock wait is capped at ``lock_timeout_ms`` so a heartbeat stuck
    behind another transaction fails (``db.query_failed``) instead of hanging.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        event_log: ``full`` writes a HEARTBEAT event; ``transitions`` does not
            (the worker passes ``JobsConfig.event_log``).

    Raises:
        LeaseOwnerMismatch: the lease is not this worker's or has expired.
        StoreError: the lock wait timed out.
    """
    identity = check_identity(job_id, run_number, attempt, worker_id)
    if not isinstance(lease_ttl_seconds, (int, float)) or not lease_ttl_seconds > 0:
        raise InvalidLeaseDuration(f"lease_ttl_seconds must be greater than zero, got {lease_ttl_seconds!r}")
    check.check_int("lock_timeout_ms", lock_timeout_ms, (1, 3_600_000))
    params = identity.params() | {"lease_seconds": float(lease_ttl_seconds), "lock_timeout": f"{lock_timeout_ms}ms"}
    params |= event_log_params(event_log)

    return run_in_transaction(
        bind, lambda connection: _guarded_write(connection, _HEARTBEAT, params, identity, settings=(_LOCK_TIMEOUT,))
    )

_SUCCESS = PreparedStatement("success", build_success(
    live_lease(*one_lease()),
    done=bindparam("new_progress_done", type_=BigInteger),
    total=bindparam("new_progress_total", type_=BigInteger),
    checkpoint=cast(bindparam("new_checkpoint", type_=Text), JSONB),
    output=cast(bindparam("new_output", type_=Text), JSONB),
))


def complete_job_success(
    bind: Bind,
    *,
    job_id: UUID,
    run_number: int,
    attempt: int,
    worker_id: str,
    completion: Optional[JobCompletion] = None,
) -> JobRecord:
    """Finish a leased job as SUCCEEDED, storing the completion's progress, checkpoint and output.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).

    Raises:
        InvalidCompletionProgress: the completion's progress, alone or merged with
            the stored progress, is negative or has done > total; nothing written.
        LeaseOwnerMismatch: the lease is not this worker's or has expired.
    """
    identity = check_identity(job_id, run_number, attempt, worker_id)
    completion = completion or JobCompletion()
    check.check_progress_values(completion.progress_done, completion.progress_total, completion=True)
    params = identity.params() | {
        "new_progress_done": completion.progress_done,
        "new_progress_total": completion.progress_total,
        "new_checkpoint": None if completion.checkpoint is None else check.serialize_json("checkpoint", completion.checkpoint),
        "new_output": None if completion.output is None else check.serialize_json("output", completion.output),
    }

    def work(connection: Connection) -> JobRecord:
        record = _guarded_write(connection, _SUCCESS, params, identity)
        if record.workflow_step_id is not None:
            jobs_ended(connection, job_ends([record]))
        return record

    try:
        return run_in_transaction(bind, work)
    except InvalidProgress as exc:
        # The CHECK constraint judged the completion merged with the stored progress.
        raise InvalidCompletionProgress(
            "Handler returned invalid success progress: merged with the stored progress, "
            "progress_done would exceed progress_total."
        ) from exc

_FAILURE = PreparedStatement("failure", build_failure(live_lease(*one_lease())))


def complete_job_failure(
    bind: Bind,
    *,
    job_id: UUID,
    run_number: int,
    attempt: int,
    worker_id: str,
    failure: JobFailure,
    retry_delay_ms: Optional[int],
) -> JobRecord:
    """Record a failed attempt: retry after ``retry_delay_ms``, or dead-letter the job.

    The job is dead-lettered when the failure kind is TERMINAL or PANICKED, or the
    attempt was the last allowed (attempt >= max_attempts): the rule of
    :func:`runledger_sync.core.outcomes.dead_letter_reason`. A missing or negative
    delay retries at once.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).

    Returns:
        The row after the write: PENDING (retry) or DEAD_LETTERED.

    Raises:
        LeaseOwnerMismatch: the lease is not this worker's or has expired.
    """
    identity = check_identity(job_id, run_number, attempt, worker_id)
    if not isinstance(failure, JobFailure):
        raise check.InvalidArgument("failure", failure, "a JobFailure")
    delay = 0 if retry_delay_ms is None or retry_delay_ms < 0 else check.check_int("retry_delay_ms", retry_delay_ms, (0, 2**62))
    params = identity.params() | failure_params(failure, delay, {})

    def work(connection: Connection) -> JobRecord:
        # Whether this attempt ends the job is the core's rule, asked of the locked row.
        held = LOCK_LEASES.execute(connection, lease_params([identity])).first()
        if held is None:
            raise lease_mismatch(identity)
        dead = dead_letter_reason(failure.kind, identity.attempt, held.max_attempts) is not None
        row = _FAILURE.execute(connection, params | {"dead_letter": dead}).first()
        if row is None:
            raise lease_mismatch(identity)
        record = to_job(row)
        if record.workflow_step_id is not None:
            jobs_ended(connection, job_ends([record]))
        return record

    return run_in_transaction(bind, work)


_HOLDER = select(_q.worker_id, _q.status).where(_q.id == bindparam("lease_job_id", type_=PG_UUID(as_uuid=True)))


def release_unstarted_job_claim(
    bind: Bind,
    *,
    job_id: UUID,
    run_number: int,
    attempt: int,
    worker_id: str,
    reason: str,
    delay_ms: int,
) -> JobRecord:
    """Hand a prestart claim back to PENDING without spending its attempt.

    Only applies while RUNNING was never persisted for the attempt.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).

    Raises:
        LeaseOwnerMismatch: the job is leased to another worker.
        UnstartedClaimReleaseNotApplicable: RUNNING was persisted, the claim was
            not a prestart claim, or the job is not leased.
    """
    identity = check_identity(job_id, run_number, attempt, worker_id)
    check.check_text("reason", reason, max_length=255)
    params = identity.params() | {"reason": reason, "delay_ms": max(0, int(delay_ms))}
    return run_in_transaction(bind, lambda connection: _release(connection, identity, params))


def _release(connection: Connection, identity: LeaseIdentity, params: dict[str, Any]) -> JobRecord:
    # The fence's lock comes first, so the attempt row's execution marker is read
    # after any concurrent mark-running has committed or rolled back.
    row = write_fenced(connection, (RELEASE,), [identity], params).first()
    if row is not None:
        record = to_job(row)
        steps_handed_back(connection, [record])
        return record
    current = connection.execute(_HOLDER, {"lease_job_id": identity.job_id}).first()
    if current is not None and current.status == _LEASED and current.worker_id != identity.worker_id:
        raise LeaseOwnerMismatch(f"job {identity.job_id} is leased to another worker", job_id=str(identity.job_id))
    raise UnstartedClaimReleaseNotApplicable(
        f"job {identity.job_id} attempt {identity.attempt} cannot be released unstarted: RUNNING was persisted, "
        "it was not a prestart claim, or it is no longer leased",
        job_id=str(identity.job_id),
    )
