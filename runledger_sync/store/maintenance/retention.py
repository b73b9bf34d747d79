"""Prune finished jobs and workflow runs older than their retention (spec section 15).

A prune is a series of short batches, each its own transaction on an Engine:
it picks up to ``batch_size`` old finished rows by an index (the oldest first,
after the last row of the previous batch), locks them with ``SKIP LOCKED`` so
it never waits on a row someone holds, counts what goes with them, and deletes
them. Deleting a job deletes its attempts, events and dead letter (their
foreign keys cascade); deleting a run deletes its steps and their dependency
edges. Each batch stands alone, so a prune stopped half-way (a timeout, a
deploy) is resumed by the next one, which finds what is left.

What is never deleted: a PENDING or LEASED job, whatever its age; a job of a
workflow step (it goes with its run, once the run has finished and aged, so
a run never shows a step whose job is gone); a run that still has a PENDING or
LEASED job; a batch that has one (a member requeued after the batch finished).
A finished batch goes with its members once it is older than
``Retention.job_batches``; its members may have gone before it, each by the
age of its status.
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any, Optional, Sequence

from sqlalchemy import DateTime, Integer, Interval, bindparam, func, literal_column, select, text, tuple_
from sqlalchemy.dialects.postgresql import ARRAY, UUID as PG_UUID
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.errors import InvalidArgument
from runledger_sync.core.retention import PruneResult, Retention
from runledger_sync.core.states import JobStatus
from runledger_sync.core.workflow import WorkflowRunStatus
from runledger_sync.db.schema import job_attempts, job_dead_letters, job_events, job_queue
from runledger_sync.db.schema_batches import FINISHED_BATCHES, job_batches
from runledger_sync.db.schema_rollup import job_rollup_minutes
from runledger_sync.db.schema_workflows import workflow_runs, workflow_steps
from runledger_sync.store.binds import Bind
from runledger_sync.store.transactions import owns_transaction, run_in_transaction

_q = job_queue.c
_r = workflow_runs.c
_m = job_rollup_minutes.c

DEFAULT_BATCH_SIZE = 1000
BATCH_SIZE_RANGE = (1, 100_000)
#: Caps set on each batch's own transaction: a batch that cannot finish in this
#: long is stopped (and the prune with it) rather than holding its locks on.
STATEMENT_TIMEOUT = "5s"
LOCK_TIMEOUT = "500ms"
#: Key of the transaction-scoped advisory lock an exclusive prune takes per batch
#: (``b"rlprune!"`` as a signed 64-bit integer).
PRUNE_LOCK_KEY = int.from_bytes(b"rlprune!", "big", signed=True)

FINISHED_JOB_STATUSES = (JobStatus.SUCCEEDED, JobStatus.CANCELED, JobStatus.DEAD_LETTERED)
FINISHED_RUN_STATUSES = tuple(
    status.value for status in (WorkflowRunStatus.SUCCEEDED, WorkflowRunStatus.COMPLETED_WITH_ERRORS,
                                WorkflowRunStatus.CANCELED)
)
LIVE_JOB_STATUSES = (JobStatus.PENDING.value, JobStatus.LEASED.value)

_IDS = bindparam("ids", type_=ARRAY(PG_UUID(as_uuid=True)))
_AGE = bindparam("age", type_=Interval)
_LIMIT = bindparam("batch_size", type_=Integer)
_AFTER_AT = bindparam("after_at", type_=DateTime(timezone=True))
_AFTER_ID = bindparam("after_id", type_=PG_UUID(as_uuid=True))


def _settings() -> Any:
    return select(
        func.set_config("statement_timeout", STATEMENT_TIMEOUT, True),
        func.set_config("lock_timeout", LOCK_TIMEOUT, True),
    )


def _try_lock() -> Any:
    return select(func.pg_try_advisory_xact_lock(bindparam("lock_key")))


def _pick_jobs(locking: bool, after: bool) -> Any:
    """Old finished jobs of one status outside workflows, oldest first: idx_job_queue_finished's head."""
    statement = (
        select(_q.id, _q.finished_at)
        .where(
            _q.status == bindparam("status"),
            _q.workflow_step_id.is_(None),
            _q.finished_at < func.now() - _AGE,
        )
        .order_by(_q.finished_at, _q.id)
        .limit(_LIMIT)
    )
    if after:
        statement = statement.where(tuple_(_q.finished_at, _q.id) > tuple_(_AFTER_AT, _AFTER_ID))
    return statement.with_for_update(skip_locked=True, of=job_queue) if locking else statement


def _pick_runs(locking: bool, after: bool) -> Any:
    """Old finished runs with no PENDING or LEASED job left, oldest first."""
    live_job: Any = (
        select(literal_column("1"))
        .select_from(workflow_steps.join(job_queue, _q.workflow_step_id == workflow_steps.c.id))
        .where(workflow_steps.c.run_id == _r.id, _q.status.in_(LIVE_JOB_STATUSES))
    )
    statement = (
        select(_r.id, _r.finished_at)
        .where(_r.status.in_(FINISHED_RUN_STATUSES), _r.finished_at < func.now() - _AGE, ~live_job.exists())
        .order_by(_r.finished_at, _r.id)
        .limit(_LIMIT)
    )
    if after:
        statement = statement.where(tuple_(_r.finished_at, _r.id) > tuple_(_AFTER_AT, _AFTER_ID))
    return statement.with_for_update(skip_locked=True, of=workflow_runs) if locking else statement


def _pick_batches(locking: bool, after: bool) -> Any:
    """Old finished batches with no PENDING or LEASED member left, oldest first: idx_job_batches_finished's head."""
    b = job_batches.c
    live_member: Any = select(literal_column("1")).where(_q.batch_id == b.id, _q.status.in_(LIVE_JOB_STATUSES))
    statement = (
        select(b.id, b.finished_at)
        .where(text(FINISHED_BATCHES), b.finished_at < func.now() - _AGE, ~live_member.exists())
        .order_by(b.finished_at, b.id)
        .limit(_LIMIT)
    )
    if after:
        statement = statement.where(tuple_(b.finished_at, b.id) > tuple_(_AFTER_AT, _AFTER_ID))
    return statement.with_for_update(skip_locked=True, of=job_batches) if locking else statement


_MEMBERS_OF_BATCHES = select(_q.id, _q.status).where(_q.batch_id == func.any(_IDS))
_DELETE_BATCHES = job_batches.delete().where(job_batches.c.id == func.any(_IDS))


def _jobs_of_runs() -> Any:
    return (
        select(_q.id, _q.status)
        .select_from(job_queue.join(workflow_steps, _q.workflow_step_id == workflow_steps.c.id))
        .where(workflow_steps.c.run_id == func.any(_IDS))
    )


def _count_of(table: Any) -> Any:
    return select(func.count()).select_from(table).where(table.c.job_id == func.any(_IDS)).scalar_subquery()


_COUNT_DEPENDENTS = select(_count_of(job_attempts), _count_of(job_events), _count_of(job_dead_letters))
_COUNT_STEPS = select(func.count()).select_from(workflow_steps).where(workflow_steps.c.run_id == func.any(_IDS))
_DELETE_JOBS = job_queue.delete().where(_q.id == func.any(_IDS))
_DELETE_RUNS = workflow_runs.delete().where(_r.id == func.any(_IDS))
_OLD_ROLLUP = _m.minute < func.now() - _AGE
_COUNT_ROLLUP = select(func.count()).select_from(job_rollup_minutes).where(_OLD_ROLLUP)
# The oldest minutes first, on the table's key (minute, queue).
_DELETE_ROLLUP = job_rollup_minutes.delete().where(tuple_(_m.minute, _m.queue).in_(
    select(_m.minute, _m.queue).where(_OLD_ROLLUP).order_by(_m.minute, _m.queue).limit(_LIMIT)
    .with_for_update(skip_locked=True)))
_PICKS = {(kind, locking, after): pick(locking, after)
          for kind, pick in (("jobs", _pick_jobs), ("runs", _pick_runs), ("batches", _pick_batches))
          for locking in (False, True) for after in (False, True)}


@dataclass
class _Tally:
    """The counts of a prune as it goes: :class:`PruneResult`'s, field for field."""

    jobs: dict[str, int] = field(default_factory=dict)
    attempts: int = 0
    events: int = 0
    dead_letters: int = 0
    workflow_runs: int = 0
    workflow_steps: int = 0
    rollup_minutes: int = 0
    batches: int = 0
    job_batches: int = 0
    contended: bool = False

    def add_jobs(self, connection: Connection, ids: Sequence[Any], statuses: Sequence[str], dry_run: bool) -> None:
        """Count the jobs' attempts, events and dead letters, then delete the jobs (they cascade)."""
        if not ids:
            return
        attempts, events, dead_letters = connection.execute(_COUNT_DEPENDENTS, {"ids": list(ids)}).one()
        self.attempts += attempts
        self.events += events
        self.dead_letters += dead_letters
        for status in statuses:
            self.jobs[status] = self.jobs.get(status, 0) + 1
        if not dry_run:
            connection.execute(_DELETE_JOBS, {"ids": list(ids)})


class _Batches:
    """Runs one kind of batch (jobs of a status, or runs) until nothing old is left."""

    def __init__(self, bind: Bind, tally: _Tally, batch_size: int, dry_run: bool, exclusive: bool,
                 max_batches: Optional[int], pause_seconds: float) -> None:
        self.bind, self.tally, self.batch_size = bind, tally, batch_size
        self.dry_run, self.exclusive, self.max_batches = dry_run, exclusive, max_batches
        self.pause_seconds = pause_seconds
        self.owned = owns_transaction(bind)

    @property
    def stopped(self) -> bool:
        return self.tally.contended or (self.max_batches is not None and self.tally.batches >= self.max_batches)

    def run(self, kind: str, age: timedelta, status: Optional[str] = None) -> None:
        after: Optional[tuple[Any, Any]] = None
        while not self.stopped:
            picked = run_in_transaction(
                self.bind, functools.partial(self._one, kind=kind, age=age, status=status, after=after))
            if picked is None:
                return
            last_id, last_finished_at = picked[-1]
            after = (last_finished_at, last_id)
            if len(picked) < self.batch_size:
                return
            if self.pause_seconds and not self.stopped:
                # Room for the live traffic between two batches: the prune is upkeep, never urgent.
                time.sleep(self.pause_seconds)

    def run_rollup(self, age: timedelta) -> None:
        """Delete the dashboard's rollup rows older than ``age``, oldest minutes first (dry: count them)."""
        while not self.stopped:
            deleted = run_in_transaction(self.bind, functools.partial(self._one_rollup, age=age))
            if deleted < self.batch_size or self.dry_run:
                return

    def _one_rollup(self, connection: Connection, age: timedelta) -> int:
        if self.owned:
            connection.execute(_settings())
        if self.exclusive and not connection.execute(_try_lock(), {"lock_key": PRUNE_LOCK_KEY}).scalar_one():
            self.tally.contended = True
            return 0
        if self.dry_run:
            rows = int(connection.execute(_COUNT_ROLLUP, {"age": age}).scalar_one())
        else:
            rows = connection.execute(_DELETE_ROLLUP, {"age": age, "batch_size": self.batch_size}).rowcount
        if rows:
            self.tally.rollup_minutes += rows
            self.tally.batches += 1
        return rows

    def _one(self, connection: Connection, kind: str, age: timedelta, status: Optional[str],
             after: Optional[tuple[Any, Any]]) -> Optional[list[tuple[Any, Any]]]:
        if self.owned:
            # Local to this batch's transaction; a caller's transaction keeps its own settings.
            connection.execute(_settings())
        if self.exclusive and not connection.execute(_try_lock(), {"lock_key": PRUNE_LOCK_KEY}).scalar_one():
            self.tally.contended = True
            return None
        params: dict[str, Any] = {"age": age, "batch_size": self.batch_size, "status": status}
        if after is not None:
            params |= {"after_at": after[0], "after_id": after[1]}
        picked = [tuple(row) for row in connection.execute(_PICKS[kind, not self.dry_run, after is not None], params)]
        if not picked:
            return None
        ids = [row[0] for row in picked]
        if kind == "jobs":
            self.tally.add_jobs(connection, ids, [status or ""] * len(ids), self.dry_run)
        elif kind == "batches":
            self._job_batches(connection, ids)
        else:
            self._runs(connection, ids)
        self.tally.batches += 1
        return picked

    def _runs(self, connection: Connection, run_ids: list[Any]) -> None:
        jobs = connection.execute(_jobs_of_runs(), {"ids": run_ids}).all()
        # The jobs first, in their own statement: their delete sets the steps' job_id to
        # NULL, and the run's delete then removes the steps (and their edges) by cascade.
        self.tally.add_jobs(connection, [row.id for row in jobs], [row.status for row in jobs], self.dry_run)
        self.tally.workflow_steps += connection.execute(_COUNT_STEPS, {"ids": run_ids}).scalar_one()
        self.tally.workflow_runs += len(run_ids)
        if not self.dry_run:
            connection.execute(_DELETE_RUNS, {"ids": run_ids})


    def _job_batches(self, connection: Connection, batch_ids: list[Any]) -> None:
        # Members first: a batch row is deleted once nothing refers to it.
        members = connection.execute(_MEMBERS_OF_BATCHES, {"ids": batch_ids}).all()
        self.tally.add_jobs(connection, [row.id for row in members], [row.status for row in members], self.dry_run)
        self.tally.job_batches += len(batch_ids)
        if not self.dry_run:
            connection.execute(_DELETE_BATCHES, {"ids": batch_ids})


def prune(
    bind: Bind,
    retention: Optional[Retention] = None,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    dry_run: bool = False,
    exclusive: bool = False,
    max_batches: Optional[int] = None,
    pause_seconds: float = 0.0,
) -> PruneResult:
    """Delete finished jobs and workflow runs older than ``retention``, in short batches; return the counts.

    SUCCEEDED, CANCELED and DEAD_LETTERED jobs go once their ``finished_at`` is
    older than the retention's age for that status, with their attempts, events
    and dead letter; finished workflow runs go once older than
    ``retention.workflow_runs``, with their steps and their steps' jobs; finished
    batches once older than ``retention.job_batches``, with their members; the
    dashboard's rollup rows once their minute is older than
    ``retention.dashboard_rollup``. An age of None keeps that kind. PENDING and
    LEASED jobs are never deleted, nor a
    workflow step's job while its run is kept.

    Args:
        bind: an Engine: each batch is its own transaction, committed at once, with
            its statements capped at 5 s and its lock waits at 500 ms. A
            Connection, ORM Session or psycopg connection: every batch joins the
            caller's transaction (the caller commits).
        retention: the ages (None: ``rl.Retention()``, the defaults).
        batch_size: most rows picked per batch (1..100,000).
        dry_run: count what would be deleted; delete nothing, lock nothing.
        exclusive: take a transaction-scoped advisory lock per batch and stop at
            once when another exclusive prune holds it (``PruneResult.contended``):
            the workers' pruners use it, so only one prunes at a time.
        max_batches: stop after this many batches (``PruneResult.complete`` is then
            False if more may be left); None runs until nothing old is left.
        pause_seconds: wait this long between two batches (0 to 10), leaving
            room to live traffic on a busy server at the cost of a slower prune.

    Raises:
        InvalidArgument: a bad ``retention``, ``batch_size`` or ``max_batches``.
        StoreError: a batch failed (a timeout, say); the batches before it stay deleted.

    Example:
        ``rl.prune(engine, rl.Retention(succeeded=timedelta(days=1)), dry_run=True).total_jobs``
    """
    retention = Retention() if retention is None else retention
    if not isinstance(retention, Retention):
        raise InvalidArgument("retention", retention, "an rl.Retention or None")
    check.check_int("batch_size", batch_size, BATCH_SIZE_RANGE)
    if max_batches is not None:
        check.check_int("max_batches", max_batches, (1, 2**31 - 1))
    if isinstance(pause_seconds, bool) or not isinstance(pause_seconds, (int, float)) or not 0 <= pause_seconds <= 10:
        raise InvalidArgument("pause_seconds", pause_seconds, "a number of seconds from 0 to 10")
    started = time.monotonic()
    tally = _Tally()
    batches = _Batches(bind, tally, batch_size, bool(dry_run), bool(exclusive), max_batches, float(pause_seconds))
    ages = {
        JobStatus.SUCCEEDED: retention.succeeded,
        JobStatus.CANCELED: retention.canceled,
        JobStatus.DEAD_LETTERED: retention.dead_lettered,
    }
    for status in FINISHED_JOB_STATUSES:
        age = ages[status]
        if age is not None:
            batches.run("jobs", age, status.value)
    if retention.workflow_runs is not None:
        batches.run("runs", retention.workflow_runs)
    if retention.job_batches is not None:
        batches.run("batches", retention.job_batches)
    if retention.dashboard_rollup is not None:
        batches.run_rollup(retention.dashboard_rollup)
    # The tally's fields are the result's counts by name: only what the run itself knows is added here.
    return PruneResult(**asdict(tally), elapsed_seconds=time.monotonic() - started, dry_run=bool(dry_run),
                       complete=not batches.stopped)


__all__ = ["DEFAULT_BATCH_SIZE", "PRUNE_LOCK_KEY", "prune"]
