"""The claim: lease due jobs to a worker, and plan the statement that does it once per connection."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence
from uuid import UUID

from sqlalchemy import Text, bindparam, func, select
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.errors import InvalidLeaseDuration
from runledger_sync.core.ids import uuid7_strings
from runledger_sync.core.records import JobRecord
from runledger_sync.core.types import ClaimOrigin, DEFAULT_EVENT_LOG, EventLog
from runledger_sync.store.binds import Bind
from runledger_sync.store.claim.statement import build_claim
from runledger_sync.store.claim.flow import build_queue_locks, flow_params
from runledger_sync.store.transactions import owns_transaction, run_in_transaction
from runledger_sync.store.prepared import PreparedStatement, execute_in_turn
from runledger_sync.store.rows import to_jobs
from runledger_sync.store.scope import check_job_id
from runledger_sync.store.sql import event_log_params

MAX_CLAIM_LIMIT = 1_000

# Planned once per connection (planning cost about as much as the claim): the pick
# reads the claim index and the update looks the picked ids up, at any queue size.
_CLAIM_ANY_TYPE = PreparedStatement("claim", build_claim(with_type_filter=False))
_CLAIM_FOR_TYPES = PreparedStatement("claim_for_types", build_claim(with_type_filter=True))
#: The worker's claim, when the jobs' rows come back from the running write that follows it.
CLAIM_FOR_TYPES_UNREAD = PreparedStatement(
    "claim_for_types_unread", build_claim(with_type_filter=True, returning_rows=False))
#: The claim of named jobs only: rare (a test's run_job), so planned by PostgreSQL's own rule.
_CLAIM_NAMED = PreparedStatement("claim_named", build_claim(with_type_filter=True, with_id_filter=True))
#: The same two, for a caller that knows no queue it serves has a global or rate limit.
_CLAIM_FOR_TYPES_UNLIMITED = PreparedStatement(
    "claim_for_types_unlimited", build_claim(with_type_filter=True, limited=False))
CLAIM_FOR_TYPES_UNREAD_UNLIMITED = PreparedStatement(
    "claim_for_types_unread_unlimited", build_claim(with_type_filter=True, returning_rows=False, limited=False))


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
# runledger_sync.store.claim.flow.
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
    event_log: EventLog | str = DEFAULT_EVENT_LOG,
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
    event_log: EventLog | str = DEFAULT_EVENT_LOG,
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
            :func:`~runledger_sync.store.claim.flow.serves_limited_queue` answer False).
        job_ids: only these jobs, if due and claimable (None: any job of the types);
            :func:`runledger_sync.testing.run_job` works the one job it enqueued this way.

    Raises:
        InvalidArgument: ``event_log`` is not a level of :class:`EventLog`, or a job id is malformed.
    """
    return _claim(bind, ClaimOrigin.WORKER_PRESTART, worker_id, lease_ttl_seconds, limit, job_types, event_log,
                  queues, queue_rooms, unlimited_only, job_ids)
