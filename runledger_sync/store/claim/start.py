"""The worker's claim and its running write: two transactions, one round trip.

A job a worker claims costs two writes before its handler may start: the claim,
then stage ``running`` (the spec's prestart rule: user code runs only after
RUNNING is persisted). Sent one after the other, each waits for its own answer.
Here both go out as one query: the claim in a BEGIN ... COMMIT block of its own,
then the running write as the query's last transaction, for exactly the jobs
the claim just leased (found by the attempt ids the claim inserted, which the
caller chose). They stay two transactions, so the claim is never undone by a
running write that fails, and a claim handed back stays an unspent attempt.

The claim commits with ``synchronous_commit`` off: its commit does not wait for
the disk. The running write's commit does, and flushing the WAL up to it
flushes the claim too, so by the time any job comes back (and its handler may
start) both are durable. A server crash before that can lose the claim, which
is then simply claimed again: no handler ever ran on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from sqlalchemy import Text, and_, any_, bindparam, cast, func, literal, or_, select, union_all
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.engine import Connection, Engine

from runledger_sync.core.encryption import SEALED_FIELD, active_encryption, missing_key
from runledger_sync.core.errors import RunledgerError
from runledger_sync.core.records import JobRecord
from runledger_sync.core.types import ClaimOrigin, DEFAULT_EVENT_LOG, EventLog
from runledger_sync.db.schema import job_attempts, job_queue
from runledger_sync.store.transactions import run_in_transaction
from runledger_sync.store.attempt.fence import held_under, live_lease
from runledger_sync.store.prepared import PreparedStatement, execute_transactions
from runledger_sync.store.rows import JOB_TEXT_COLUMNS, to_jobs
from runledger_sync.store.sql import ids_of
from runledger_sync.store.attempt.transitions import build_running
from runledger_sync.store.claim.claim import (
    CLAIM_FOR_TYPES_UNREAD,
    CLAIM_FOR_TYPES_UNREAD_UNLIMITED,
    PRESTART_CLAIM_SETTINGS,
    PRESTART_UNLIMITED_CLAIM_SETTINGS,
    claim_params,
)
from runledger_sync.store.transactions import HeldConnection

_q = job_queue.c
_a = job_attempts.c


@dataclass(frozen=True)
class StartedClaim:
    """What one claim-and-start call leased.

    ``running``: persisted RUNNING, in claim order; their handlers may start.
    ``unstarted``: leased, but the running write's fate is ``error`` (it failed,
    or its reply was lost and it may have landed); the caller applies the
    pipeline's rule to each (run it if RUNNING landed, else hand the claim back); with no
    ``error``, the jobs sealed under an encryption key this process lacks, which the running
    write left alone for the worker to hand back unspent.
    A job whose running write the lease fence refused (its lease ran out within
    the round trip: only a lease shorter than that can) is in neither list; its
    expired lease is the reaper's, which hands the claim back unspent.
    """

    running: list[JobRecord] = field(default_factory=list)
    unstarted: list[JobRecord] = field(default_factory=list)
    error: Optional[RunledgerError] = None


def _claimed(worker_id: Any) -> Any:
    """The leases the claim just made: by the attempt ids it inserted, still held by ``worker_id``."""
    attempt_ids = cast(bindparam("attempt_ids", type_=ARRAY(Text)), ARRAY(PG_UUID(as_uuid=True)))
    return select(_a.job_id.label("id"), _a.run_number, _a.attempt, worker_id.label("worker_id")).where(
        _a.id == any_(attempt_ids)).cte("claimed")


def _fenced_as_claimed(fence: Callable[..., Any], claimed: Any) -> Any:
    """``fence`` (:func:`held_under` or :func:`live_lease`) over the claimed leases."""
    # The claimed ids once more as an array: job_queue is then reached by its primary
    # key whichever way a plan made once on empty tables joins the two.
    return and_(fence(claimed.c.id, claimed.c.run_number, claimed.c.attempt, claimed.c.worker_id),
                _q.id == any_(ids_of(claimed)))


def _in_claim_order(columns: Any) -> tuple[Any, ...]:
    return columns.priority.desc(), columns.next_run_at, columns.created_at, columns.id


def _build_lock() -> Any:
    # The lease fence's first statement (see runledger_sync.store.attempt.fence), over the claimed leases.
    claimed = _claimed(bindparam("lease_worker_id", type_=Text))
    return (
        select(_q.id)
        .select_from(job_queue.join(claimed, _fenced_as_claimed(held_under, claimed)))
        .order_by(_q.id)
        .with_for_update(of=job_queue)
    )


def _opens_here(column: Any) -> Any:
    """Whether this process holds the key ``column``'s value is sealed under (a clear value needs none)."""
    key_id = func.jsonb_extract_path_text(column, literal(SEALED_FIELD), literal("0"))
    return or_(key_id.is_(None), key_id == any_(bindparam("held_key_ids", type_=ARRAY(Text))))


def _build_running() -> Any:
    claimed = _claimed(bindparam("lease_worker_id", type_=Text))
    opens = and_(_opens_here(_q.payload), _opens_here(_q.checkpoint))
    started = build_running(and_(_fenced_as_claimed(live_lease, claimed), opens), returning=JOB_TEXT_COLUMNS)
    # A claim sealed under a key this process lacks is not started: it comes back
    # beside the started ones, still a prestart claim, for the worker to hand back unspent.
    closed = (
        select(*JOB_TEXT_COLUMNS)
        .select_from(job_queue.join(claimed, _fenced_as_claimed(held_under, claimed)))
        .where(~opens)
    )
    both = union_all(started, closed).subquery("claimed_jobs")
    return select(*both.c).order_by(*_in_claim_order(both.c))


_LOCK_CLAIMED = PreparedStatement("lock_claimed", _build_lock())
_MARK_CLAIMED_RUNNING = PreparedStatement("mark_claimed_running", _build_running())


def _build_still_leased() -> Any:
    claimed = _claimed(bindparam("lease_worker_id", type_=Text))
    return (
        select(*JOB_TEXT_COLUMNS)
        .select_from(job_queue.join(claimed, _fenced_as_claimed(held_under, claimed)))
        .order_by(*_in_claim_order(job_queue.c))
    )


_STILL_LEASED = _build_still_leased()


def claim_and_start_jobs(
    bind: Engine | HeldConnection,
    *,
    worker_id: str,
    lease_ttl_seconds: float,
    limit: int,
    job_types: Sequence[str],
    event_log: EventLog | str = DEFAULT_EVENT_LOG,
    queues: Optional[Sequence[str]] = None,
    queue_rooms: Optional[Mapping[str, int]] = None,
    unlimited_only: bool = False,
) -> StartedClaim:
    """Lease due jobs of ``job_types`` as prestart claims and persist RUNNING for them, in one round trip.

    Same rows, attempts and events as :func:`~runledger_sync.store.claim.claim.claim_prestart_jobs_for_types`
    followed by :func:`~runledger_sync.store.attempt.running.mark_jobs_running` for what it leased.

    Args:
        bind: an Engine or the worker's held connection: the store's own transactions, never a
            caller's (the claim and the running write each commit on their own).
        event_log: ``full`` writes the LEASED and STAGE_CHANGED(running) events; ``transitions`` neither.
        unlimited_only: as for :func:`~runledger_sync.store.claim.claim.claim_prestart_jobs_for_types`.

    Raises:
        RunledgerError: the claim failed and nothing was leased, or what the running
            write's failure left leased could not be read back (the reaper recovers those).
    """
    params = claim_params(ClaimOrigin.WORKER_PRESTART, worker_id, lease_ttl_seconds, limit, job_types, event_log,
                          queues, queue_rooms)
    if params is None:
        return StartedClaim()
    encryption = active_encryption()
    params["held_key_ids"] = [] if encryption is None else sorted(encryption.key_ids)
    claim = ((PRESTART_UNLIMITED_CLAIM_SETTINGS, CLAIM_FOR_TYPES_UNREAD_UNLIMITED) if unlimited_only
             else (PRESTART_CLAIM_SETTINGS, CLAIM_FOR_TYPES_UNREAD))
    transactions = (claim, (_LOCK_CLAIMED, _MARK_CLAIMED_RUNNING))

    def work(connection: Connection) -> list[JobRecord]:
        return to_jobs(execute_transactions(connection, transactions, params))

    try:
        claimed = run_in_transaction(bind, work, one_query=True)
    except RunledgerError as error:
        # The claim may have committed without its running write (which failed,
        # or whose reply was lost): read back what it left leased to us.
        try:
            unstarted = run_in_transaction(bind, lambda connection: to_jobs(connection.execute(_STILL_LEASED, params)))
        except RunledgerError:
            raise error from None
        if not unstarted:
            raise
        return StartedClaim(unstarted=unstarted, error=error)
    # The running write left exactly these unstarted (the same rule, in SQL: the key is not held).
    closed = [job for job in claimed if missing_key(job) is not None]
    if not closed:
        return StartedClaim(running=claimed)
    return StartedClaim(running=[job for job in claimed if missing_key(job) is None], unstarted=closed)
