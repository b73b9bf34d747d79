"""The lease fence: the one guard of every write a worker makes to a job it claimed.

A write is fenced by the lease identity (id, run_number, attempt, worker_id)
and status LEASED. The writes that keep a job running (stage ``running``, a
renewal, progress) also need a live lease: ``lease_expires_at`` later than
``clock_timestamp()`` when the write happens. A decided outcome does not: it
lands as long as nobody else took the job (:func:`outcome_lease`).
Single and group writes alike run two statements in one transaction:

1. :data:`LOCK_LEASES` locks the rows still held under the identities, in id
   order (two writers then never deadlock);
2. the write, whose WHERE clause is :func:`live_lease` (or :func:`held_under`).

Why two: under READ COMMITTED a statement judges rows by the snapshot it took
when it began. One statement that waited on a row lock would still test the
version it saw before the wait, so a lease renewed meanwhile (a heartbeat that
committed first) would look expired, and a finished job would stay LEASED for
the reaper to run again. The second statement starts after the lock is held, so
it sees the row as the last committer left it, and nobody can change it before
this transaction ends. On the store's own connections both are prepared and
sent in one round trip.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence
from uuid import UUID

from sqlalchemy import Integer, Text, and_, any_, bindparam, func, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.engine import Connection, CursorResult

from runledger_sync.core import validation as check
from runledger_sync.core.errors import InvalidArgument, LeaseOwnerMismatch
from runledger_sync.core.records import JobRecord, LeaseIdentity
from runledger_sync.core.states import JobStatus
from runledger_sync.core.workflow_errors import WorkflowReleaseConflict
from runledger_sync.db.schema import job_queue
from runledger_sync.store.prepared import PreparedStatement, execute_in_turn
from runledger_sync.store.rows import to_job
from runledger_sync.store.workflows.steps import job_ends, jobs_ended

_q = job_queue.c
_LEASED = JobStatus.LEASED.value

#: Per-lease result of a group write: None once written, or why it was not: its fence
#: refused it, or (a workflow's job) its run is being cancelled.
LeaseResult = Optional[LeaseOwnerMismatch | WorkflowReleaseConflict]

#: (column of the unnested leases, array parameter, its type): the identities as bound arrays.
IDENTITY_ARRAYS = (
    ("job_id", "lease_job_ids", ARRAY(PG_UUID(as_uuid=True))),
    ("run_number", "lease_run_numbers", ARRAY(Integer)),
    ("attempt", "lease_attempts", ARRAY(Integer)),
    ("worker_id", "lease_worker_ids", ARRAY(Text)),
)


def check_identity(job_id: Any, run_number: Any, attempt: Any, worker_id: Any) -> LeaseIdentity:
    """The lease identity of a fenced write, each part checked (a coded error for a bad one)."""
    if not isinstance(job_id, UUID):
        raise InvalidArgument("job_id", job_id, "a UUID")
    check.check_int("run_number", run_number, (1, 2**31 - 1))
    check.check_int("attempt", attempt, (1, 2**31 - 1))
    check.check_text("worker_id", worker_id, max_length=check.WORKER_ID_MAX_LENGTH)
    return LeaseIdentity(job_id, run_number, attempt, worker_id)


def held_under(job_id: Any, run_number: Any, attempt: Any, worker_id: Any) -> Any:
    """WHERE clause: the row is LEASED under this lease identity (bound values or columns)."""
    return and_(
        _q.id == job_id, _q.run_number == run_number, _q.attempt == attempt, _q.worker_id == worker_id,
        # The same test as =, which no index can serve: a plan made on a near-empty
        # table could otherwise read a whole index for it rather than look the id up.
        _q.status.is_not_distinct_from(_LEASED),
    )


def live_lease(job_id: Any, run_number: Any, attempt: Any, worker_id: Any) -> Any:
    """WHERE clause of a fenced write: held under the identity, and the lease still live now."""
    return and_(held_under(job_id, run_number, attempt, worker_id), _q.lease_expires_at > func.clock_timestamp())


def outcome_lease(job_id: Any, run_number: Any, attempt: Any, worker_id: Any) -> Any:
    """WHERE clause of an outcome write: held under the identity, whether or not its lease ran out.

    A lease that ran out while the database was out of reach still names the one
    attempt that ran: until the reaper hands the job on (a new attempt or run, or
    another status), the worker's decided outcome is the truth, and dropping it
    would run the job again or dead-letter it. The reaper, back from an outage,
    gives workers time to land such outcomes first.
    """
    return held_under(job_id, run_number, attempt, worker_id)


def one_lease() -> tuple[Any, Any, Any, Any]:
    """The identity of a single write, as bound values (see :meth:`LeaseIdentity.params`)."""
    return (
        bindparam("lease_job_id", type_=PG_UUID(as_uuid=True)),
        bindparam("lease_run_number", type_=Integer),
        bindparam("lease_attempt", type_=Integer),
        bindparam("lease_worker_id", type_=Text),
    )


def unnested(arrays: Sequence[tuple[str, str, Any]] = IDENTITY_ARRAYS) -> Any:
    """The bound arrays as rows, one per lease, so the statement text never depends on the count.

    Column ``n`` is each lease's position in the arrays, from 1: a group write
    returns it, and the caller answers each lease by it.
    """
    return (
        func.unnest(*(bindparam(param, type_=array_type) for _, param, array_type in arrays))
        .table_valued(*(column for column, _, _ in arrays), with_ordinality="n")
        .render_derived(name="leases")
    )


def leases_columns(leases: Any) -> tuple[Any, Any, Any, Any]:
    # A group's leases are one worker's but in a caller's mixed group: the worker id
    # is sent once, and the array of them is NULL (unnest pads it) unless they differ.
    worker_id = func.coalesce(leases.c.worker_id, bindparam("lease_worker_id", type_=Text))
    return leases.c.job_id, leases.c.run_number, leases.c.attempt, worker_id


def by_listed_ids() -> Any:
    # The ids once more as an array: rows are then found by primary key in
    # whichever order a plan made once joins them to the leases.
    return _q.id == any_(bindparam("lease_job_ids", type_=ARRAY(PG_UUID(as_uuid=True))))


def _build_lock() -> Any:
    leases = unnested()
    return (
        # max_attempts: a failure write asks the dead-letter rule of the locked row.
        select(_q.id, _q.max_attempts)
        .select_from(job_queue.join(leases, and_(held_under(*leases_columns(leases)), by_listed_ids())))
        .order_by(_q.id)
        .with_for_update(of=job_queue)
    )


# Every table is reached by an indexed id, so one plan serves at any size.
LOCK_LEASES = PreparedStatement("lock_leases", _build_lock())


def lease_params(identities: Sequence[LeaseIdentity]) -> dict[str, Any]:
    """The identities as the array parameters of :data:`LOCK_LEASES` and of group writes."""
    worker_ids = [i.worker_id for i in identities]
    one_worker = all(worker_id == worker_ids[0] for worker_id in worker_ids[1:])
    return {
        "lease_job_ids": [i.job_id for i in identities],
        "lease_run_numbers": [i.run_number for i in identities],
        "lease_attempts": [i.attempt for i in identities],
        "lease_worker_id": worker_ids[0] if worker_ids else None,
        "lease_worker_ids": None if one_worker else worker_ids,
    }


def write_fenced(
    connection: Connection, statements: Sequence[PreparedStatement], identities: Sequence[LeaseIdentity],
    parameters: dict[str, Any], *, settings: Sequence[PreparedStatement] = (),
) -> CursorResult:  # unparametrised: rows of any width, read by position too
    """Lock the leases' rows, then run ``statements``; return the last one's result.

    ``settings`` run first (SET LOCAL statements the lock wait must obey).
    """
    return execute_in_turn(connection, (*settings, LOCK_LEASES, *statements), lease_params(identities) | parameters)


def lease_mismatch(identity: LeaseIdentity) -> LeaseOwnerMismatch:
    """The error of a write whose fence refused ``identity``."""
    return LeaseOwnerMismatch(
        f"job {identity.job_id} run {identity.run_number} attempt {identity.attempt} is not leased "
        f"to {identity.worker_id!r} (with a live lease, for a write that keeps the job running)",
        job_id=str(identity.job_id),
    )


def write_one_fenced(
    connection: Connection, statement: PreparedStatement, params: dict[str, Any], identity: LeaseIdentity,
    *, settings: Sequence[PreparedStatement] = (),
) -> JobRecord:
    """Lock ``identity``'s row, then run ``statement``; return the written job or raise LeaseOwnerMismatch."""
    row = write_fenced(connection, (statement,), [identity], params, settings=settings).first()
    if row is None:
        raise lease_mismatch(identity)
    return to_job(row)


def write_leases(
    connection: Connection, statement: PreparedStatement, identities: list[LeaseIdentity],
    values: dict[str, Any], *, end_steps: bool = False,
) -> list[LeaseResult]:
    """Lock the identities' rows, run ``statement``; answer each identity (``end_steps``: then end its workflow step).

    The group form of :func:`write_one_fenced`: a refused lease never stops the others from landing.
    """
    rows = write_fenced(connection, (statement,), identities, values).all()
    if end_steps:
        jobs_ended(connection, job_ends(rows))
    # Each written row names its lease by position (column n of :func:`unnested`).
    written = {row.n for row in rows}
    return [None if n in written else lease_mismatch(identity) for n, identity in enumerate(identities, start=1)]
