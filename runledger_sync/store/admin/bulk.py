"""Operator actions on many jobs chosen by a filter: cancel, retry, delete, update; a dry run; the audit trail.

Each action follows the rule of its one-job version, written once in
:mod:`~runledger_sync.store.admin.actions`: a bulk cancel runs the statement of
``cancel_job`` (its attempt closed, its CANCELED event, the worker notified, its
workflow step ended and its dependents released or cancelled), a bulk retry
runs ``requeue_job``'s (the spec's requeue, T13: a new run, a REQUEUED event;
a workflow's job is left out and counted under
``job.workflow_requeue_not_supported``). A delete takes finished jobs outside
workflows, with their attempts, events and dead letter (the foreign keys
cascade, as retention's delete); an update moves PENDING jobs' priority or time
to run.

How it runs, so that live traffic never waits on it:

- The operation's row in ``job_operations`` is written first, with the count of
  jobs the filter matches (``matched``) at that moment, ``started_at``.
- The jobs are walked one status at a time in (created_at, id) order, a batch of
  :data:`BATCH_SIZE` per transaction: the batch locks its jobs with
  ``FOR UPDATE SKIP LOCKED`` (a job a worker or another action holds is passed
  over, never waited for), changes them in one statement, and moves the
  operation's ``changed`` and ``cursor`` on in the same transaction. No lock is
  held between batches, and no statement reads more than a batch's rows past
  the cursor through the listing indexes.
- Only jobs that existed when the operation began are acted on (created, and for
  a retry or delete finished, at or before ``started_at``): a job retried by the
  operation that finishes again meanwhile is not retried twice. Once every status
  is walked, the walk starts again from the first, to take the jobs passed over
  because they were locked (a PENDING job being claimed is LEASED by then), until
  a walk changes nothing (:data:`MAX_PASSES` at most).
- The row ends SUCCEEDED, or FAILED with the error's code. An operation whose
  process stopped stays RUNNING with its cursor; :func:`resume_operation` goes on
  from there.

A dry run counts what the action would take, changes nothing, and writes no row:
a confirmation page may ask for it on every view, and on a read-only connection.
"""

from __future__ import annotations

import functools
import getpass
import socket
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional
from uuid import UUID

from sqlalchemy import func, or_, select, tuple_, union_all
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.bulk import ACTOR_MAX_LENGTH, REASON_MAX_LENGTH, BulkResult, JobFilter, JobOperation, JobUpdate
from runledger_sync.core.bulk_errors import InvalidJobFilter, WorkflowDeleteNotSupported
from runledger_sync.core.errors import InvalidArgument, WorkflowRequeueNotSupported
from runledger_sync.core.ids import uuid7
from runledger_sync.core.states import JobStatus
from runledger_sync.db.schema import job_attempts, job_queue
from runledger_sync.db.schema_operations import job_operations
from runledger_sync.store.admin.actions import REQUEUE_PICKABLE, cancel_statement, requeue_statement, written_jobs
from runledger_sync.store.binds import Bind
from runledger_sync.store.rows import to_record
from runledger_sync.store.scope import check_job_id, meta_contains, status_is
from runledger_sync.store.transactions import owns_transaction, run_in_transaction

#: Jobs changed per transaction: small enough that a batch's locks last milliseconds.
BATCH_SIZE = 500
#: Walks over the statuses at most: the first, and the ones taking the jobs it passed over while locked.
MAX_PASSES = 3
DEFAULT_LIST_LIMIT = 100

_q = job_queue.c
_op = job_operations.c
_FINISHED = (JobStatus.SUCCEEDED, JobStatus.DEAD_LETTERED, JobStatus.CANCELED)
#: The statuses each action applies to (the dashboard draws its buttons by them), walked in this
#: order (a cancel's PENDING jobs before its LEASED ones: one being claimed as the walk passes is
#: LEASED by the next part).
ACTION_STATUSES: dict[str, tuple[JobStatus, ...]] = {
    "cancel": (JobStatus.PENDING, JobStatus.LEASED),
    "retry": _FINISHED,
    "delete": _FINISHED,
    "update": (JobStatus.PENDING,),
}
_IN_WORKFLOW = _q.workflow_step_id.is_not(None)
#: The actions that leave a workflow's jobs out, and the code they are counted under.
_REFUSED_IN_WORKFLOW = {"retry": WorkflowRequeueNotSupported.code, "delete": WorkflowDeleteNotSupported.code}


def default_actor() -> str:
    """Who acts when no actor is given: the operating-system user and the host (``alice@ops-1``)."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def filter_conditions(chosen: JobFilter) -> list[Any]:
    """The WHERE clauses of ``chosen``'s criteria, every value bound; metadata by containment (``@>``, the GIN index)."""
    conditions: list[Any] = []
    if chosen.job_types is not None:
        conditions.append(_q.job_type.in_(list(chosen.job_types)))
    if chosen.queues is not None:
        conditions.append(_q.queue.in_(list(chosen.queues)))
    if chosen.organization_id is not None:
        conditions.append(_q.organization_id == chosen.organization_id)
    if chosen.meta is not None:
        conditions.append(meta_contains(chosen.meta))
    if chosen.error_code is not None:
        conditions.append(_q.last_error_code == chosen.error_code)
    if chosen.error_type is not None:
        current_attempt = select(job_attempts.c.id).where(
            job_attempts.c.job_id == _q.id, job_attempts.c.run_number == _q.run_number,
            job_attempts.c.attempt == _q.attempt, job_attempts.c.error_type == chosen.error_type)
        conditions.append(current_attempt.exists())
    if chosen.created_after is not None:
        conditions.append(_q.created_at >= chosen.created_after)
    if chosen.created_before is not None:
        conditions.append(_q.created_at < chosen.created_before)
    return conditions


@dataclass(frozen=True)
class _Plan:
    """One bulk action, checked: what it does, to which statuses, among which jobs."""

    action: str
    chosen: JobFilter
    statuses: tuple[JobStatus, ...]
    reason: str
    update: Optional[JobUpdate] = None

    @classmethod
    def of(cls, action: str, chosen: Any, reason: Any, update: Optional[JobUpdate] = None) -> "_Plan":
        if not isinstance(chosen, JobFilter):
            raise InvalidJobFilter("filter", chosen, "a JobFilter")
        chosen.require_criteria(action)
        allowed = ACTION_STATUSES[action]
        if chosen.statuses is not None:
            others = [JobStatus(status).value for status in chosen.statuses if status not in allowed]
            if others:
                raise InvalidJobFilter("statuses", others, f"among {', '.join(s.value for s in allowed)} "
                                                           f"(a {action} acts on no other)")
        statuses = tuple(status for status in allowed if chosen.statuses is None or status in chosen.statuses)
        check.check_text("reason", reason, max_length=REASON_MAX_LENGTH)
        return cls(action, chosen, statuses, reason, update)

    def among(self, status: JobStatus, until: Any) -> list[Any]:
        """The jobs of ``status`` the action may look at: the filter's, there when it began."""
        existing = [_q.created_at <= until]
        if status in _FINISHED:
            existing.append(_q.finished_at <= until)
        return [status_is(status), *filter_conditions(self.chosen), *existing]

    def pickable(self) -> list[Any]:
        """What the action's rule asks of a job besides its status (the one-job version's rule)."""
        if self.action == "retry":
            return list(REQUEUE_PICKABLE[1:])
        if self.action == "delete":
            return [_q.workflow_step_id.is_(None)]
        if self.action == "update" and self.update is not None:
            # A job already as asked is not changed again (by a later walk, or a resume).
            differs = []
            if self.update.priority is not None:
                differs.append(_q.priority != self.update.priority)
            if self.update.run_at is not None:
                differs.append(_q.next_run_at != self.update.run_at)
            return [or_(*differs)]
        return []

    def count(self, connection: Connection, until: Any) -> tuple[int, dict[str, int]]:
        """How many jobs the action matches now, and how many of them its rule leaves out, by code."""
        parts = [select(func.count().label("n"), func.count().filter(_IN_WORKFLOW).label("in_workflow"))
                 .select_from(job_queue).where(*self.among(status, until)) for status in self.statuses]
        rows = connection.execute(union_all(*parts) if len(parts) > 1 else parts[0]).all()
        matched = sum(row.n for row in rows)
        in_workflow = sum(row.in_workflow for row in rows)
        code = _REFUSED_IN_WORKFLOW.get(self.action)
        return matched, ({code: in_workflow} if code and in_workflow else {})

    def batch_statement(self, status: JobStatus, until: datetime, after: Optional[tuple[datetime, UUID]]) -> Any:
        """The statement changing the next batch of ``status`` past ``after``; it returns their ids and created_at."""
        picked = select(_q.id, _q.run_number, _q.attempt).where(*self.among(status, until), *self.pickable())
        if after is not None:
            picked = picked.where(tuple_(_q.created_at, _q.id) > tuple_(*after))
        picked = picked.order_by(_q.created_at, _q.id).limit(BATCH_SIZE).with_for_update(skip_locked=True)
        if self.action == "cancel":
            return cancel_statement(picked=picked)
        if self.action == "retry":
            return requeue_statement(picked)
        target = _q.id == picked.subquery("picked").c.id
        if self.action == "delete":
            return job_queue.delete().where(target).returning(_q.id, _q.created_at)
        values = {"priority": self.update.priority, "next_run_at": self.update.run_at} if self.update else {}
        given = {name: value for name, value in values.items() if value is not None}
        return job_queue.update().where(target).values(**given).returning(_q.id, _q.created_at)

    def run_batch(self, connection: Connection, operation_id: UUID, status: JobStatus, until: datetime,
                  after: Optional[tuple[datetime, UUID]], passes: int) -> Optional[tuple[datetime, UUID]]:
        """Change one batch and move the operation on; return the batch's last (created_at, id), None when done."""
        statement = self.batch_statement(status, until, after)
        parameters = {"reason": self.reason}
        if self.action in ("cancel", "retry"):
            rows: list[Any] = written_jobs(connection, statement, parameters)
        else:
            rows = list(connection.execute(statement).all())
        if not rows:
            return None
        last = max((row.created_at, row.id) for row in rows)
        cursor = {"pass": passes, "status": status.value, "created_at": last[0].isoformat(), "id": str(last[1])}
        connection.execute(job_operations.update().where(_op.id == operation_id).values(
            changed=_op.changed + len(rows), cursor=cursor, updated_at=func.now()))
        return last if len(rows) == BATCH_SIZE else None

    def walk(self, bind: Bind, operation_id: UUID, until: datetime, cursor: Optional[dict[str, Any]] = None) -> None:
        """Walk the statuses, then again while a walk still changes jobs; from ``cursor`` when resuming."""
        start_pass, start_status, start_after = 1, None, None
        if cursor is not None:
            start_pass, start_status = int(cursor["pass"]), JobStatus(cursor["status"])
            start_after = (datetime.fromisoformat(cursor["created_at"]), UUID(cursor["id"]))
        for passes in range(start_pass, MAX_PASSES + 1):
            before = _changed(bind, operation_id)
            for status in self.statuses:
                if start_status is not None:
                    if status != start_status:
                        continue
                    after: Optional[tuple[datetime, UUID]] = start_after
                    start_status = None
                else:
                    after = None
                while True:
                    after = run_in_transaction(bind, functools.partial(
                        self.run_batch, operation_id=operation_id, status=status, until=until, after=after,
                        passes=passes))
                    if after is None:
                        break
            if _changed(bind, operation_id) == before and cursor is None:
                return
            cursor = None


def _changed(bind: Bind, operation_id: UUID) -> int:
    statement = select(_op.changed).where(_op.id == operation_id)
    return int(run_in_transaction(bind, lambda connection: connection.execute(statement).scalar_one()))


def _run(bind: Bind, plan: _Plan, actor: Any, dry_run: bool) -> BulkResult:
    if not isinstance(dry_run, bool):
        raise InvalidArgument("dry_run", dry_run, "True or False")
    actor = default_actor() if actor is None else check.check_text("actor", actor, max_length=ACTOR_MAX_LENGTH)
    if dry_run:
        matched, skipped = run_in_transaction(bind, lambda connection: plan.count(connection, func.now()))
        return BulkResult(plan.action, matched, 0, skipped, dry_run=True)
    operation_id = uuid7()

    def start(connection: Connection) -> tuple[datetime, int, dict[str, int]]:
        started_at = connection.execute(job_operations.insert().values(
            id=operation_id, action=plan.action, actor=actor, reason=plan.reason, filter=plan.chosen.to_json(),
            changes=plan.update.to_json() if plan.update else {},
        ).returning(_op.started_at)).scalar_one()
        matched, skipped = plan.count(connection, started_at)
        connection.execute(job_operations.update().where(_op.id == operation_id).values(
            matched=matched, skipped=skipped))
        return started_at, matched, skipped

    started_at, matched, skipped = run_in_transaction(bind, start)
    _finish_walk(bind, plan, operation_id, started_at)
    return BulkResult(plan.action, matched, _changed(bind, operation_id), skipped, operation_id=operation_id)


def _finish_walk(bind: Bind, plan: _Plan, operation_id: UUID, started_at: datetime,
                 cursor: Optional[dict[str, Any]] = None) -> None:
    """Walk, then mark the operation SUCCEEDED, or FAILED with the error's code (the error is raised)."""
    try:
        plan.walk(bind, operation_id, started_at, cursor)
    except Exception as error:
        # Given the caller's transaction, the error may have aborted it: the caller decides.
        if owns_transaction(bind):
            _end(bind, operation_id, "FAILED", getattr(error, "code", "runledger.error"))
        raise
    _end(bind, operation_id, "SUCCEEDED", None)


def _end(bind: Bind, operation_id: UUID, status: str, error_code: Optional[str]) -> None:
    statement = job_operations.update().where(_op.id == operation_id).values(
        status=status, error_code=error_code, finished_at=func.now(), updated_at=func.now())
    run_in_transaction(bind, lambda connection: connection.execute(statement))


def cancel_jobs(bind: Bind, filter: JobFilter, *, reason: str, actor: Optional[str] = None,
                dry_run: bool = False) -> BulkResult:
    """Cancel every PENDING and LEASED job ``filter`` matches, as :func:`runledger_sync.cancel_job` cancels one.

    Each job's open attempt is closed and a CANCELED event written with ``reason``;
    the workers running them are notified and set their handlers' cancellation flag;
    a workflow's job ends its step, which releases or cancels its dependents.

    Args:
        bind: an Engine (each batch committed on its own), or a Connection, ORM Session or
            psycopg (2 or 3) connection whose open transaction every batch joins.
        filter: which jobs; at least one criterion (``statuses=["PENDING", "LEASED"]`` for every job).
        reason: why, kept on each job (``status_reason``, its CANCELED event) and the operation.
        actor: who, kept on the operation; None: the OS user and host (``alice@ops-1``).
        dry_run: count the jobs it would cancel; change nothing and record nothing.

    Returns:
        How many jobs it matched and canceled, and the operation's id.

    Raises:
        EmptyJobFilter: the filter names nothing.
        InvalidJobFilter: a status other than PENDING or LEASED, or a malformed filter.

    Example:
        ``rl.cancel_jobs(engine, rl.JobFilter(meta={"tenant": "acme"}), reason="tenant offboarded")``
    """
    return _run(bind, _Plan.of("cancel", filter, reason), actor, dry_run)


def retry_jobs(bind: Bind, filter: JobFilter, *, reason: str, actor: Optional[str] = None,
               dry_run: bool = False) -> BulkResult:
    """Run again every finished job ``filter`` matches, as :func:`runledger_sync.requeue_job` runs one.

    Each SUCCEEDED, DEAD_LETTERED or CANCELED job starts a new run (run_number + 1)
    from attempt 0, with a REQUEUED event carrying ``reason``. A workflow's job is
    left out (a step runs once per run) and counted in ``skipped`` under
    ``job.workflow_requeue_not_supported``.

    Args:
        bind: an Engine (each batch committed on its own), or a Connection, ORM Session or
            psycopg (2 or 3) connection whose open transaction every batch joins.
        filter: which jobs; at least one criterion.
        reason: why, kept on each job and the operation.
        actor: who; None: the OS user and host.
        dry_run: count; change nothing, record nothing.

    Raises:
        EmptyJobFilter: the filter names nothing.
        InvalidJobFilter: a status that has not finished, or a malformed filter.

    Example:
        ``rl.retry_jobs(engine, rl.JobFilter(error_code="http.timeout", statuses=["DEAD_LETTERED"]), reason="API back")``
    """
    return _run(bind, _Plan.of("retry", filter, reason), actor, dry_run)


def delete_jobs(bind: Bind, filter: JobFilter, *, reason: str, actor: Optional[str] = None,
                dry_run: bool = False) -> BulkResult:
    """Delete every finished job ``filter`` matches, with its attempts, events and dead letter.

    Only SUCCEEDED, DEAD_LETTERED and CANCELED jobs are deleted; a workflow's job
    is deleted with its run (by :func:`runledger_sync.prune`), and counted in
    ``skipped`` under ``job.workflow_delete_not_supported``.

    Args:
        bind: an Engine (each batch committed on its own), or a Connection, ORM Session or
            psycopg (2 or 3) connection whose open transaction every batch joins.
        filter: which jobs; at least one criterion.
        reason: why, kept on the operation.
        actor: who; None: the OS user and host.
        dry_run: count; change nothing, record nothing.

    Raises:
        EmptyJobFilter: the filter names nothing.
        InvalidJobFilter: a status that has not finished, or a malformed filter.

    Example:
        ``rl.delete_jobs(engine, rl.JobFilter(job_types=["report.build"], statuses=["CANCELED"]), reason="cleanup")``
    """
    return _run(bind, _Plan.of("delete", filter, reason), actor, dry_run)


def update_jobs(bind: Bind, filter: JobFilter, *, reason: str, actor: Optional[str] = None, dry_run: bool = False,
                priority: Optional[int] = None, run_at: Optional[datetime] = None) -> BulkResult:
    """Set the priority, the time to run, or both, of every PENDING job ``filter`` matches.

    A job already as asked is not counted as changed.

    Args:
        bind: an Engine (each batch committed on its own), or a Connection, ORM Session or
            psycopg (2 or 3) connection whose open transaction every batch joins.
        filter: which jobs; at least one criterion.
        reason: why, kept on the operation.
        actor: who; None: the OS user and host.
        dry_run: count; change nothing, record nothing.
        priority: the new priority (higher runs first), -1,000,000 to 1,000,000.
        run_at: the new time to run (timezone-aware); now or earlier makes them due.

    Raises:
        EmptyJobFilter: the filter names nothing.
        InvalidJobFilter: a status other than PENDING, or a malformed filter.
        InvalidJobUpdate: neither ``priority`` nor ``run_at``, or one out of range.

    Example:
        ``rl.update_jobs(engine, rl.JobFilter(queues=["reports"]), reason="month end", priority=500)``
    """
    return _run(bind, _Plan.of("update", filter, reason, JobUpdate(priority, run_at)), actor, dry_run)


def list_operations(bind: Bind, limit: int = DEFAULT_LIST_LIMIT) -> list[JobOperation]:
    """Return the bulk actions recorded, newest first: who, what, the filter, the counts, when.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
    """
    check.check_int("limit", limit, check.LIMIT_RANGE)
    statement = (select(*(_op[name] for name in JobOperation.__dataclass_fields__))
                 .order_by(_op.started_at.desc(), _op.id.desc()).limit(limit))
    rows = run_in_transaction(bind, lambda connection: connection.execute(statement).all())
    return [to_record(JobOperation, row) for row in rows]


def resume_operation(bind: Bind, operation_id: UUID | str) -> BulkResult:
    """Go on with an operation whose process stopped (still RUNNING), from its cursor; finish it.

    The jobs it acts on are those it would have acted on: the filter it recorded,
    among the jobs there when it began.

    Raises:
        InvalidArgument: no RUNNING operation has this id.
    """
    wanted = check_job_id(operation_id)
    statement = select(*(_op[name] for name in JobOperation.__dataclass_fields__)).where(
        _op.id == wanted, _op.status == "RUNNING")
    row = run_in_transaction(bind, lambda connection: connection.execute(statement).first())
    if row is None:
        raise InvalidArgument("operation_id", str(wanted), "the id of a RUNNING operation")
    operation = to_record(JobOperation, row)
    changes = operation.changes
    update = JobUpdate(changes.get("priority"), _moment(changes.get("run_at"))) if operation.action == "update" else None
    recorded = dict(operation.filter)
    for name in ("created_after", "created_before"):
        recorded[name] = _moment(recorded.get(name))
    plan = _Plan.of(operation.action, JobFilter(**recorded), operation.reason, update)
    _finish_walk(bind, plan, operation.id, operation.started_at, operation.cursor)
    return BulkResult(plan.action, operation.matched, _changed(bind, operation.id), operation.skipped,
                      operation_id=operation.id)


def _moment(value: Optional[str]) -> Optional[datetime]:
    return None if value is None else datetime.fromisoformat(value)


__all__ = [
    "cancel_jobs",
    "delete_jobs",
    "list_operations",
    "resume_operation",
    "retry_jobs",
    "update_jobs",
]
