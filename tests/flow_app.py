"""The application and worker process of the flow-control invariant tests.

Usage: ``python -m tests.flow_app '<json settings>'`` (see :class:`FlowWorkerSettings`).

One job type per queue, each queue with one kind of limit (:data:`QUEUES`).
Every handler records its run in ``flow_runs`` with the database's own clock
(``clock_timestamp()``) when it starts and when it ends, so a test compares
runs of different processes on one clock. It writes through the *observer*
URL, a direct connection even when the worker's own connections go through
PgBouncer, so the record never waits for the pooler the test is about.

``flow.hold`` holds its first attempt until the process is killed (or
:data:`MAX_BLOCK_SECONDS` pass) and lets later attempts run like the others.
The process prints ``{"event": "ready"}`` to stdout, then runs
``Supervisor.run_until_shutdown`` (SIGTERM drains).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from functools import partial
from typing import Optional

import sqlalchemy
from sqlalchemy import text

import runledger_sync as rl

KEYED = "flow.keyed"
CAPPED = "flow.capped"
RATED = "flow.rated"
PAUSABLE = "flow.pausable"
HOLD = "flow.hold"

KEYED_QUEUE = "keyed"
CAPPED_QUEUE = "capped"
RATED_QUEUE = "rated"
PAUSABLE_QUEUE = "pausable"

GLOBAL_LIMIT = 3
RATE_COUNT = 20
RATE_SECONDS = 1.0
#: A held handler gives up after this long, so a failed test cannot leave it running.
MAX_BLOCK_SECONDS = 60.0

RUNS_DDL = (
    "CREATE TABLE IF NOT EXISTS flow_runs ("
    " id bigserial PRIMARY KEY, job_id uuid NOT NULL, attempt int NOT NULL, job_type text NOT NULL,"
    " concurrency_key text, seq int, worker_id text NOT NULL, pid int NOT NULL,"
    " started_at timestamptz NOT NULL DEFAULT clock_timestamp(), finished_at timestamptz)"
)


@dataclass
class FlowWorkerSettings:
    url: str
    worker_id: str
    #: Where handlers record their runs; defaults to ``url``.
    observer_url: Optional[str] = None
    #: ``transaction`` behind PgBouncer in transaction pooling.
    pool_mode: Optional[str] = None
    concurrency: int = 8
    lease_ttl_seconds: float = 10.0
    heartbeat_interval_seconds: Optional[float] = None
    poll_interval_ms: float = 100
    reaper_interval_seconds: float = 0.25
    reaper_retry_delay_ms: int = 1

    def to_json(self) -> str:
        return json.dumps(asdict(self))


class Recorder:
    """Writes a handler's start and end into ``flow_runs``, stamped by the database clock."""

    def __init__(self, engine: sqlalchemy.Engine) -> None:
        self.engine = engine

    def started(self, ctx: rl.JobContext, job_type: str, payload: dict) -> int:
        with self.engine.begin() as conn:
            return int(conn.execute(
                text("INSERT INTO flow_runs (job_id, attempt, job_type, concurrency_key, seq, worker_id, pid)"
                     " VALUES (:j, :a, :t, :k, :s, :w, :p) RETURNING id"),
                {"j": ctx.job_id, "a": ctx.attempt, "t": job_type, "k": payload.get("key"),
                 "s": payload.get("seq"), "w": ctx.worker_id, "p": os.getpid()},
            ).scalar_one())

    def finished(self, run_id: int) -> None:
        with self.engine.begin() as conn:
            conn.execute(text("UPDATE flow_runs SET finished_at = clock_timestamp() WHERE id = :id"), {"id": run_id})


def build_registry(recorder: Optional[Recorder] = None) -> rl.JobRegistry:
    """The queues and handlers; without a recorder it only serves ``sync_definitions``."""
    registry = rl.JobRegistry()
    registry.queue(KEYED_QUEUE, key_limit=1)
    registry.queue(CAPPED_QUEUE, global_limit=GLOBAL_LIMIT)
    registry.queue(RATED_QUEUE, rate_limit=rl.RateLimit(RATE_COUNT, per_seconds=RATE_SECONDS))
    registry.queue(PAUSABLE_QUEUE)

    def run(job_type: str, ctx: rl.JobContext, payload: dict) -> None:
        assert recorder is not None
        run_id = recorder.started(ctx, job_type, payload)
        # Through ctx, so a drain at shutdown cuts the wait short.
        if ctx.wait_cancelled(payload.get("ms", 0) / 1000.0):
            ctx.check_cancelled()
        recorder.finished(run_id)

    for job_type, queue in ((KEYED, KEYED_QUEUE), (CAPPED, CAPPED_QUEUE), (RATED, RATED_QUEUE),
                            (PAUSABLE, PAUSABLE_QUEUE)):
        registry.job(job_type, queue=queue, max_attempts=3, timeout_seconds=60)(partial(run, job_type))

    @registry.job(HOLD, queue=KEYED_QUEUE, max_attempts=3, timeout_seconds=120)
    def hold(ctx: rl.JobContext, payload: dict) -> None:
        if ctx.attempt > 1:
            run(HOLD, ctx, payload)
            return
        assert recorder is not None
        recorder.started(ctx, HOLD, payload)
        # The test kills this process now; the run never records an end.
        ctx.wait_cancelled(MAX_BLOCK_SECONDS)
        raise rl.JobFailure.terminal("flow.never_killed", "the test never killed the worker holding this job")

    return registry


def main(settings: FlowWorkerSettings) -> int:
    rl.configure_logging(level="WARNING", stream=sys.stderr)
    engine = rl.create_engine(settings.url, pool_size=settings.concurrency + 4, pool_mode=settings.pool_mode)
    observer = sqlalchemy.create_engine(
        rl.create_engine(settings.observer_url or settings.url).url, pool_size=settings.concurrency + 2)
    config = rl.JobsConfig(
        worker_id=settings.worker_id,
        max_global_concurrency=settings.concurrency,
        poll_interval_ms=settings.poll_interval_ms,
        lease_ttl_seconds=settings.lease_ttl_seconds,
        heartbeat_interval_seconds=settings.heartbeat_interval_seconds,
        reaper_interval_seconds=settings.reaper_interval_seconds,
        reaper_retry_delay_ms=settings.reaper_retry_delay_ms,
    )
    supervisor = rl.Supervisor(engine, build_registry(Recorder(observer)), config, run_scheduler=False)
    sys.stdout.write(json.dumps({"event": "ready", "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    return supervisor.run_until_shutdown(drain_timeout=10)


if __name__ == "__main__":
    sys.exit(main(FlowWorkerSettings(**json.loads(sys.argv[1]))))
