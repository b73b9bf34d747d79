"""A worker process for the fault scenarios, written against the public API only.

Usage: ``python -m tests.faults.fault_worker '<json settings>'`` (see :class:`WorkerSettings`).

It runs ``Supervisor.run_until_shutdown`` (SIGTERM drains) with the handlers of
:func:`build_registry`, prints JSON lines to stdout for the harness (``ready``,
RSS marks) and JSON log lines to stderr. Handlers record what they did in the
side tables of :data:`SIDE_TABLES_DDL` through the *observer* engine, which is
a direct connection even when the worker's own connections go through a proxy.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import sqlalchemy
from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.store.attempt.ends import complete_job_success

EFFECT = "fault.effect"
NOOP = "fault.noop"
SUICIDE = "fault.suicide"
HANG = "fault.hang"
PARTITION = "fault.partition"
#: Writes its effect through the application's own SQLAlchemy engine, with no retry of its own.
APP_WRITE = "fault.app_write"

#: Retry budgets large enough that a churned job is never dead-lettered by the churn itself.
EFFECT_MAX_ATTEMPTS = 25
SUICIDE_MAX_ATTEMPTS = 3
#: As in the restart report this scenario reproduces.
APP_WRITE_MAX_ATTEMPTS = 5
HANG_TIMEOUT_SECONDS = 1
#: How long a handler keeps trying to record its effect while the database is away.
EFFECT_WRITE_BUDGET_SECONDS = 30.0
#: Upper bound on any blocking handler, so a broken scenario cannot leave a process behind forever.
MAX_BLOCK_SECONDS = 60.0

SIDE_TABLES_DDL = (
    "CREATE TABLE IF NOT EXISTS fault_effects ("
    " job_id uuid NOT NULL, attempt int NOT NULL, worker_id text NOT NULL,"
    " started_at timestamptz NOT NULL, finished_at timestamptz NOT NULL DEFAULT clock_timestamp())",
    "CREATE TABLE IF NOT EXISTS fault_notes ("
    " job_id uuid, attempt int, worker_id text NOT NULL, note text NOT NULL,"
    " at timestamptz NOT NULL DEFAULT clock_timestamp())",
)


@dataclass
class WorkerSettings:
    url: str
    worker_id: str
    #: Where handlers record effects and notes; defaults to ``url``.
    observer_url: Optional[str] = None
    lease_ttl_seconds: float = 2.0
    heartbeat_interval_seconds: Optional[float] = 0.5
    poll_interval_ms: float = 50
    reaper_interval_seconds: float = 0.25
    reaper_retry_delay_ms: int = 1
    max_global_concurrency: int = 4
    claim_batch_size: int = 8
    timeout_grace_seconds: float = 0.5
    run_reaper: bool = True
    job_types: Optional[list[str]] = None
    #: ``victim`` handlers of PARTITION wait for their lease to be lost; ``rescuer`` ones just succeed.
    partition_role: str = "rescuer"
    #: Print the process RSS when this many NOOP jobs have run.
    rss_marks: list[int] = field(default_factory=list)
    max_overflow: int = 8
    log_level: str = "WARNING"

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def rss_kb() -> int:
    with open(f"/proc/{os.getpid()}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("VmRSS missing from /proc status")


class Observer:
    """Side-table writes that ride out a database restart, as a careful application's would."""

    def __init__(self, engine: sqlalchemy.Engine) -> None:
        self.engine = engine

    def _retrying(self, work: Any) -> Any:
        give_up = time.monotonic() + EFFECT_WRITE_BUDGET_SECONDS
        while True:
            try:
                return work()
            except sqlalchemy.exc.OperationalError:
                if time.monotonic() > give_up:
                    raise
            except sqlalchemy.exc.DBAPIError as error:
                # A connection killed by pg_terminate_backend surfaces as a DBAPIError
                # flagged as a disconnect; anything else is a real failure.
                if not error.connection_invalidated or time.monotonic() > give_up:
                    raise
            time.sleep(0.1)

    def write(self, sql: str, params: dict[str, Any]) -> None:
        def work() -> None:
            with self.engine.begin() as conn:
                conn.execute(text(sql), params)

        self._retrying(work)

    def effect(self, ctx: rl.JobContext, started_at: Any) -> None:
        self.write(
            "INSERT INTO fault_effects (job_id, attempt, worker_id, started_at) VALUES (:j, :a, :w, :s)",
            {"j": ctx.job_id, "a": ctx.attempt, "w": ctx.worker_id, "s": started_at},
        )

    def note(self, ctx: rl.JobContext, note: str) -> None:
        self.write(
            "INSERT INTO fault_notes (job_id, attempt, worker_id, note) VALUES (:j, :a, :w, :n)",
            {"j": ctx.job_id, "a": ctx.attempt, "w": ctx.worker_id, "n": note},
        )

    def now(self) -> Any:
        def work() -> Any:
            with self.engine.connect() as conn:
                return conn.execute(text("SELECT clock_timestamp()")).scalar()

        return self._retrying(work)


def build_registry(
    observer: Optional[Observer] = None, own_engine: Any = None, settings: Optional[WorkerSettings] = None,
    app_engine: Optional[sqlalchemy.Engine] = None,
) -> rl.JobRegistry:
    """The fault handlers; without an observer it only serves ``sync_definitions``."""
    registry = rl.JobRegistry()
    rss_marks = set(settings.rss_marks) if settings else set()
    noop_count = {"n": 0}
    count_lock = threading.Lock()
    victim = settings is not None and settings.partition_role == "victim"

    @registry.job(EFFECT, max_attempts=EFFECT_MAX_ATTEMPTS, timeout_seconds=60)
    def effect(ctx: rl.JobContext, payload: dict) -> None:
        started_at = observer.now()
        # Sleeping through ctx lets a cancelled attempt stop early, as a real handler should.
        if ctx.wait_cancelled(payload["ms"] / 1000.0):
            ctx.check_cancelled()
        observer.effect(ctx, started_at)

    @registry.job(APP_WRITE, max_attempts=APP_WRITE_MAX_ATTEMPTS, timeout_seconds=60)
    def app_write(ctx: rl.JobContext, payload: dict) -> None:
        if ctx.wait_cancelled(payload["ms"] / 1000.0):
            ctx.check_cancelled()
        # The application's own engine and transaction, as a web app's handler would
        # write: a database restart reaches the worker as the driver raised it.
        with app_engine.begin() as conn:
            conn.execute(
                text("INSERT INTO fault_effects (job_id, attempt, worker_id, started_at)"
                     " VALUES (:j, :a, :w, clock_timestamp())"),
                {"j": ctx.job_id, "a": ctx.attempt, "w": ctx.worker_id},
            )

    @registry.job(NOOP)
    def noop(ctx: rl.JobContext, payload: dict) -> None:
        if not rss_marks:
            return
        with count_lock:
            noop_count["n"] += 1
            done = noop_count["n"]
        if done in rss_marks:
            emit(event="rss", jobs=done, rss_kb=rss_kb())

    @registry.job(SUICIDE, max_attempts=SUICIDE_MAX_ATTEMPTS)
    def suicide(ctx: rl.JobContext, payload: dict) -> None:
        observer.note(ctx, "suicide")
        os.kill(os.getpid(), signal.SIGKILL)

    @registry.job(HANG, max_attempts=1, timeout_seconds=HANG_TIMEOUT_SECONDS)
    def hang(ctx: rl.JobContext, payload: dict) -> None:
        observer.note(ctx, "hang entered")
        # Deliberately deaf to ctx.cancelled: this is the handler that must not take more than its slot.
        threading.Event().wait(MAX_BLOCK_SECONDS)
        observer.note(ctx, "hang returned")

    @registry.job(PARTITION, max_attempts=5, timeout_seconds=120)
    def partition(ctx: rl.JobContext, payload: dict) -> None:
        started_at = observer.now()
        if not victim:
            observer.effect(ctx, started_at)
            return
        observer.note(ctx, "victim running")
        if not ctx.wait_cancelled(MAX_BLOCK_SECONDS):
            observer.note(ctx, "victim never cancelled")
            return
        observer.note(ctx, f"victim cancelled:{ctx.cancel_reason}")
        # The cut-off worker tries to finish the attempt it believes it owns,
        # through its own (proxied) connections: the fence must refuse it.
        try:
            complete_job_success(
                own_engine, job_id=ctx.job_id, run_number=ctx.run_number, attempt=ctx.attempt,
                worker_id=ctx.worker_id,
            )
        except rl.RunledgerError as error:
            observer.note(ctx, f"late completion refused:{error.code}")
        else:
            observer.note(ctx, "late completion accepted")

    return registry


def main(settings: WorkerSettings) -> int:
    rl.configure_logging(level=settings.log_level, stream=sys.stderr)
    pool_size = settings.max_global_concurrency + 4
    engine = rl.create_engine(settings.url, pool_size=pool_size, max_overflow=settings.max_overflow)
    if settings.observer_url and settings.observer_url != settings.url:
        observer_engine = rl.create_engine(settings.observer_url, pool_size=pool_size, max_overflow=settings.max_overflow)
    else:
        observer_engine = engine
    app_engine = sqlalchemy.create_engine(settings.observer_url or settings.url)
    registry = build_registry(Observer(observer_engine), engine, settings, app_engine)
    config = rl.JobsConfig(
        worker_id=settings.worker_id,
        poll_interval_ms=settings.poll_interval_ms,
        lease_ttl_seconds=settings.lease_ttl_seconds,
        heartbeat_interval_seconds=settings.heartbeat_interval_seconds,
        reaper_interval_seconds=settings.reaper_interval_seconds,
        reaper_retry_delay_ms=settings.reaper_retry_delay_ms,
        max_global_concurrency=settings.max_global_concurrency,
        claim_batch_size=settings.claim_batch_size,
        timeout_grace_seconds=settings.timeout_grace_seconds,
        job_types=tuple(settings.job_types) if settings.job_types else None,
        # The scenarios read each lease and renewal from its event row.
        event_log="full",
    )
    supervisor = rl.Supervisor(engine, registry, config, run_reaper=settings.run_reaper)
    emit(event="ready", pid=os.getpid(), worker_id=settings.worker_id)
    return supervisor.run_until_shutdown(drain_timeout=10)


if __name__ == "__main__":
    sys.exit(main(WorkerSettings(**json.loads(sys.argv[1]))))
