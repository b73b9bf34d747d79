"""The claim statement: which due jobs a claim takes, and everything it writes for them.

Built once at import as SQLAlchemy Core; :mod:`runledger_sync.store.claim.claim` prepares
and runs it. Two shapes: the counting claim, which takes from every served queue
at most the queue's room (limits, rate budgets, per-key rate budgets) and keeps the
rate log, and the claim that counts nothing, for a worker whose queues have no
global or rate limit.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Float, Integer, Text, any_, bindparam, cast, func, literal, literal_column, null, or_, select, true
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import UUID as PG_UUID

from runledger_sync.core.states import JobStatus
from runledger_sync.core.types import JobEventType
from runledger_sync.core.workflow import WorkflowStepStatus
from runledger_sync.db.schema import job_attempts, job_queue
from runledger_sync.db.schema_workflows import workflow_steps
from runledger_sync.store.claim.flow import (
    build_clock,
    build_rate_log,
    build_served,
    build_served_unlimited,
    key_rate_room,
)
from runledger_sync.store.rows import JOB_TEXT_COLUMNS
from runledger_sync.store.sql import event_insert, full_event_log, ids_of, seconds

_q = job_queue.c
_LEASED = JobStatus.LEASED.value

#: Written into the statement, not bound: a generic plan can use the partial claim
#: index (``WHERE status = 'PENDING'``) only if it can prove the predicate from the
#: text; with a parameter it cannot, and would sort the queue instead.
_PENDING_IN_TEXT = literal_column(f"'{JobStatus.PENDING.value}'", Text)


def build_claim(
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
        .returning(*JOB_TEXT_COLUMNS)
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
