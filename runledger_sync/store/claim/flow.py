"""The claim's flow control: which queues it may take from, how many each, and the rate log it keeps.

A claim takes from each queue it serves (all of them, or the worker's
``queues``) that is not paused, at most the queue's *room*: the smallest of the
claim's limit, the worker's own cap for the queue (``queue_concurrency``), the
global limit less the queue's LEASED jobs, and the rate limit less the claims
inside its window. Concurrency keys need nothing here: a job held back by its
key is not in the claim index at all (see :mod:`runledger_sync.db.schema_queues`).

Counting and then claiming is only right if no other claim of the same queue
counts in between. So a claim first takes a transaction-scoped advisory lock
per limited queue it serves (a global or rate limit; other queues take none),
in a statement of its own: the claim statement after it then starts with a
snapshot that holds every earlier claim of those queues. The locks end with the
claim's transaction, which is short, and nothing outlives it, so a limit holds
behind a transaction-pooling proxy and after a worker is killed (its LEASED jobs
count until the reaper returns them).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from sqlalchemy import Integer, Text, and_, bindparam, case, func, literal_column, or_, select, true
from sqlalchemy.dialects.postgresql import ARRAY

from runledger_sync.core.flow import check_queue_name
from runledger_sync.core import validation as check
from runledger_sync.core.states import JobStatus
from runledger_sync.db.schema import job_queue, job_queues
from runledger_sync.db.schema_queues import job_queue_rate_claims
from runledger_sync.store.binds import Bind
from runledger_sync.store.transactions import run_in_transaction

_q = job_queue.c
_qs = job_queues.c
_r = job_queue_rate_claims.c
#: Spelled in the text so the planner can use idx_job_queue_leased_expiry's predicate.
_LEASED_IN_TEXT = literal_column(f"'{JobStatus.LEASED.value}'", Text)
#: More than any claim takes: "no limit" in LEAST().
_UNLIMITED = 2_147_483_647


def _served_filter() -> Any:
    queues = bindparam("queues", type_=ARRAY(Text))
    return and_(~_qs.paused, or_(queues.is_(None), _qs.name == func.any(queues)))


def build_queue_locks() -> Any:
    """How many limited queues the claim locked (a scalar): one advisory lock each, in name order."""
    limited = (
        select(func.pg_advisory_xact_lock(func.hashtext("runledger_sync.queue"), func.hashtext(_qs.name)).label("lock"))
        .where(_served_filter(), or_(_qs.global_limit.is_not(None), _qs.rate_limit_count.is_not(None)))
        .order_by(_qs.name)
        .subquery("limited")
    )
    return select(func.count()).select_from(limited).scalar_subquery().label("locked_queues")


def _window_start(clock: Any, queue_seconds: Any) -> Any:
    return clock.c.t - func.make_interval(0, 0, 0, 0, 0, 0, queue_seconds)


def build_clock() -> Any:
    """The claim's one instant (volatile, so evaluated once): rate windows and the rate log use it."""
    return select(func.clock_timestamp().label("t")).cte("clock")


def build_served(clock: Any) -> Any:
    """The queues this claim takes from, each with its room (how many jobs it may take)."""
    limit = bindparam("limit", type_=Integer)
    local = func.unnest(
        bindparam("local_queues", type_=ARRAY(Text)), bindparam("local_rooms", type_=ARRAY(Integer)),
    ).table_valued("name", "room").render_derived(name="local_cap")
    local_room = select(local.c.room).where(local.c.name == _qs.name).scalar_subquery()
    leased = (
        select(func.count()).select_from(job_queue)
        .where(_q.status == _LEASED_IN_TEXT, _q.queue == _qs.name).scalar_subquery()
    )
    in_window = (
        select(func.count()).select_from(job_queue_rate_claims)
        .where(_r.queue == _qs.name, _r.claimed_at > _window_start(clock, _qs.rate_limit_seconds))
        .scalar_subquery()
    )
    rate_room = case(
        (or_(_qs.rate_limit_count.is_(None), _qs.rate_limit_per_key), limit),
        else_=_qs.rate_limit_count - in_window,
    )
    room = func.least(
        limit,
        func.coalesce(local_room, limit),
        # CASE, not arithmetic on NULL: the count runs only for a queue with a global limit.
        case((_qs.global_limit.is_(None), limit), else_=_qs.global_limit - leased),
        rate_room,
    )
    return (
        select(_qs.name, _qs.rate_limit_count, _qs.rate_limit_seconds, _qs.rate_limit_per_key, room.label("room"))
        .where(_served_filter())
        .cte("served")
    )


def build_served_unlimited() -> Any:
    """The served queues that have neither a global nor a rate limit, each with the worker's room."""
    limit = bindparam("limit", type_=Integer)
    local = func.unnest(
        bindparam("local_queues", type_=ARRAY(Text)), bindparam("local_rooms", type_=ARRAY(Integer)),
    ).table_valued("name", "room").render_derived(name="local_cap")
    local_room = select(local.c.room).where(local.c.name == _qs.name).scalar_subquery()
    return (
        select(_qs.name, func.least(limit, func.coalesce(local_room, limit)).label("room"))
        .where(_served_filter(), _qs.global_limit.is_(None), _qs.rate_limit_count.is_(None))
        .cte("served")
    )


def key_rate_room(served: Any, clock: Any, key: Any) -> Any:
    """For a queue whose rate limit is per key: how many more claims ``key`` may have in the window."""
    used = (
        select(func.count()).select_from(job_queue_rate_claims)
        .where(_r.queue == served.c.name, _r.concurrency_key.is_not_distinct_from(key),
               _r.claimed_at > _window_start(clock, served.c.rate_limit_seconds))
        # served is the claim's, two levels out: only the log and the clock are read here.
        .correlate_except(job_queue_rate_claims, clock)
        .scalar_subquery()
    )
    return case((served.c.rate_limit_per_key, served.c.rate_limit_count - used), else_=_UNLIMITED)


def build_rate_log(leased: Any, served: Any, clock: Any) -> tuple[Any, Any]:
    """The rate log's two writes: one row per job claimed from a rate-limited queue; rows out of every window go."""
    logged = job_queue_rate_claims.insert().from_select(
        ["queue", "concurrency_key", "claimed_at"],
        select(leased.c.queue, case((served.c.rate_limit_per_key, leased.c.concurrency_key)), clock.c.t)
        .select_from(leased.join(served, served.c.name == leased.c.queue).join(clock, true()))
        .where(served.c.rate_limit_count.is_not(None)),
    ).cte("rate_logged")
    expired = (
        job_queue_rate_claims.delete()
        .where(_r.queue == served.c.name, served.c.rate_limit_count.is_not(None),
               _r.claimed_at <= _window_start(clock, served.c.rate_limit_seconds))
        .cte("rate_expired")
    )
    return logged, expired


def _build_limited_served() -> Any:
    return select(func.count()).select_from(job_queues).where(
        _served_filter(), or_(_qs.global_limit.is_not(None), _qs.rate_limit_count.is_not(None)))


_LIMITED_SERVED = _build_limited_served()


def serves_limited_queue(bind: Bind, queues: Optional[Sequence[str]]) -> bool:
    """Whether any unpaused queue of ``queues`` (None: every queue) has a global or rate limit.

    A claim that may skip counting asks this first; see ``unlimited_only`` of
    :func:`~runledger_sync.store.claim.claim.claim_prestart_jobs_for_types`.
    """
    params = {"queues": flow_params(queues, None)["queues"]}
    return run_in_transaction(bind, lambda connection: connection.execute(_LIMITED_SERVED, params).scalar_one() > 0)


def flow_params(queues: Optional[Sequence[str]], queue_rooms: Optional[Mapping[str, int]]) -> dict[str, Any]:
    """The claim's flow-control parameters: the served queues (None: all) and the worker's own room per queue."""
    served = None if queues is None else sorted({check_queue_name(name, "queues") for name in queues})
    rooms = dict(queue_rooms or {})
    for name, room in rooms.items():
        check_queue_name(name, "queue_concurrency")
        check.check_int(f"queue_concurrency[{name!r}]", room, (0, 1_000_000))
    names = sorted(rooms)
    return {"queues": served, "local_queues": names, "local_rooms": [rooms[name] for name in names]}
