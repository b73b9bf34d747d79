"""Everything the runtime asks of the database, in one list: the seam between the loops and the SQL.

The runtime (:mod:`runledger_sync.runtime`) imports this module and no other
module of the store, so this page is the whole contract a worker, its reaper,
its scheduler and its listener hold with PostgreSQL; a test pins it.

:class:`Driver` lists the operations, typed, grouped by the step of a job's life
they serve, as a queue driver's interface groups them. ``driver_for(bind)``
gives one on a bind, decided once: on an Engine or a :class:`HeldConnection`
each call runs and commits a transaction of its own (retried when the
connection is lost); on a caller's Connection, ORM Session or psycopg connection
each call joins the caller's transaction, which the caller commits or rolls back.
The operations are written where their SQL lives; the runtime calls them only
as the driver's methods.

Beside the operations: ``HeldConnection``, one connection a loop keeps for its
many short transactions; ``StartedClaim``, what a claim-and-start leased; the
channels ``CHANNEL`` (due jobs), ``SCHEDULES_CHANNEL`` (schedule changes),
``ENDED_CHANNEL`` (jobs that ended, named by ``ended_job_ids``) and
``CANCELED_CHANNEL`` (jobs an operator canceled); ``new_probe_channel``, a
fresh channel for a listener to prove it still hears.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Mapping, Optional, Protocol, Sequence
from uuid import UUID

import psycopg2.extensions
from sqlalchemy.engine import Engine

from runledger_sync.core.errors import InvalidArgument, LeaseOwnerMismatch
from runledger_sync.core.flow import QueueRecord
from runledger_sync.core.outcomes import EarlierAttempts, Written
from runledger_sync.core.records import JobRecord, LeaseIdentity, ReapResult, ScheduleTick
from runledger_sync.core.retention import PruneResult, Retention
from runledger_sync.core.states import JobStage
from runledger_sync.core.types import DEFAULT_EVENT_LOG, EventLog
from runledger_sync.core.validation import DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_MAX_PAYLOAD_BYTES
from runledger_sync.core.workflow import WorkflowAppend, WorkflowRunRecord
from runledger_sync.store.admin.gauges import ping
from runledger_sync.store.admin.jobs import get_job
from runledger_sync.store.admin.rollup import RollupSample, sample_rollup
from runledger_sync.store.attempt.ends import release_unstarted_job_claim
from runledger_sync.store.attempt.fence import LeaseResult
from runledger_sync.store.attempt.outcomes import apply_transitions, read_back_outcomes, read_earlier_attempts
from runledger_sync.store.attempt.running import (
    DEFAULT_HEARTBEAT_LOCK_TIMEOUT_MS,
    heartbeat_job,
    mark_job_running,
    running_landed,
    update_job_progress,
)
from runledger_sync.store.binds import Bind
from runledger_sync.store.claim.claim import claim_jobs, claim_prestart_jobs_for_types
from runledger_sync.store.claim.flow import serves_limited_queue
from runledger_sync.store.claim.start import StartedClaim, claim_and_start_jobs
from runledger_sync.store.transactions import HeldConnection, engine_apart
from runledger_sync.store.maintenance.reaper import reap_expired_leases
from runledger_sync.store.maintenance.retention import DEFAULT_BATCH_SIZE, prune
from runledger_sync.store.maintenance.schedule_tick import fire_due_schedules
from runledger_sync.store.notify import (
    CANCELED_CHANNEL,
    CHANNEL,
    ENDED_CHANNEL,
    SCHEDULES_CHANNEL,
    close_listener,
    hears_listen,
    ended_job_ids,
    listen,
    new_probe_channel,
    open_listener,
    pool_mode_of,
    read_notifications,
    send_probe,
)
from runledger_sync.store.queues import list_queues
from runledger_sync.store.transactions import owns_transaction
from runledger_sync.store.workers import forget_worker, record_worker
from runledger_sync.store.workflows.append import append_workflow_steps
from runledger_sync.store.workflows.runs import load_step, step_allows_continuation, step_output


class Driver(Protocol):
    """Every operation the runtime asks of the database, on the one bind its driver was made with."""

    @property
    def owns_transactions(self) -> bool:
        """True when each call commits a transaction of its own, False when it joins the caller's."""
        ...

    @property
    def listens(self) -> bool:
        """True when a LISTEN on this bind is heard: a connection of its own, whose session no pooler shares.

        Asked again at each use: a pooler found sharing sessions turns it off from then on.
        """
        ...

    @property
    def pool_mode(self) -> Optional[str]:
        """The pool mode of the store's own connections (``session``, ``transaction``); None in a caller's transaction."""
        ...

    @property
    def location(self) -> str:
        """Where the bind leads, for a log line: its URL without the password, or the kind of a caller's connection."""
        ...

    # -- connections ---------------------------------------------------------------

    def held(self) -> "Driver":
        """A driver on one connection kept for this caller's many short transactions (give it back with ``close``).

        On a caller's transaction, this driver itself: there is nothing to hold.
        """
        ...

    def apart(self, *, timeout_seconds: float) -> "Driver":
        """A driver on one connection of its own, outside this bind's pool, that waits ``timeout_seconds`` at most to connect.

        For a readiness probe: a pool the jobs have taken whole must not read as an
        outage. Same database and pool mode; ``close`` disposes of it (own transactions only).
        """
        ...

    def close(self) -> None:
        """Give back the connection this driver holds, or dispose of the engine it made; nothing for any other."""
        ...

    def ping(self) -> None:
        """One round trip, for readiness."""
        ...

    # -- claim -----------------------------------------------------------------------

    def claim_and_start_jobs(
        self, *, worker_id: str, lease_ttl_seconds: float, limit: int, job_types: Sequence[str],
        event_log: EventLog | str = ..., queues: Optional[Sequence[str]] = ...,
        queue_rooms: Optional[Mapping[str, int]] = ..., unlimited_only: bool = ...,
    ) -> StartedClaim:
        """Lease due jobs and write their running in one round trip, as two transactions.

        Inside a caller's transaction only the claim is made (every job comes back
        unstarted): the running writes then go one by one, in that transaction.
        """
        ...

    def claim_prestart_jobs_for_types(
        self, *, worker_id: str, lease_ttl_seconds: float, limit: int, job_types: Sequence[str],
        event_log: EventLog | str = ..., queues: Optional[Sequence[str]] = ...,
        queue_rooms: Optional[Mapping[str, int]] = ..., unlimited_only: bool = ...,
        job_ids: Optional[Sequence[UUID | str]] = ...,
    ) -> list[JobRecord]:
        """The claim alone, in one statement: each job's running is written after (a caller's transaction)."""
        ...

    def serves_limited_queue(self, queues: Optional[Sequence[str]]) -> bool:
        """Whether any served queue has a global or rate limit; when none has, claims pass ``unlimited_only``."""
        ...

    # -- start -----------------------------------------------------------------------

    def mark_job_running(self, identity: LeaseIdentity, *, event_log: EventLog | str = ...) -> JobRecord:
        """Write stage ``running`` for a job claimed on its own: the step before its handler starts."""
        ...

    def running_landed(self, identity: LeaseIdentity) -> bool:
        """Whether a running write whose reply was lost was written."""
        ...

    def release_unstarted_job_claim(
        self, *, job_id: UUID, run_number: int, attempt: int, worker_id: str, reason: str, delay_ms: int,
    ) -> JobRecord:
        """Hand back a claim that never started (no handler, shutdown before start) without spending its attempt."""
        ...

    # -- while the handler runs ------------------------------------------------------

    def heartbeat_job(
        self, *, job_id: UUID, run_number: int, attempt: int, worker_id: str, lease_ttl_seconds: float,
        lock_timeout_ms: int = ..., event_log: EventLog | str = ..., retry: bool = ...,
    ) -> JobRecord:
        """Renew a live lease (``retry=False``: a lost connection is raised at once, for a caller that retries)."""
        ...

    def update_job_progress(
        self, *, job_id: UUID, run_number: int, attempt: int, worker_id: str, stage: Optional[JobStage] = ...,
        progress_done: Optional[int] = ..., progress_total: Optional[int] = ...,
        # A JSON value, as the core's records keep it.
        checkpoint: Any = ..., event_log: EventLog | str = ..., max_checkpoint_bytes: int = ...,
    ) -> JobRecord:
        """Store a running job's stage, progress and checkpoint."""
        ...

    def get_job(self, job_id: UUID | str, *, organization_id: Optional[str] = ...) -> Optional[JobRecord]:
        """Read a job's row (an operator may have cancelled it)."""
        ...

    # -- outcome ---------------------------------------------------------------------

    def read_earlier_attempts(self, identity: LeaseIdentity) -> EarlierAttempts:
        """What the run's earlier attempts mean for a failure's decision."""
        ...

    def step_allows_continuation(self, step_id: UUID) -> bool:
        """Whether a workflow job's step may continue."""
        ...

    def apply_transitions(
        self, items: Sequence[tuple[LeaseIdentity, Written]], *, max_output_bytes: int = ...,
        max_checkpoint_bytes: int = ..., retry: bool = ...,
    ) -> list[LeaseResult]:
        """Write a group of decided outcomes of every kind, fenced, then end the workflow steps among them."""
        ...

    def read_back_outcomes(
        self, outcomes: Sequence[tuple[LeaseIdentity, Written]],
    ) -> list[Optional[bool | LeaseOwnerMismatch]]:
        """Which writes of a group whose reply was lost landed."""
        ...

    # -- workflow steps (ctx.workflow) -----------------------------------------------

    def load_step(self, step_id: UUID) -> tuple[UUID, str]:
        """A step's run id and key."""
        ...

    def step_output(self, run_id: UUID, step_key: str) -> Any:
        """A prerequisite's output: a JSON value, or None before it has one."""
        ...

    def append_workflow_steps(self, run_id: UUID, more: WorkflowAppend, *, mutation_key: str,
                              max_payload_bytes: int = ...) -> WorkflowRunRecord:
        """Add steps to a step's run at an open window (``ctx.workflow.append``)."""
        ...

    # -- notify and listen -----------------------------------------------------------

    def open_listener(self, channels: Iterable[str] = ...) -> psycopg2.extensions.connection:
        """A connection of its own that listens on ``channels`` (own transactions only)."""
        ...

    def listen(self, connection: psycopg2.extensions.connection, channel: str) -> None:
        """Listen on one more channel."""
        ...

    def read_notifications(self, connection: psycopg2.extensions.connection) -> dict[str, set[str]]:
        """The payloads received since the last read, by channel."""
        ...

    def close_listener(self, connection: psycopg2.extensions.connection) -> None:
        """Close a listening connection."""
        ...

    def send_probe(self, channel: str, payload: str) -> None:
        """Notify a listener's probe channel, to prove it still hears."""
        ...

    # -- maintenance -----------------------------------------------------------------

    def reap_expired_leases(self, *, limit: int, default_retry_delay_ms: int) -> ReapResult:
        """The reaper's batch."""
        ...

    def fire_due_schedules(self, *, limit: int, event_log: EventLog | str = ...) -> ScheduleTick:
        """The scheduler's tick."""
        ...

    def prune(
        self, retention: Optional[Retention] = ..., *, batch_size: int = ..., dry_run: bool = ...,
        exclusive: bool = ..., max_batches: Optional[int] = ..., pause_seconds: float = ...,
    ) -> PruneResult:
        """Retention's batches."""
        ...

    def sample_rollup(self, *, now: Optional[datetime] = ...) -> RollupSample:
        """The dashboard's minute, written once a minute closes."""
        ...

    # -- workers ---------------------------------------------------------------------

    def record_worker(self, worker_id: str, *, queues: Optional[Sequence[str]], job_types: Sequence[str]) -> None:
        """Say a worker is alive and which queues and types it serves."""
        ...

    def forget_worker(self, worker_id: str) -> None:
        """Remove a worker's row when it stops."""
        ...

    def list_queues(self) -> list[QueueRecord]:
        """The queues that exist, so a worker refuses a config naming any other."""
        ...


class StoreDriver:
    """The :class:`Driver` of this store: each operation is the store function of its name, given the driver's bind.

    Args:
        bind: what :func:`driver_for` takes.
        disposes: the bind is an Engine this driver made, which ``close`` disposes of.
    """

    def __init__(self, bind: Bind, *, disposes: bool = False) -> None:
        self.bind = bind
        # Decided once: an Engine or HeldConnection is the store's own, committed by each
        # call; anything else is the caller's, whose transaction each call joins.
        self._own: Optional[Engine | HeldConnection] = bind if owns_transaction(bind) else None
        self._engine: Optional[Engine] = None if self._own is None else self._engine_of(self._own)
        self.owns_transactions = self._own is not None
        self._disposes = disposes

    @staticmethod
    def _engine_of(own: Engine | HeldConnection) -> Engine:
        return own if isinstance(own, Engine) else own.engine

    @property
    def listens(self) -> bool:
        return self._engine is not None and hears_listen(self._engine)

    @property
    def pool_mode(self) -> Optional[str]:
        return None if self._engine is None else pool_mode_of(self._engine)

    @property
    def location(self) -> str:
        if self._engine is None:
            return f"a caller's {type(self.bind).__name__}"
        return self._engine.url.render_as_string(hide_password=True)

    def held(self) -> Driver:
        if isinstance(self._own, Engine):
            return StoreDriver(HeldConnection(self._own))
        return self

    def apart(self, *, timeout_seconds: float) -> Driver:
        engine = self._engine_of(self._own_bind("apart"))
        return StoreDriver(engine_apart(engine, timeout_seconds=timeout_seconds), disposes=True)

    def close(self) -> None:
        if isinstance(self._own, HeldConnection):
            self._own.close()
        elif self._disposes and self._engine is not None:
            self._engine.dispose()

    def _own_bind(self, operation: str) -> Engine | HeldConnection:
        if self._own is None:
            raise InvalidArgument(
                "bind", type(self.bind).__name__,
                f"an Engine or a HeldConnection for {operation}, which needs a connection of its own",
            )
        return self._own

    def ping(self) -> None:
        ping(self.bind)

    def claim_and_start_jobs(
        self, *, worker_id: str, lease_ttl_seconds: float, limit: int, job_types: Sequence[str],
        event_log: EventLog | str = DEFAULT_EVENT_LOG, queues: Optional[Sequence[str]] = None,
        queue_rooms: Optional[Mapping[str, int]] = None, unlimited_only: bool = False,
    ) -> StartedClaim:
        if self._own is None:
            # Two transactions in one query cannot join the caller's: claim only.
            return StartedClaim(unstarted=claim_prestart_jobs_for_types(
                self.bind, worker_id=worker_id, lease_ttl_seconds=lease_ttl_seconds, limit=limit,
                job_types=job_types, event_log=event_log, queues=queues, queue_rooms=queue_rooms,
                unlimited_only=unlimited_only))
        return claim_and_start_jobs(
            self._own, worker_id=worker_id, lease_ttl_seconds=lease_ttl_seconds, limit=limit, job_types=job_types,
            event_log=event_log, queues=queues, queue_rooms=queue_rooms, unlimited_only=unlimited_only,
        )

    def claim_prestart_jobs_for_types(
        self, *, worker_id: str, lease_ttl_seconds: float, limit: int, job_types: Sequence[str],
        event_log: EventLog | str = DEFAULT_EVENT_LOG, queues: Optional[Sequence[str]] = None,
        queue_rooms: Optional[Mapping[str, int]] = None, unlimited_only: bool = False,
        job_ids: Optional[Sequence[UUID | str]] = None,
    ) -> list[JobRecord]:
        return claim_prestart_jobs_for_types(
            self.bind, worker_id=worker_id, lease_ttl_seconds=lease_ttl_seconds, limit=limit, job_types=job_types,
            event_log=event_log, queues=queues, queue_rooms=queue_rooms, unlimited_only=unlimited_only,
            job_ids=job_ids,
        )

    def serves_limited_queue(self, queues: Optional[Sequence[str]]) -> bool:
        return serves_limited_queue(self.bind, queues)

    def mark_job_running(self, identity: LeaseIdentity, *, event_log: EventLog | str = DEFAULT_EVENT_LOG) -> JobRecord:
        return mark_job_running(self.bind, identity, event_log=event_log)

    def running_landed(self, identity: LeaseIdentity) -> bool:
        return running_landed(self.bind, identity)

    def release_unstarted_job_claim(
        self, *, job_id: UUID, run_number: int, attempt: int, worker_id: str, reason: str, delay_ms: int,
    ) -> JobRecord:
        return release_unstarted_job_claim(
            self.bind, job_id=job_id, run_number=run_number, attempt=attempt, worker_id=worker_id, reason=reason,
            delay_ms=delay_ms,
        )

    def heartbeat_job(
        self, *, job_id: UUID, run_number: int, attempt: int, worker_id: str, lease_ttl_seconds: float,
        lock_timeout_ms: int = DEFAULT_HEARTBEAT_LOCK_TIMEOUT_MS, event_log: EventLog | str = DEFAULT_EVENT_LOG,
        retry: bool = True,
    ) -> JobRecord:
        return heartbeat_job(
            self.bind, job_id=job_id, run_number=run_number, attempt=attempt, worker_id=worker_id,
            lease_ttl_seconds=lease_ttl_seconds, lock_timeout_ms=lock_timeout_ms, event_log=event_log, retry=retry,
        )

    def update_job_progress(
        self, *, job_id: UUID, run_number: int, attempt: int, worker_id: str, stage: Optional[JobStage] = None,
        progress_done: Optional[int] = None, progress_total: Optional[int] = None, checkpoint: Any = None,
        event_log: EventLog | str = DEFAULT_EVENT_LOG, max_checkpoint_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> JobRecord:
        return update_job_progress(
            self.bind, job_id=job_id, run_number=run_number, attempt=attempt, worker_id=worker_id, stage=stage,
            progress_done=progress_done, progress_total=progress_total, checkpoint=checkpoint, event_log=event_log,
            max_checkpoint_bytes=max_checkpoint_bytes,
        )

    def get_job(self, job_id: UUID | str, *, organization_id: Optional[str] = None) -> Optional[JobRecord]:
        return get_job(self.bind, job_id, organization_id=organization_id)

    def read_earlier_attempts(self, identity: LeaseIdentity) -> EarlierAttempts:
        return read_earlier_attempts(self.bind, identity)

    def step_allows_continuation(self, step_id: UUID) -> bool:
        return step_allows_continuation(self.bind, step_id)

    def apply_transitions(
        self, items: Sequence[tuple[LeaseIdentity, Written]], *, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        max_checkpoint_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES, retry: bool = True,
    ) -> list[LeaseResult]:
        return apply_transitions(
            self.bind, items, max_output_bytes=max_output_bytes, max_checkpoint_bytes=max_checkpoint_bytes, retry=retry,
        )

    def read_back_outcomes(
        self, outcomes: Sequence[tuple[LeaseIdentity, Written]],
    ) -> list[Optional[bool | LeaseOwnerMismatch]]:
        return read_back_outcomes(self.bind, outcomes)

    def load_step(self, step_id: UUID) -> tuple[UUID, str]:
        return load_step(self.bind, step_id)

    def step_output(self, run_id: UUID, step_key: str) -> Any:
        return step_output(self.bind, run_id, step_key)

    def append_workflow_steps(self, run_id: UUID, more: WorkflowAppend, *, mutation_key: str,
                              max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> WorkflowRunRecord:
        return append_workflow_steps(self.bind, run_id, more, mutation_key=mutation_key,
                                     max_payload_bytes=max_payload_bytes)

    def open_listener(self, channels: Iterable[str] = (CHANNEL,)) -> psycopg2.extensions.connection:
        return open_listener(self._engine_of(self._own_bind("open_listener")), channels)

    def listen(self, connection: psycopg2.extensions.connection, channel: str) -> None:
        listen(connection, channel)

    def read_notifications(self, connection: psycopg2.extensions.connection) -> dict[str, set[str]]:
        return read_notifications(connection)

    def close_listener(self, connection: psycopg2.extensions.connection) -> None:
        close_listener(connection)

    def send_probe(self, channel: str, payload: str) -> None:
        send_probe(self.bind, channel, payload)

    def reap_expired_leases(self, *, limit: int, default_retry_delay_ms: int) -> ReapResult:
        return reap_expired_leases(self.bind, limit=limit, default_retry_delay_ms=default_retry_delay_ms)

    def fire_due_schedules(self, *, limit: int, event_log: EventLog | str = DEFAULT_EVENT_LOG) -> ScheduleTick:
        return fire_due_schedules(self.bind, limit=limit, event_log=event_log)

    def prune(
        self, retention: Optional[Retention] = None, *, batch_size: int = DEFAULT_BATCH_SIZE, dry_run: bool = False,
        exclusive: bool = False, max_batches: Optional[int] = None, pause_seconds: float = 0.0,
    ) -> PruneResult:
        return prune(
            self.bind, retention, batch_size=batch_size, dry_run=dry_run, exclusive=exclusive,
            max_batches=max_batches, pause_seconds=pause_seconds,
        )

    def sample_rollup(self, *, now: Optional[datetime] = None) -> RollupSample:
        return sample_rollup(self.bind, now=now)

    def record_worker(self, worker_id: str, *, queues: Optional[Sequence[str]], job_types: Sequence[str]) -> None:
        record_worker(self.bind, worker_id, queues=queues, job_types=job_types)

    def forget_worker(self, worker_id: str) -> None:
        forget_worker(self.bind, worker_id)

    def list_queues(self) -> list[QueueRecord]:
        return list_queues(self.bind)


def driver_for(bind: Bind) -> Driver:
    """Return the driver of every runtime operation on ``bind``.

    Args:
        bind: an Engine or a :class:`HeldConnection` (each call commits a
            transaction of its own, retried when the connection is lost), or a
            caller's Connection, ORM Session or psycopg (2 or 3) connection (each
            call joins the caller's transaction; nothing is committed or retried).
    """
    return StoreDriver(bind)


__all__ = [
    # the typed seam
    "Driver",
    "driver_for",
    # claim
    "claim_jobs",
    # notify and listen: channels, and what needs no database
    "CHANNEL",
    "SCHEDULES_CHANNEL",
    "ENDED_CHANNEL",
    "CANCELED_CHANNEL",
    "ended_job_ids",
    "new_probe_channel",
]
