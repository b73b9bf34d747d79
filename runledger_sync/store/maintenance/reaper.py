"""The reaper's store side: recover jobs whose lease expired (spec section 4, "Reaper batch")."""

from __future__ import annotations

from typing import Any, Optional

from sqlalchemy import (
    Integer,
    and_,
    bindparam,
    func,
    select,
)
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.errors import (
    InvalidRetryDelay,
    LeaseOwnerMismatch,
)
from runledger_sync.core.outcomes import EarlierAttempts, dead_letter_reason, lease_expired_failure
from runledger_sync.core.records import JobRecord, LeaseIdentity, ReapedDeadLetter, ReapResult
from runledger_sync.core.types import ClaimOrigin
from runledger_sync.core.states import JobStage, JobStatus
from runledger_sync.db.schema import job_attempts, job_queue
from runledger_sync.store.binds import Bind
from runledger_sync.store.sealing import opened
from runledger_sync.store.transactions import run_in_transaction
from runledger_sync.store.rows import JOB_COLUMNS, to_job
from runledger_sync.store.sql import milliseconds
from runledger_sync.store.attempt.transitions import RELEASE, build_failure, earlier_attempts, failure_params
from runledger_sync.store.workflows.steps import job_ends, jobs_ended, steps_handed_back

LEASE_EXPIRED_BEFORE_RUNNING_PERSISTED = "LEASE_EXPIRED_BEFORE_RUNNING_PERSISTED"
MAX_REAP_LIMIT = 1_000

_q = job_queue.c
_a = job_attempts.c
_LEASED = JobStatus.LEASED.value

# The reaper matches on id and run_number only: the lease is already gone.
_REAPER_FAILURE = build_failure(
    and_(
        _q.id == bindparam("lease_job_id"),
        _q.run_number == bindparam("lease_run_number"),
        _q.status == _LEASED,
        _q.lease_expires_at < func.now(),
    )
)

_EXPIRED = (
    select(
        *JOB_COLUMNS,
        _a.claim_origin,
        _a.execution_started_persisted_at,
    )
    .select_from(
        job_queue.outerjoin(
            job_attempts,
            and_(_a.job_id == _q.id, _a.run_number == _q.run_number, _a.attempt == _q.attempt),
        )
    )
    .where(_q.status == _LEASED, _q.lease_expires_at < func.now())
    .order_by(_q.lease_expires_at)
    .limit(bindparam("limit", type_=Integer))
    .with_for_update(of=job_queue, skip_locked=True)
)
_POSTPONE = (
    job_queue.update()
    .where(_q.id == bindparam("lease_job_id"), _q.status == _LEASED)
    .values(lease_expires_at=func.now() + milliseconds("delay_ms"))
)


def reap_expired_leases(bind: Bind, *, limit: int, default_retry_delay_ms: int) -> ReapResult:
    """Recover one batch of jobs whose lease expired (the worker died or lost its connection).

    Per row, in a savepoint: a prestart claim that never persisted RUNNING is
    released without spending its attempt; otherwise the attempt counts and the
    job is retried after ``default_retry_delay_ms`` or dead-lettered when it was
    the last (earlier transient failures within their budget count for none:
    :func:`runledger_sync.core.outcomes.dead_letter_reason`). A row that fails is
    pushed back by the delay so it cannot starve the batch.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).

    Raises:
        InvalidRetryDelay: ``default_retry_delay_ms`` is not positive.
    """
    check.check_int("limit", limit, (1, MAX_REAP_LIMIT))
    if isinstance(default_retry_delay_ms, bool) or not isinstance(default_retry_delay_ms, int) or default_retry_delay_ms <= 0:
        raise InvalidRetryDelay(f"default_retry_delay_ms must be greater than zero, got {default_retry_delay_ms!r}")
    return run_in_transaction(bind, lambda connection: _reap(connection, limit, default_retry_delay_ms))


def _reap(connection: Connection, limit: int, delay_ms: int) -> ReapResult:
    released = retried = failed_rows = 0
    dead: list[ReapedDeadLetter] = []
    for row in connection.execute(_EXPIRED, {"limit": limit}).all():
        savepoint = connection.begin_nested()
        try:
            outcome = _reap_row(connection, row, delay_ms)
            savepoint.commit()
        except Exception:  # noqa: BLE001 - one poison row must not stop the batch
            savepoint.rollback()
            connection.execute(_POSTPONE, {"lease_job_id": row.id, "delay_ms": delay_ms})
            failed_rows += 1
            continue
        if outcome is None:
            released += 1
        elif outcome.status == JobStatus.DEAD_LETTERED:
            dead.append(
                ReapedDeadLetter(outcome.id, outcome.job_type, outcome.organization_id, outcome.run_number,
                                 outcome.attempt, opened(outcome.payload, outcome.id), outcome.meta)
            )
        else:
            retried += 1
    return ReapResult(
        processed=released + retried + len(dead) + failed_rows,
        released_unstarted=released,
        retried=retried,
        dead_lettered=tuple(dead),
        failed_rows=failed_rows,
    )


def _reap_row(connection: Connection, row: Any, delay_ms: int) -> Optional[JobRecord]:
    """Apply the reaper's disposition to one locked row; None means released unstarted."""
    never_started = row.claim_origin == ClaimOrigin.WORKER_PRESTART.value and row.execution_started_persisted_at is None
    if never_started and row.worker_id is not None:
        identity = LeaseIdentity(row.id, row.run_number, row.attempt, row.worker_id)
        params = identity.params() | {"reason": LEASE_EXPIRED_BEFORE_RUNNING_PERSISTED, "delay_ms": 0}
        released = RELEASE.execute(connection, params).first()
        if released is not None:
            steps_handed_back(connection, [released])
            return None
    started_without_renewal = (
        row.stage == JobStage.RUNNING.value
        and row.execution_started_persisted_at is not None
        and (row.last_heartbeat_at is None or row.last_heartbeat_at <= row.execution_started_persisted_at)
    )
    failure = lease_expired_failure()
    # Below max_attempts claims the lost lease cannot spend the last attempt: the history is read only when it can.
    earlier = (earlier_attempts(connection, row.id, row.run_number, row.attempt)
               if row.attempt >= row.max_attempts else EarlierAttempts())
    dead = dead_letter_reason(failure, row.attempt, row.max_attempts, earlier) is not None
    params = {"lease_job_id": row.id, "lease_run_number": row.run_number} | failure_params(
        failure, delay_ms, {"started_without_renewal_heartbeat": started_without_renewal}
    ) | {"dead_letter": dead}
    result = connection.execute(_REAPER_FAILURE, params).first()
    if result is None:
        raise LeaseOwnerMismatch(f"job {row.id} changed while it was being reaped")
    record = to_job(result)
    # A release conflict (the run is being cancelled) rolls this row's savepoint
    # back: the row is postponed like any failed row and reaped once the cancel committed.
    jobs_ended(connection, job_ends([record]))
    return record
