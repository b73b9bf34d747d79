"""The lease lifecycle: claim, mark running, heartbeat, complete, release, reap.

Every worker write goes through the lease fence of
:mod:`runledger_sync.store._fence`: the rows are locked first, then written by
one statement that judges the lease as the last committer left it and writes
the attempt and event rows the step implies.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence
from uuid import UUID

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    Integer,
    Text,
    and_,
    any_,
    bindparam,
    case,
    cast,
    func,
    literal,
    literal_column,
    null,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.errors import (
    InvalidCompletionProgress,
    InvalidLeaseDuration,
    InvalidProgress,
    InvalidRetryDelay,
    LeaseOwnerMismatch,
    UnstartedClaimReleaseNotApplicable,
)
from runledger_sync.core.ids import uuid7
from runledger_sync.core.records import JobRecord, LeaseIdentity, ReapedDeadLetter, ReapResult
from runledger_sync.core.types import (
    ClaimOrigin,
    JobCompletion,
    JobEventType,
    JobFailure,
    JobStage,
    JobStatus,
)
from runledger_sync.db.schema import job_attempts, job_dead_letters, job_events, job_queue
from runledger_sync.store._binds import Bind
from runledger_sync.store._errors import owns_transaction, run_in_transaction
from runledger_sync.store._fence import held_under, lease_mismatch, live_lease, one_lease, write_fenced
from runledger_sync.store._prepared import PreparedStatement, execute_in_turn
from runledger_sync.store._rows import JOB_COLUMNS, to_job

LEASE_EXPIRED_CODE = "job.lease_expired"
LEASE_EXPIRED_MESSAGE = "Job lease expired before completion."
LEASE_EXPIRED_BEFORE_RUNNING_PERSISTED = "LEASE_EXPIRED_BEFORE_RUNNING_PERSISTED"
DEFAULT_HEARTBEAT_LOCK_TIMEOUT_MS = 5_000
MAX_CLAIM_LIMIT = 1_000

_q = job_queue.c
_a = job_attempts.c
_LEASED = JobStatus.LEASED.value


def _seconds(name: str) -> Any:
    return func.make_interval(0, 0, 0, 0, 0, 0, bindparam(name, type_=Float))


def _milliseconds(name: str) -> Any:
    return func.make_interval(0, 0, 0, 0, 0, 0, bindparam(name, type_=BigInteger) / 1000.0)


def _ordinals(count: int) -> Any:
    """Rows 1..count, to write several events from one updated row in a fixed order.

    generate_series rather than a VALUES list: SQLAlchemy cannot cache a
    statement holding literal VALUES data, and these statements are on the hot path.
    """
    return func.generate_series(1, count).table_valued("ord").render_derived(name="kinds")


def _event_insert(source: Any, *event_columns: Any) -> Any:
    """INSERT INTO job_events from ``source`` rows (one statement, ids in select order)."""
    names = ["job_id", "run_number", "attempt", "event_type", "stage", "progress_done", "progress_total", "payload"]
    return job_events.insert().from_select(names, select(*event_columns).select_from(source))


def _check_identity(job_id: Any, run_number: Any, attempt: Any, worker_id: Any) -> LeaseIdentity:
    if not isinstance(job_id, UUID):
        raise check.InvalidArgument("job_id", job_id, "a UUID")
    check.check_int("run_number", run_number, (1, 2**31 - 1))
    check.check_int("attempt", attempt, (1, 2**31 - 1))
    check.check_text("worker_id", worker_id, max_length=check.WORKER_ID_MAX_LENGTH)
    return LeaseIdentity(job_id, run_number, attempt, worker_id)


# -- claim ---------------------------------------------------------------------


#: Written into the statement, not bound: a generic plan can use the partial claim
#: index (``WHERE status = 'PENDING'``) only if it can prove the predicate from the
#: text; with a parameter it cannot, and would sort the queue instead.
_PENDING_IN_TEXT = literal_column(f"'{JobStatus.PENDING.value}'", Text)


def _ids_of(rows: Any) -> Any:
    """The ``id`` column of ``rows`` (a CTE) as one uuid array.

    Compared with ``= ANY``, it reaches a table through its index on that key
    in whatever order the planner joins the rest: no plan can read the table whole.
    """
    return cast(select(func.array_agg(rows.c.id)).scalar_subquery(), ARRAY(PG_UUID(as_uuid=True)))


def _attempt_of(jobs: Any) -> Any:
    """WHERE clause: the job_attempts row of each written job's current attempt (``jobs``: a CTE of job rows)."""
    return and_(
        _a.job_id == jobs.c.id, _a.run_number == jobs.c.run_number, _a.attempt == jobs.c.attempt,
        _a.job_id == any_(_ids_of(jobs)),
    )


def _build_claim(with_type_filter: bool) -> Any:
    conditions = [_q.status == _PENDING_IN_TEXT, _q.next_run_at <= func.now()]
    if with_type_filter:
        conditions.append(_q.job_type == func.any(bindparam("job_types", type_=ARRAY(Text))))
    picked = (
        select(_q.id)
        .where(*conditions)
        .order_by(_q.priority.desc(), _q.next_run_at, _q.created_at, _q.id)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("picked")
    )
    leased = (
        job_queue.update()
        # No join: no join order for a plan made on a near-empty table to get backwards.
        .where(_q.id == any_(_ids_of(picked)))
        .values(
            status=_LEASED,
            attempt=_q.attempt + 1,
            worker_id=bindparam("lease_worker_id", type_=Text),
            lease_expires_at=func.now() + _seconds("lease_seconds"),
            last_heartbeat_at=func.now(),
            started_at=func.coalesce(_q.started_at, func.now()),
        )
        .returning(*JOB_COLUMNS)
        .cte("leased")
    )
    numbered = select(
        leased.c.id, leased.c.run_number, leased.c.attempt, leased.c.stage,
        func.row_number().over(order_by=leased.c.id).label("n"),
    ).cte("numbered")
    # Attempt ids are UUIDv7s made in Python (PostgreSQL < 18 has no uuidv7());
    # the caller passes one per possible row and they are paired by position.
    attempt_ids = func.unnest(cast(bindparam("attempt_ids", type_=ARRAY(Text)), ARRAY(PG_UUID(as_uuid=True)))).table_valued(
        "attempt_id", with_ordinality="n"
    ).render_derived(name="attempt_ids")
    attempts = job_attempts.insert().from_select(
        ["id", "job_id", "run_number", "attempt", "worker_id", "claim_origin"],
        select(
            attempt_ids.c.attempt_id, numbered.c.id, numbered.c.run_number, numbered.c.attempt,
            bindparam("lease_worker_id", type_=Text), bindparam("claim_origin", type_=Text),
        ).select_from(numbered.join(attempt_ids, attempt_ids.c.n == numbered.c.n)),
    ).cte("attempts")
    events = _event_insert(
        leased,
        leased.c.id, leased.c.run_number, leased.c.attempt, literal(JobEventType.LEASED.value), leased.c.stage,
        null(), null(),
        func.jsonb_build_object(
            "worker_id", bindparam("lease_worker_id", type_=Text), "lease_duration_seconds", bindparam("lease_seconds", type_=Float),
        ),
    ).cte("leased_events")
    return (
        select(*leased.c)
        .add_cte(attempts, events)
        .order_by(leased.c.priority.desc(), leased.c.next_run_at, leased.c.created_at, leased.c.id)
    )


# Planned once per connection (planning cost about as much as the claim): the pick
# reads the claim index and the update looks the picked ids up, at any queue size.
_CLAIM_ANY_TYPE = PreparedStatement("claim", _build_claim(with_type_filter=False), index_plan=True)
_CLAIM_FOR_TYPES = PreparedStatement("claim_for_types", _build_claim(with_type_filter=True), index_plan=True)


def _claim(
    bind: Bind,
    origin: ClaimOrigin,
    worker_id: str,
    lease_ttl_seconds: float,
    limit: int,
    job_types: Optional[Sequence[str]],
) -> list[JobRecord]:
    check.check_text("worker_id", worker_id, max_length=check.WORKER_ID_MAX_LENGTH)
    number = isinstance(lease_ttl_seconds, (int, float)) and not isinstance(lease_ttl_seconds, bool)
    if not number or not lease_ttl_seconds > 0:
        raise InvalidLeaseDuration(f"lease_ttl_seconds must be greater than zero, got {lease_ttl_seconds!r}")
    check.check_int("limit", limit, (1, MAX_CLAIM_LIMIT))
    params: dict[str, Any] = {
        "lease_worker_id": worker_id,
        "lease_seconds": float(lease_ttl_seconds),
        "limit": limit,
        "claim_origin": origin.value,
        "attempt_ids": [str(uuid7()) for _ in range(limit)],
    }
    statement = _CLAIM_ANY_TYPE
    if job_types is not None:
        types = sorted({check.check_job_type(t) for t in job_types})
        if not types:
            return []
        params["job_types"] = types
        statement = _CLAIM_FOR_TYPES

    if not owns_transaction(bind):
        return run_in_transaction(bind, lambda connection: _claim_in_callers_transaction(connection, statement, params))
    settings = _PRESTART_CLAIM_SETTINGS if origin is ClaimOrigin.WORKER_PRESTART else _CLAIM_SETTINGS

    def work(connection: Connection) -> list[JobRecord]:
        # SET LOCAL: gone when this transaction of ours ends. Set in the same round
        # trip as the claim, which is planned after them.
        return [to_job(row) for row in execute_in_turn(connection, (settings, statement), params)]

    return run_in_transaction(bind, work)


def _claim_in_callers_transaction(
    connection: Connection, statement: PreparedStatement, params: dict[str, Any]
) -> list[JobRecord]:
    """Claim with the same planner settings, then give the caller's transaction back its own."""
    saved = connection.execute(_PLANNER_SETTINGS_NOW).one()
    claimed = [to_job(row) for row in execute_in_turn(connection, (_CLAIM_SETTINGS, statement), params)]
    connection.execute(_RESTORE_PLANNER_SETTINGS, saved._asdict())
    return claimed


# The pick must read the claim index in queue order and stop at the limit. With
# statistics that call the queue empty (a new table, or one analyzed while idle and
# then hit by a burst) the planner prefers to fetch every pending row of the types
# and sort them, so each claim costs in proportion to the queue. A sort is never
# the right way to pick, so the claim plans without one. A disabled plan node
# counts as a huge cost, which would also make every claim worth compiling with
# JIT (hundreds of milliseconds each), so JIT is off as well.
_PLANNER_SETTINGS = {"enable_sort": "off", "jit": "off"}
_SORTED_BY_INDEX = tuple(func.set_config(name, value, True) for name, value in _PLANNER_SETTINGS.items())
_CLAIM_SETTINGS = PreparedStatement("claim_settings", select(*_SORTED_BY_INDEX))
# Nothing runs on a prestart claim until the running write commits, and that
# synchronous commit flushes this one too. A claim lost in a server crash before
# then is simply claimed again, so it need not wait for the disk.
_PRESTART_CLAIM_SETTINGS = PreparedStatement(
    "prestart_claim_settings", select(*_SORTED_BY_INDEX, func.set_config("synchronous_commit", "off", True))
)
# A caller's transaction keeps its own synchronous_commit; its planner settings
# are read before the claim and set back after it.
_PLANNER_SETTINGS_NOW = select(*(func.current_setting(name).label(name) for name in _PLANNER_SETTINGS))
_RESTORE_PLANNER_SETTINGS = select(
    *(func.set_config(name, bindparam(name, type_=Text), True) for name in _PLANNER_SETTINGS)
)


def claim_jobs(
    bind: Bind,
    *,
    worker_id: str,
    lease_ttl_seconds: float,
    limit: int,
    job_types: Optional[Sequence[str]] = None,
) -> list[JobRecord]:
    """Lease up to ``limit`` due jobs for ``worker_id`` (DIRECT claims: the attempt is spent).

    Rows locked by other claimers are skipped, never waited for. ``job_types``
    None means any type; an empty list claims nothing without a query.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).

    Raises:
        InvalidLeaseDuration: ``lease_ttl_seconds`` is not positive.
    """
    return _claim(bind, ClaimOrigin.DIRECT, worker_id, lease_ttl_seconds, limit, job_types)


def claim_prestart_jobs_for_types(
    bind: Bind,
    *,
    worker_id: str,
    lease_ttl_seconds: float,
    limit: int,
    job_types: Sequence[str],
) -> list[JobRecord]:
    """Lease due jobs of ``job_types`` as prestart claims, the worker's way.

    A prestart claim must persist RUNNING (:func:`mark_job_running`) before the
    handler starts; until then it can be handed back without spending an attempt.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
    """
    return _claim(bind, ClaimOrigin.WORKER_PRESTART, worker_id, lease_ttl_seconds, limit, job_types)


# -- progress, running, heartbeat ------------------------------------------------


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
            _attempt_of(updated),
            _a.execution_started_persisted_at.is_(None),
            bindparam("new_stage", type_=Text) == JobStage.RUNNING.value,
        )
        .values(execution_started_persisted_at=func.now())
        .cte("execution_marker")
    )
    kinds = _ordinals(2)
    wanted = case((kinds.c.ord == 1, stage.is_not(None)), else_=done.is_not(None) | total.is_not(None))
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
) -> JobRecord:
    """Record stage, progress and checkpoint under the lease; None keeps a stored value.

    Setting stage ``running`` also stamps the attempt's execution marker, after
    which the claim can no longer be released unstarted.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).

    Raises:
        LeaseOwnerMismatch: the lease is not this worker's or has expired.
        InvalidProgress: the values, or the values merged with stored ones, are invalid.
    """
    identity = _check_identity(job_id, run_number, attempt, worker_id)
    check.check_progress_values(progress_done, progress_total, completion=False)
    params = identity.params() | {
        "new_stage": None if stage is None else JobStage(stage).value,
        "new_progress_done": progress_done,
        "new_progress_total": progress_total,
        "new_checkpoint": None if checkpoint is None else check.serialize_json("checkpoint", checkpoint),
    }
    return run_in_transaction(bind, lambda connection: _guarded_write(connection, _PROGRESS_UPDATE, params, identity))


def mark_job_running(bind: Bind, identity: LeaseIdentity) -> JobRecord:
    """Persist stage ``running`` for a claimed job: the step before its handler starts.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
    """
    return update_job_progress(bind, **identity.keywords(), stage=JobStage.RUNNING)


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
        .values(lease_expires_at=func.now() + _seconds("lease_seconds"), last_heartbeat_at=func.now())
        .returning(*JOB_COLUMNS)
        .cte("renewed")
    )
    events = _event_insert(
        renewed,
        renewed.c.id, renewed.c.run_number, renewed.c.attempt, literal(JobEventType.HEARTBEAT.value), renewed.c.stage,
        null(), null(), func.jsonb_build_object("worker_id", renewed.c.worker_id),
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
) -> JobRecord:
    """Extend a live lease to now + ``lease_ttl_seconds``.

    The row-lock wait is capped at ``lock_timeout_ms`` so a heartbeat stuck
    behind another transaction fails (``db.query_failed``) instead of hanging.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).

    Raises:
        LeaseOwnerMismatch: the lease is not this worker's or has expired.
        StoreError: the lock wait timed out.
    """
    identity = _check_identity(job_id, run_number, attempt, worker_id)
    if not isinstance(lease_ttl_seconds, (int, float)) or not lease_ttl_seconds > 0:
        raise InvalidLeaseDuration(f"lease_ttl_seconds must be greater than zero, got {lease_ttl_seconds!r}")
    check.check_int("lock_timeout_ms", lock_timeout_ms, (1, 3_600_000))
    params = identity.params() | {"lease_seconds": float(lease_ttl_seconds), "lock_timeout": f"{lock_timeout_ms}ms"}

    return run_in_transaction(
        bind, lambda connection: _guarded_write(connection, _HEARTBEAT, params, identity, settings=(_LOCK_TIMEOUT,))
    )


# -- success -------------------------------------------------------------------


def _build_success(
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
        .where(_attempt_of(succeeded))
        .values(finished_at=func.now(), outcome=None, error_code=None, error_message=None, retry_delay_ms=None)
        .cte("finished_attempt")
    )
    events = _event_insert(
        succeeded,
        succeeded.c.id, succeeded.c.run_number, succeeded.c.attempt, literal(JobEventType.SUCCEEDED.value),
        succeeded.c.stage, succeeded.c.progress_done, succeeded.c.progress_total, func.jsonb_build_object(),
    ).cte("succeeded_event")
    return select(*succeeded.c).add_cte(attempt, events)


_SUCCESS = PreparedStatement("success", _build_success(
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
    identity = _check_identity(job_id, run_number, attempt, worker_id)
    completion = completion or JobCompletion()
    check.check_progress_values(completion.progress_done, completion.progress_total, completion=True)
    params = identity.params() | {
        "new_progress_done": completion.progress_done,
        "new_progress_total": completion.progress_total,
        "new_checkpoint": None if completion.checkpoint is None else check.serialize_json("checkpoint", completion.checkpoint),
        "new_output": None if completion.output is None else check.serialize_json("output", completion.output),
    }

    try:
        return run_in_transaction(bind, lambda connection: _guarded_write(connection, _SUCCESS, params, identity))
    except InvalidProgress as exc:
        # The CHECK constraint judged the completion merged with the stored progress.
        raise InvalidCompletionProgress(
            "Handler returned invalid success progress: merged with the stored progress, "
            "progress_done would exceed progress_total."
        ) from exc


# -- failure -------------------------------------------------------------------


def _build_failure(guard: Any) -> Any:
    """The retry-or-dead-letter write, shared by the worker (live lease) and the reaper (expired)."""
    kind = bindparam("kind", type_=Text)
    code = bindparam("code", type_=Text)
    message = bindparam("message", type_=Text)
    delay_ms = bindparam("retry_delay", type_=BigInteger)
    dead = bindparam("non_retryable", type_=Boolean) | (_q.attempt >= _q.max_attempts)
    failed = (
        job_queue.update()
        .where(guard)
        .values(
            status=case((dead, JobStatus.DEAD_LETTERED.value), else_=JobStatus.PENDING.value),
            next_run_at=case((dead, _q.next_run_at), else_=func.now() + _milliseconds("retry_delay")),
            finished_at=case((dead, func.now()), else_=_q.finished_at),
            lease_expires_at=None,
            last_heartbeat_at=None,
            worker_id=None,
            status_reason=kind,
            last_error_code=code,
            last_error_message=message,
        )
        .returning(*JOB_COLUMNS)
        .cte("failed")
    )
    is_dead = failed.c.status == JobStatus.DEAD_LETTERED.value
    attempt = (
        job_attempts.update()
        .where(_attempt_of(failed))
        .values(
            finished_at=func.now(),
            outcome=kind,
            error_code=code,
            error_message=message,
            retry_delay_ms=case((is_dead, null()), else_=delay_ms),
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
    extra = cast(bindparam("event_extra", type_=Text), JSONB)
    kinds = _ordinals(2)
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
    return select(*failed.c).add_cte(attempt, dead_letter, events)


_FAILURE = PreparedStatement("failure", _build_failure(live_lease(*one_lease())))
# The reaper matches on id and run_number only: the lease is already gone.
_REAPER_FAILURE = _build_failure(
    and_(
        _q.id == bindparam("lease_job_id"),
        _q.run_number == bindparam("lease_run_number"),
        _q.status == _LEASED,
        _q.lease_expires_at < func.now(),
    )
)


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
    attempt was the last allowed (attempt >= max_attempts). A missing or negative
    delay retries at once.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).

    Returns:
        The row after the write: PENDING (retry) or DEAD_LETTERED.

    Raises:
        LeaseOwnerMismatch: the lease is not this worker's or has expired.
    """
    identity = _check_identity(job_id, run_number, attempt, worker_id)
    if not isinstance(failure, JobFailure):
        raise check.InvalidArgument("failure", failure, "a JobFailure")
    delay = 0 if retry_delay_ms is None or retry_delay_ms < 0 else check.check_int("retry_delay_ms", retry_delay_ms, (0, 2**62))
    params = identity.params() | _failure_params(failure, delay, {})
    return run_in_transaction(bind, lambda connection: _guarded_write(connection, _FAILURE, params, identity))


def _failure_params(failure: JobFailure, delay_ms: int, extra: dict[str, Any]) -> dict[str, Any]:
    # The code and message are made storable, not refused: a handler's message
    # often repeats a file name or an upstream reply, and a refused write would
    # lose the failure (the lease would expire and the job run again).
    return {
        "kind": failure.kind.value,
        "code": check.check_failure_code(failure.code),
        "message": check.storable_text(str(failure.message)),
        "retry_delay": delay_ms,
        "non_retryable": not failure.kind.is_retryable,
        "event_extra": check.serialize_json("event", extra),
    }


# -- unstarted release ------------------------------------------------------------


def _build_release() -> Any:
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
            next_run_at=func.now() + _milliseconds("delay_ms"),
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
        .where(
            _a.job_id == released.c.id,
            _a.run_number == released.c.run_number,
            _a.attempt == attempt,
        )
        .cte("removed_attempt")
    )
    events = _event_insert(
        released,
        released.c.id, released.c.run_number, attempt, literal(JobEventType.REQUEUED.value),
        released.c.stage, null(), null(), func.jsonb_build_object("reason", bindparam("reason", type_=Text)),
    ).cte("released_event")
    return select(*released.c).add_cte(removed, events)


_RELEASE = PreparedStatement("release", _build_release())
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
    identity = _check_identity(job_id, run_number, attempt, worker_id)
    check.check_text("reason", reason, max_length=255)
    params = identity.params() | {"reason": reason, "delay_ms": max(0, int(delay_ms))}
    return run_in_transaction(bind, lambda connection: _release(connection, identity, params))


def _release(connection: Connection, identity: LeaseIdentity, params: dict[str, Any]) -> JobRecord:
    # The fence's lock comes first, so the attempt row's execution marker is read
    # after any concurrent mark-running has committed or rolled back.
    row = write_fenced(connection, (_RELEASE,), [identity], params).first()
    if row is not None:
        return to_job(row)
    current = connection.execute(_HOLDER, {"lease_job_id": identity.job_id}).first()
    if current is not None and current.status == _LEASED and current.worker_id != identity.worker_id:
        raise LeaseOwnerMismatch(f"job {identity.job_id} is leased to another worker", job_id=str(identity.job_id))
    raise UnstartedClaimReleaseNotApplicable(
        f"job {identity.job_id} attempt {identity.attempt} cannot be released unstarted: RUNNING was persisted, "
        "it was not a prestart claim, or it is no longer leased",
        job_id=str(identity.job_id),
    )


# -- reaper --------------------------------------------------------------------

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
    .values(lease_expires_at=func.now() + _milliseconds("delay_ms"))
)
_LEASE_EXPIRED_FAILURE = JobFailure.lease_expired(LEASE_EXPIRED_CODE, LEASE_EXPIRED_MESSAGE)


def reap_expired_leases(bind: Bind, *, limit: int, default_retry_delay_ms: int) -> ReapResult:
    """Recover one batch of jobs whose lease expired (the worker died or lost its connection).

    Per row, in a savepoint: a prestart claim that never persisted RUNNING is
    released without spending its attempt; otherwise the attempt counts and the
    job is retried after ``default_retry_delay_ms`` or dead-lettered when it was
    the last. A row that fails is pushed back by the delay so it cannot starve
    the batch.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).

    Raises:
        InvalidRetryDelay: ``default_retry_delay_ms`` is not positive.
    """
    check.check_int("limit", limit, (1, MAX_CLAIM_LIMIT))
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
                                 outcome.attempt, outcome.payload)
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
        if _RELEASE.execute(connection, params).first() is not None:
            return None
    started_without_renewal = (
        row.stage == JobStage.RUNNING.value
        and row.execution_started_persisted_at is not None
        and (row.last_heartbeat_at is None or row.last_heartbeat_at <= row.execution_started_persisted_at)
    )
    params = {"lease_job_id": row.id, "lease_run_number": row.run_number} | _failure_params(
        _LEASE_EXPIRED_FAILURE, delay_ms, {"started_without_renewal_heartbeat": started_without_renewal}
    )
    result = connection.execute(_REAPER_FAILURE, params).first()
    if result is None:
        raise LeaseOwnerMismatch(f"job {row.id} changed while it was being reaped")
    return to_job(result)
