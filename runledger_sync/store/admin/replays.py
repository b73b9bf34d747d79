"""Audited replays (spec ``job_replays``): a compare-and-requeue that records who ran a job again, and why.

A replay is :func:`~runledger_sync.store.admin.actions.requeue_job`'s requeue,
with its rules (finished jobs outside workflows, the expectations, READ
COMMITTED), plus one ``job_replays`` row written by the same statement. The
replay key makes it idempotent: a request whose key already replayed the job
gets that replay back and requeues nothing more, whoever asked first.

Two requests with one key meet at the job's row lock: the second waits for the
first's commit, then finds the job no longer finished and nothing to requeue,
and reads the replay the first recorded. If the job finished again in between,
the second's row collides with the first's in the unique index instead; a
savepoint keeps that collision from spoiling the caller's transaction.
"""

from __future__ import annotations

from typing import Any, Optional
from uuid import UUID

from sqlalchemy import Integer, Text, bindparam, select
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import UUID as PgUUID
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.errors import CompareAndRequeueUnsupportedIsolation
from runledger_sync.core.ids import uuid7
from runledger_sync.core.replay_errors import ReplayIdempotencyConflict, ReplayIdempotencyConflictMissingExisting
from runledger_sync.core.replays import JobReplay, ReplayRequest, check_actor, check_replay_key, check_replay_reason
from runledger_sync.core.states import JobStatus
from runledger_sync.db.errors import violated_constraint
from runledger_sync.db.schema_replays import job_replays
from runledger_sync.store.admin.actions import REQUEUABLE, Expectation, pick_to_requeue, requeue_statement, transition_error
from runledger_sync.store.binds import Bind
from runledger_sync.store.scope import check_job_id
from runledger_sync.store.transactions import require_read_committed, run_in_transaction

_r = job_replays.c
_KEY_INDEX = "uq_job_replays_job_id_replay_key"
_FIND = select(*job_replays.c).where(_r.job_id == bindparam("target_id"), _r.replay_key == bindparam("replay_key"))


def _replay_statement(expected: Optional[Expectation]) -> Any:
    """The requeue, with its REQUEUED event, and the replay row naming the run it started; returns that row."""
    requeued = requeue_statement(pick_to_requeue(None, expected)).cte("replayed_job")
    recorded = job_replays.insert().from_select(
        ["id", "job_id", "replay_key", "actor", "reason", "expected_status", "expected_run_number", "run_number"],
        select(
            bindparam("replay_id", type_=PgUUID(as_uuid=True)),
            requeued.c.id,
            bindparam("replay_key", type_=Text),
            bindparam("actor", type_=Text),
            bindparam("reason", type_=Text),
            bindparam("expected_status", type_=Text),
            bindparam("expected_run_number", type_=Integer),
            requeued.c.run_number,
        ),
    ).returning(*job_replays.c)
    return recorded.add_cte(requeued)


def replay_job(
    bind: Bind,
    job_id: UUID | str,
    *,
    replay_key: str,
    reason: str,
    actor: Optional[str] = None,
    expected_status: Optional[JobStatus | str] = None,
    expected_run_number: Optional[int] = None,
) -> JobReplay:
    """Run a finished job again and record who did it and why; the same ``replay_key`` replays it once.

    The requeue is :func:`requeue_job`'s (a new run from attempt 0, ``reason`` as its
    status reason and REQUEUED event), with ``expected_status`` and
    ``expected_run_number`` as its compare-and-requeue. A ``job_replays`` row is
    written with it, in one transaction. Asked again with the same key and the same
    request (reason, actor, expectations), the recorded replay is returned
    (``disposition == "existing"``) and nothing more is requeued, however many
    callers race; with a different request the key is refused.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits; it
            must be READ COMMITTED).
        replay_key: names the replay, e.g. one per form shown or per incident ticket;
            unique per job, at most 255 characters.
        reason: why the job runs again (required: it is the audit trail).
        actor: who asked (the dashboard passes its authorize hook's user).

    Returns:
        The replay: ``run_number`` is the run it started.

    Raises:
        ReplayKeyBlank, ReplayKeyTooLong, ReplayReasonBlank: the key or reason is refused.
        ReplayIdempotencyConflict: the key already replayed the job for another request.
        JobNotFound: no such job.
        WorkflowRequeueNotSupported: the job runs a workflow's step.
        RequeueExpectationFailed: the job's status or run is not the one expected.
        InvalidStateTransition: the job is still PENDING or LEASED.
        CompareAndRequeueUnsupportedIsolation: the transaction is not READ COMMITTED.
    """
    target = check_job_id(job_id)
    key = check_replay_key(replay_key)
    expected = Expectation.of(expected_status, expected_run_number)
    request = ReplayRequest(check_replay_reason(reason), check_actor(actor),
                            expected.status if expected else None, expected.run_number if expected else None)
    parameters = {
        "target_id": target, "replay_key": key, "replay_id": uuid7(), "reason": request.reason, "actor": request.actor,
        "expected_status": request.expected_status, "expected_run_number": request.expected_run_number,
    }
    statement = _replay_statement(expected)

    def work(connection: Connection) -> JobReplay:
        # Each statement reads what committed before it started: a replay this one waited for is seen.
        require_read_committed(connection, CompareAndRequeueUnsupportedIsolation, "a replay")
        found = connection.execute(_FIND, parameters).first()
        if found is not None:
            return _the_same(found, request, key)
        try:
            with connection.begin_nested():
                row = connection.execute(statement, parameters).first()
        except sa_exc.IntegrityError as error:
            if violated_constraint(error) != _KEY_INDEX:
                raise
            return _recorded_meanwhile(connection, parameters, request, key)
        if row is not None:
            return _replay(row, "created")
        # Nothing was finished to requeue: the job may have been replayed with this key while this waited.
        found = connection.execute(_FIND, parameters).first()
        if found is not None:
            return _the_same(found, request, key)
        raise transition_error(connection, target, None, "requeued", REQUEUABLE, expected)

    return run_in_transaction(bind, work)


def _recorded_meanwhile(connection: Connection, parameters: dict[str, Any], request: ReplayRequest, key: str) -> JobReplay:
    found = connection.execute(_FIND, parameters).first()
    if found is None:
        raise ReplayIdempotencyConflictMissingExisting(
            f"replay key {key!r} of job {parameters['target_id']} conflicted, but its replay was not found",
            job_id=str(parameters["target_id"]), replay_key=key)
    return _the_same(found, request, key)


def _the_same(found: Any, request: ReplayRequest, key: str) -> JobReplay:
    """The replay ``key`` recorded, if it was for this request; nothing is requeued either way."""
    replay = _replay(found, "existing")
    if replay.request != request:
        raise ReplayIdempotencyConflict(
            f"job {replay.job_id} was already replayed with key {key!r} for another request "
            f"(reason, actor or expectations differ); use a new key to run it again",
            job_id=str(replay.job_id), replay_key=key, replay_id=str(replay.id), run_number=replay.run_number)
    return replay


def _replay(row: Any, disposition: Optional[str] = None) -> JobReplay:
    return JobReplay(**{column.name: row._mapping[column.name] for column in job_replays.c}, disposition=disposition)


def list_replays(bind: Bind, job_id: Optional[UUID | str] = None, limit: int = 100) -> list[JobReplay]:
    """Return replays, newest first: one job's, or every job's.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        job_id: only this job's replays.
        limit: the most to return (1 to 100,000).
    """
    check.check_int("limit", limit, check.LIMIT_RANGE)
    statement = select(*job_replays.c).order_by(_r.created_at.desc(), _r.id.desc()).limit(limit)
    if job_id is not None:
        statement = statement.where(_r.job_id == check_job_id(job_id))
    rows = run_in_transaction(bind, lambda connection: connection.execute(statement).all())
    return [_replay(row) for row in rows]
