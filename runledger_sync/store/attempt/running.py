"""The worker's fenced writes while a claimed job runs: mark running (one job or a group), progress, heartbeat.

Each goes through the lease fence of :mod:`runledger_sync.store.attempt.fence`, like
the writes that end the attempt (:mod:`~runledger_sync.store.attempt.ends` for one
lease, :mod:`~runledger_sync.store.attempt.outcomes` for the worker's groups).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence
from uuid import UUID

from sqlalchemy import BigInteger, Text, and_, bindparam, case, cast, func, literal, null, select, true
from sqlalchemy.dialects.postgresql import JSONB

from runledger_sync.core import validation as check
from runledger_sync.core.errors import InvalidLeaseDuration, RunledgerError
from runledger_sync.core.records import JobRecord, LeaseIdentity
from runledger_sync.core.types import DEFAULT_EVENT_LOG, EventLog, JobEventType
from runledger_sync.core.states import JobStage, JobStatus
from runledger_sync.db.schema import job_attempts, job_events, job_queue
from runledger_sync.store.admin.jobs import get_job
from runledger_sync.store.sealing import sealed
from runledger_sync.store.attempt.fence import (
    check_identity,
    LeaseResult,
    by_listed_ids,
    leases_columns,
    live_lease,
    one_lease,
    unnested,
    write_leases,
    write_one_fenced,
)
from runledger_sync.store.attempt.transitions import build_running
from runledger_sync.store.binds import Bind
from runledger_sync.store.transactions import run_in_transaction
from runledger_sync.store.prepared import PreparedStatement
from runledger_sync.store.rows import JOB_COLUMNS
from runledger_sync.store.sql import attempt_of, event_insert, event_log_params, full_event_log, ordinals, seconds

DEFAULT_HEARTBEAT_LOCK_TIMEOUT_MS = 5_000

_q = job_queue.c
_a = job_attempts.c


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
    event_log: EventLog | str = DEFAULT_EVENT_LOG,
    max_checkpoint_bytes: int = check.DEFAULT_MAX_PAYLOAD_BYTES,
) -> JobRecord:
    """Record stage, progress and checkpoint under the lease; None keeps a stored value.

    Setting stage ``running`` also stamps the attempt's execution marker, after
    which the claim can no longer be released unstarted.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        event_log: ``transitions`` leaves out the STAGE_CHANGED event of stage
            ``running``; other stages and PROGRESS events are written at either level.
        max_checkpoint_bytes: the largest checkpoint stored (JSON bytes); the worker
            passes its ``JobsConfig.max_payload_bytes``.

    Raises:
        InvalidArgument: ``event_log`` is not a level of :class:`EventLog`.
        CheckpointTooLarge: the checkpoint is larger than ``max_checkpoint_bytes``; nothing written.
        LeaseOwnerMismatch: the lease is not this worker's or has expired.
        InvalidProgress: the values, or the values merged with stored ones, are invalid.
    """
    identity = check_identity(job_id, run_number, attempt, worker_id)
    check.check_progress_values(progress_done, progress_total, completion=False)
    params = identity.params() | {
        "new_stage": None if stage is None else JobStage(stage).value,
        "new_progress_done": progress_done,
        "new_progress_total": progress_total,
        "new_checkpoint": None if checkpoint is None else sealed(check.serialize_checkpoint(
            checkpoint, max_bytes=max_checkpoint_bytes), identity.job_id),
    } | event_log_params(event_log)
    return run_in_transaction(bind, lambda connection: write_one_fenced(connection, _PROGRESS_UPDATE, params, identity))


def mark_job_running(bind: Bind, identity: LeaseIdentity, *, event_log: EventLog | str = DEFAULT_EVENT_LOG) -> JobRecord:
    """Persist stage ``running`` for a claimed job: the step before its handler starts.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        event_log: ``full`` writes a STAGE_CHANGED event; ``transitions`` does not
            (the worker passes ``JobsConfig.event_log``).
    """
    return update_job_progress(bind, **identity.keywords(), stage=JobStage.RUNNING, event_log=event_log)


#: What a group write returns per written lease, and what its attempt and event rows need.
_WRITTEN = (_q.id, _q.run_number, _q.attempt, _q.stage, _q.progress_done, _q.progress_total, _q.workflow_step_id)


def _live_leases(leases: Any) -> Any:
    """Rows of these lease identities, still LEASED, whose lease is live now."""
    return and_(live_lease(*leases_columns(leases)), by_listed_ids())


_LEASES = unnested()
_RUNNING = PreparedStatement("mark_running", build_running(_live_leases(_LEASES), returning=(*_WRITTEN, _LEASES.c.n)))


def mark_jobs_running(
    bind: Bind, identities: Sequence[LeaseIdentity], *, event_log: EventLog | str = DEFAULT_EVENT_LOG
) -> list[LeaseResult]:
    """Persist stage ``running`` for many claimed jobs in one transaction.

    Same effect per job as :func:`mark_job_running`, for a whole group of leases
    at the cost of one round trip and one commit. The statement returns only each
    written lease, not its row: decoding whole rows (payloads included) would cost
    about as much as the rest of the write's client time.

    Args:
        event_log: ``full`` writes a STAGE_CHANGED event per job; ``transitions``
            does not (the worker passes ``JobsConfig.event_log``).

    Returns:
        One result per identity, in order: None once written, or a ``LeaseOwnerMismatch``.

    Raises:
        InvalidArgument: ``event_log`` is not a level of :class:`EventLog`.
        CommitOutcomeUnknown: the connection was lost while the write ran; it may have landed.
    """
    flag = event_log_params(event_log)
    checked = [check_identity(i.job_id, i.run_number, i.attempt, i.worker_id) for i in identities]
    if not checked:
        return []
    return run_in_transaction(bind, lambda connection: write_leases(connection, _RUNNING, checked, flag),
                              one_query=True)


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
    event_log: EventLog | str = DEFAULT_EVENT_LOG,
    retry: bool = True,
) -> JobRecord:
    """Extend a live lease to now + ``lease_ttl_seconds``.

    The row-lock wait is capped at ``lock_timeout_ms`` so a heartbeat stuck
    behind another transaction fails (``db.query_failed``) instead of hanging.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        event_log: ``full`` writes a HEARTBEAT event; ``transitions`` does not
            (the worker passes ``JobsConfig.event_log``).
        retry: False for a caller with a retry policy of its own (the worker's watch):
            a lost connection is raised at once.

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
        bind, lambda connection: write_one_fenced(connection, _HEARTBEAT, params, identity, settings=(_LOCK_TIMEOUT,)),
        retry=retry,
    )


def running_landed(bind: Bind, identity: LeaseIdentity) -> bool:
    """True if this attempt's running write landed: the job is still leased under ``identity``, at stage running.

    False as well when the row cannot be read.
    """
    try:
        current = get_job(bind, identity.job_id)
    except RunledgerError:
        return False
    return (current is not None and (current.run_number, current.attempt) == (identity.run_number, identity.attempt)
            and current.status is JobStatus.LEASED and current.stage is JobStage.RUNNING
            and current.worker_id == identity.worker_id)
