"""The claim: lease due jobs to a worker, and plan the statement that does it once per connection."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence
from uuid import UUID

from sqlalchemy import (
    Float,
    Integer,
    Text,
    any_,
    bindparam,
    cast,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.errors import (
    InvalidLeaseDuration,
)
from runledger_sync.core.ids import uuid7_strings
from runledger_sync.core.records import JobRecord
from runledger_sync.core.workflow import WorkflowStepStatus
from runledger_sync.core.types import ClaimOrigin, EventLog, JobEventType
from runledger_sync.core.states import JobStatus
from runledger_sync.db.schema import job_attempts, job_queue
from runledger_sync.db.schema_workflows import workflow_steps
from runledger_sync.store._binds import Bind
from runledger_sync.store._claim_queues import (
    build_clock,
    build_queue_locks,
    build_rate_log,
    build_served,
    build_served_unlimited,
    flow_params,
    key_rate_room,
)
from runledger_sync.store._errors import owns_transaction, run_in_transaction
from runledger_sync.store._prepared import PreparedStatement, execute_in_turn
from runledger_sync.store._rows import JOB_COLUMNS, to_jobs
from runledger_sync.store._scope import check_job_id
from runledger_sync.store._sql import event_insert, event_log_params, full_event_log, ids_of, seconds

MAX_CLAIM_LIMIT = 1_000

_q = job_queue.c
_LEASED = JobStatus.LEASED.value

#: Written into the statement, not bound: a generic plan can use the partial claim
#: index (``WHERE status = 'PENDING'``) only if it can prove the predicate from the
#: text; with a parameter it cannot, and would sort the queue instead.
_PENDING_IN_TEXT = literal_column(f"'{JobStatus.PENDING.value}'", Text)


def _build_claim(
    with_type_filter: bool, *, returning_rows: bool = True, limited: bool = True, with_id_filter: bool = False,
) -> Any:
    """The claim; ``returning_rows`` False answers only how many jobs it leased (a result nobody reads).

    ``limited`` False builds the claim of :func:`_build_unlimited_claim`. ``with_id_filter``
    narrows it to the jobs named in ``job_ids`` (a test working one job it enqueued).
    """
    clock = build_clock()
    if not limited:
        return _build_unlimited_claim(clock, with_type_filter, returning_rows)
    served = build_served(clock)
    key_room = key_rate_room(served, clock, _q.execution_resource_key)
    conditions = [
        *_due_in(served, with_type_filter),
        # Only a queue whose rate limit is per key asks its rate log about each job's key.
        or_(~served.c.rate_limit_per_key, key_room > 0),
    ]
    if with_id_filter:
        conditions.append(_q.id == func.any(cast(bindparam("job_ids", type_=ARRAY(Text)), ARRAY(PG_UUID(as_uuid=True)))))
    in_queue = (
        select(_q.id, _q.queue, _q.execution_resource_key, *_claim_order_columns(_q), key_room.label("key_room"))
        .where(*conditions)
        .order_by(_q.priority.desc(), _q.next_run_at, _q.created_at, _q.id)
        .limit(served.c.room)
        .with_for_update(of=job_queue, skip_locked=True)
        .lateral("in_queue")
    )
    candidates = (
        select(
            in_queue.c.id, in_queue.c.key_room, *_claim_order_columns(in_queue.c),
            # A per-key rate budget caps one claim too: its jobs of one key count in turn.
            func.row_number().over(
                partition_by=(in_queue.c.queue, in_queue.c.execution_resource_key),
                order_by=_claim_order(in_queue.c),
            ).label("nth_of_key"),
        )
        .select_from(served.join(in_queue, true()))
        .where(served.c.room > 0)
        .cte("candidates")
    )
    picked = (
        select(candidates.c.id)
        .where(candidates.c.nth_of_key <= candidates.c.key_room)
        .order_by(*_claim_order(candidates.c))
        .limit(bindparam("limit", type_=Integer))
        .cte("picked")
    )
    leased = _lease(picked)
    return _claim_writes(leased, clock, returning_rows, extra=build_rate_log(leased, served, clock))


def _due_in(served: Any, with_type_filter: bool) -> list[Any]:
    """A job the claim may take from a served queue: pending, not held back by its key, due (and of the types)."""
    conditions = [
        _q.queue == served.c.name, _q.status == _PENDING_IN_TEXT, ~_q.blocked_by_key, _q.next_run_at <= func.now(),
    ]
    if with_type_filter:
        conditions.append(_q.job_type == func.any(bindparam("job_types", type_=ARRAY(Text))))
    return conditions


def _build_unlimited_claim(clock: Any, with_type_filter: bool, returning_rows: bool) -> Any:
    """The claim when no served queue has a global or rate limit: nothing to count, no rate log to keep.

    It serves only such queues, read in its own snapshot, so a limit set since the
    caller last looked leaves that queue's jobs alone rather than overrunning it.
    """
    served = build_served_unlimited()
    in_queue = (
        select(_q.id, *_claim_order_columns(_q))
        .where(*_due_in(served, with_type_filter))
        .order_by(_q.priority.desc(), _q.next_run_at, _q.created_at, _q.id)
        .limit(served.c.room)
        .with_for_update(of=job_queue, skip_locked=True)
        .lateral("in_queue")
    )
    picked = (
        select(in_queue.c.id)
        .select_from(served.join(in_queue, true()))
        .order_by(*_claim_order(in_queue.c))
        .limit(bindparam("limit", type_=Integer))
        .cte("picked")
    )
    return _claim_writes(_lease(picked), clock, returning_rows, extra=())


def _lease(picked: Any) -> Any:
    return (
        job_queue.update()
        # No join: no join order for a plan made on a near-empty table to get backwards.
        .where(_q.id == any_(ids_of(picked)))
        .values(
            status=_LEASED,
            attempt=_q.attempt + 1,
            worker_id=bindparam("lease_worker_id", type_=Text),
            lease_expires_at=func.now() + seconds("lease_seconds"),
            last_heartbeat_at=func.now(),
            started_at=func.coalesce(_q.started_at, func.now()),
        )
        .returning(*JOB_COLUMNS)
        .cte("leased")
    )


def _claim_writes(leased: Any, clock: Any, returning_rows: bool, extra: Any) -> Any:
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
        ["id", "job_id", "run_number", "attempt", "worker_id", "claim_origin", "leased_at"],
        select(
            attempt_ids.c.attempt_id, numbered.c.id, numbered.c.run_number, numbered.c.attempt,
            bindparam("lease_worker_id", type_=Text), bindparam("claim_origin", type_=Text), clock.c.t,
        ).select_from(numbered.join(attempt_ids, attempt_ids.c.n == numbered.c.n).join(clock, true())),
    ).cte("attempts")
    events = event_insert(
        leased,
        leased.c.id, leased.c.run_number, leased.c.attempt, literal(JobEventType.LEASED.value), leased.c.stage,
        null(), null(),
        func.jsonb_build_object(
            "worker_id", bindparam("lease_worker_id", type_=Text), "lease_duration_seconds", bindparam("lease_seconds", type_=Float),
        ),
        where=full_event_log(),
    ).cte("leased_events")
    # The claim hook of a workflow's job (spec section 11), in the claim's own
    # statement: its step is RUNNING. For plain jobs the array is NULL and
    # nothing is looked up.
    steps = (
        workflow_steps.update()
        .where(
            workflow_steps.c.id == any_(cast(
                select(func.array_agg(leased.c.workflow_step_id).filter(leased.c.workflow_step_id.is_not(None)))
                .scalar_subquery(),
                ARRAY(PG_UUID(as_uuid=True)),
            )),
            workflow_steps.c.status == WorkflowStepStatus.ENQUEUED.value,
        )
        .values(status=WorkflowStepStatus.RUNNING.value)
        .cte("claimed_steps")
    )
    if not returning_rows:
        return select(func.count().label("leased")).select_from(leased).add_cte(
            attempts, events, steps, *extra)
    return (
        select(*leased.c)
        .add_cte(attempts, events, steps, *extra)
        .order_by(leased.c.priority.desc(), leased.c.next_run_at, leased.c.created_at, leased.c.id)
    )


def _claim_order_columns(columns: Any) -> tuple[Any, ...]:
    return columns.priority, columns.next_run_at, columns.created_at


def _claim_order(columns: Any) -> tuple[Any, ...]:
    return columns.priority.desc(), columns.next_run_at, columns.created_at, columns.id


# Planned once per connection (planning cost about as much as the claim): the pick
# reads the claim index and the update looks the picked ids up, at any queue size.
_CLAIM_ANY_TYPE = PreparedStatement("claim", _build_claim(with_type_filter=False), index_plan=True)
_CLAIM_FOR_TYPES = PreparedStatement("claim_for_types", _build_claim(with_type_filter=True), index_plan=True)
#: The worker's claim, when the jobs' rows come back from the running write that follows it.
CLAIM_FOR_TYPES_UNREAD = PreparedStatement(
    "claim_for_types_unread", _build_claim(with_type_filter=True, returning_rows=False), index_plan=True)
#: The claim of named jobs only: rare (a test's run_job), so planned by PostgreSQL's own rule.
_CLAIM_NAMED = PreparedStatement("claim_named", _build_claim(with_type_filter=True, with_id_filter=True))
#: The same two, for a caller that knows no queue it serves has a global or rate limit.
_CLAIM_FOR_TYPES_UNLIMITED = PreparedStatement(
    "claim_for_types_unlimited", _build_claim(with_type_filter=True, limited=False), index_plan=True)
CLAIM_FOR_TYPES_UNREAD_UNLIMITED = PreparedStatement(
    "claim_for_types_unread_unlimited", _build_claim(with_type_filter=True, returning_rows=False, limited=False),
    index_plan=True)


def claim_params(
    origin: ClaimOrigin,
    worker_id: str,
    lease_ttl_seconds: float,
    limit: int,
    job_types: Optional[Sequence[str]],
    event_log: EventLog | str,
    queues: Optional[Sequence[str]] = None,
    queue_rooms: Optional[Mapping[str, int]] = None,
    job_ids: Optional[Sequence[UUID | str]] = None,
) -> Optional[dict[str, Any]]:
    """The checked parameters of a claim (``job_types`` among them when given); None when no type is asked for.

    ``queues`` None serves every queue; ``queue_rooms`` caps this claim per queue (the worker's own share);
    ``job_ids`` (None: any job) narrows it to those jobs.
    """
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
        "attempt_ids": uuid7_strings(limit),
    } | event_log_params(event_log) | flow_params(queues, queue_rooms)
    if job_types is not None:
        types = sorted({check.check_job_type(t) for t in job_types})
        if not types:
            return None
        params["job_types"] = types
    if job_ids is not None:
        params["job_ids"] = [str(check_job_id(job_id)) for job_id in job_ids]
    return params


def _claim(
    bind: Bind,
    origin: ClaimOrigin,
    worker_id: str,
    lease_ttl_seconds: float,
    limit: int,
    job_types: Optional[Sequence[str]],
    event_log: EventLog | str,
    queues: Optional[Sequence[str]],
    queue_rooms: Optional[Mapping[str, int]],
    unlimited_only: bool = False,
    job_ids: Optional[Sequence[UUID | str]] = None,
) -> list[JobRecord]:
    params = claim_params(origin, worker_id, lease_ttl_seconds, limit, job_types, event_log, queues, queue_rooms, job_ids)
    if params is None:
        return []
    if "job_ids" in params:
        statement = _CLAIM_NAMED
    elif "job_types" not in params:
        statement = _CLAIM_ANY_TYPE
    else:
        statement = _CLAIM_FOR_TYPES_UNLIMITED if unlimited_only else _CLAIM_FOR_TYPES
    if not owns_transaction(bind):
        return run_in_transaction(bind, lambda connection: _claim_in_callers_transaction(connection, statement, params))
    if origin is not ClaimOrigin.WORKER_PRESTART:
        settings = _CLAIM_SETTINGS
    else:
        settings = PRESTART_UNLIMITED_CLAIM_SETTINGS if unlimited_only and "job_ids" not in params else PRESTART_CLAIM_SETTINGS

    def work(connection: Connection) -> list[JobRecord]:
        # SET LOCAL: gone when this transaction of ours ends. Set in the same round
        # trip as the claim, which is planned after them.
        return to_jobs(execute_in_turn(connection, (settings, statement), params))

    return run_in_transaction(bind, work, one_query=True)


def _claim_in_callers_transaction(
    connection: Connection, statement: PreparedStatement, params: dict[str, Any]
) -> list[JobRecord]:
    """Claim with the same planner settings, then give the caller's transaction back its own."""
    saved = connection.execute(_PLANNER_SETTINGS_NOW).one()
    claimed = to_jobs(execute_in_turn(connection, (_CLAIM_SETTINGS, statement), params))
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
# The locks of the limited queues the claim serves come first too: see
# runledger_sync.store._claim_queues.
_CLAIM_SETTINGS = PreparedStatement("claim_settings", select(*_SORTED_BY_INDEX, build_queue_locks()))
# Nothing runs on a prestart claim until the running write commits, and that
# synchronous commit flushes this one too. A claim lost in a server crash before
# then is simply claimed again, so it need not wait for the disk.
PRESTART_CLAIM_SETTINGS = PreparedStatement(
    "prestart_claim_settings",
    select(*_SORTED_BY_INDEX, func.set_config("synchronous_commit", "off", True), build_queue_locks()),
)
#: An unlimited claim counts nothing, so it locks nothing either.
PRESTART_UNLIMITED_CLAIM_SETTINGS = PreparedStatement(
    "prestart_unlimited_claim_settings", select(*_SORTED_BY_INDEX, func.set_config("synchronous_commit", "off", True)),
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
    event_log: EventLog | str = EventLog.FULL,
    queues: Optional[Sequence[str]] = None,
    queue_rooms: Optional[Mapping[str, int]] = None,
) -> list[JobRecord]:
    """Lease up to ``limit`` due jobs for ``worker_id`` (DIRECT claims: the attempt is spent).

    Rows locked by other claimers are skipped, never waited for. ``job_types``
    None means any type; an empty list claims nothing without a query.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        event_log: ``full`` writes a LEASED event per job; ``transitions`` does not.
        queues: the queues to take from (None: every queue); a paused queue gives nothing.
        queue_rooms: at most this many from a queue (the caller's own cap), besides the queues' limits.

    Raises:
        InvalidLeaseDuration: ``lease_ttl_seconds`` is not positive.
        InvalidArgument: ``event_log`` is not a level of :class:`EventLog`.
    """
    return _claim(bind, ClaimOrigin.DIRECT, worker_id, lease_ttl_seconds, limit, job_types, event_log,
                  queues, queue_rooms)


def claim_prestart_jobs_for_types(
    bind: Bind,
    *,
    worker_id: str,
    lease_ttl_seconds: float,
    limit: int,
    job_types: Sequence[str],
    event_log: EventLog | str = EventLog.FULL,
    queues: Optional[Sequence[str]] = None,
    queue_rooms: Optional[Mapping[str, int]] = None,
    unlimited_only: bool = False,
    job_ids: Optional[Sequence[UUID | str]] = None,
) -> list[JobRecord]:
    """Lease due jobs of ``job_types`` as prestart claims, the worker's way.

    A prestart claim must persist RUNNING (:func:`mark_job_running`) before the
    handler starts; until then it can be handed back without spending an attempt.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        event_log: ``full`` writes a LEASED event per job; ``transitions`` does not
            (the worker passes ``JobsConfig.event_log``).
        unlimited_only: take only from queues with neither a global nor a rate limit,
            with the claim that counts nothing (for a caller that has just seen
            :func:`~runledger_sync.store._claim_queues.serves_limited_queue` answer False).
        job_ids: only these jobs, if due and claimable (None: any job of the types);
            :func:`runledger_sync.testing.run_job` works the one job it enqueued this way.

    Raises:
        InvalidArgument: ``event_log`` is not a level of :class:`EventLog`, or a job id is malformed.
    """
    return _claim(bind, ClaimOrigin.WORKER_PRESTART, worker_id, lease_ttl_seconds, limit, job_types, event_log,
                  queues, queue_rooms, unlimited_only, job_ids)
