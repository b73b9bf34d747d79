"""The demo behind ``runledger-sync demo`` and ``make demo``.

With no database URL it starts an embedded PostgreSQL, migrates it, enqueues a
handful of jobs (some succeed, one retries once, one dead-letters), runs a real
supervisor until they settle, and prints what happened.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import IO, Any, Optional

import runledger_sync as rl

DEMO_JOB_COUNT = 24
SETTLE_TIMEOUT_SECONDS = 60.0


def build_registry() -> rl.JobRegistry:
    """The demo's handlers: quick, slow with progress, flaky once, always broken."""
    registry = rl.JobRegistry()

    @registry.job("demo.greet")
    def greet(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
        return rl.JobCompletion.success().with_output({"greeting": f"hello, {payload['name']}"})

    @registry.job("demo.resize", timeout_seconds=30)
    def resize(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
        steps = 4
        for step in range(1, steps + 1):
            if ctx.wait_cancelled(0.05):
                ctx.check_cancelled()
            ctx.report_progress(step, steps)
        return rl.JobCompletion.success().with_output({"width": payload["width"] // 2})

    @registry.job("demo.flaky", retry_delay_overrides={"demo.upstream_busy": 500})
    def flaky(ctx: rl.JobContext, payload: dict) -> None:
        if ctx.attempt == 1:
            raise rl.JobFailure.retryable("demo.upstream_busy", "upstream said 503; trying again soon")

    @registry.job("demo.broken", max_attempts=3)
    def broken(ctx: rl.JobContext, payload: dict) -> None:
        raise rl.JobFailure.terminal("demo.bad_input", "this input can never be processed")

    return registry


def enqueue_demo_jobs(engine: Any) -> list[rl.JobRecord]:
    specs = [rl.JobSpec("demo.greet", {"name": f"user-{n}"}) for n in range(DEMO_JOB_COUNT - 6)]
    specs += [rl.JobSpec("demo.resize", {"width": 640 * n}) for n in range(1, 5)]
    specs += [rl.JobSpec("demo.flaky", {"call": "upstream"}), rl.JobSpec("demo.broken", {"input": "???"})]
    return rl.enqueue_many(engine, specs)


def _settled(engine: Any) -> bool:
    unfinished = rl.count_jobs(engine, status=rl.JobStatus.PENDING) + rl.count_jobs(engine, status=rl.JobStatus.LEASED)
    return unfinished == 0


def run_demo(database_url: Optional[str] = None, *, out: IO[str] = sys.stdout) -> int:
    """Run the demo end to end and return a process exit status (0 when every job settled as expected)."""
    server = None
    if database_url is None:
        data_dir = os.path.join(tempfile.gettempdir(), "runledger-demo", "pgdata")
        out.write(f"starting embedded PostgreSQL in {data_dir} ...\n")
        server = rl.EmbeddedPostgres(data_dir).start()
        database_url = server.create_database("runledger_demo", drop_existing=True)
    log_path = os.path.join(tempfile.gettempdir(), "runledger-demo", "worker.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "w", encoding="utf-8") as log_file:
        rl.configure_logging("INFO", stream=log_file)
        out.write(f"worker logs (JSON lines) go to {log_path}\n")
        return _run(database_url, server, out)


def _run(database_url: str, server: Optional[rl.EmbeddedPostgres], out: IO[str]) -> int:
    engine = rl.create_engine(database_url)
    try:
        rl.migrate(engine)
        out.write(f"schema at revision {rl.current_revision(engine)}\n")
        registry = build_registry()
        registry.sync_definitions(engine)
        jobs = enqueue_demo_jobs(engine)
        out.write(f"enqueued {len(jobs)} jobs of {len(registry)} types; starting a worker\n")
        config = rl.JobsConfig(poll_interval_ms=50, max_global_concurrency=8, lease_ttl_seconds=10,
                               reaper_interval_seconds=1)
        started = time.monotonic()
        with rl.Supervisor(engine, registry, config):
            deadline = started + SETTLE_TIMEOUT_SECONDS
            while not _settled(engine) and time.monotonic() < deadline:
                time.sleep(0.1)
        elapsed = time.monotonic() - started
        return _report(engine, jobs, elapsed, out)
    finally:
        engine.dispose()
        if server is not None:
            server.stop()


def _report(engine: Any, jobs: list[rl.JobRecord], elapsed: float, out: IO[str]) -> int:
    out.write(f"\nall jobs settled in {elapsed:.1f} s\n\n")
    out.write(f"{'job type':<14} {'status':<14} {'attempts':>8}  detail\n")
    out.write("-" * 72 + "\n")
    shown = set()
    for job in jobs:
        current = rl.get_job(engine, job.id)
        if current is None:
            continue
        key = (current.job_type, current.status)
        if current.job_type == "demo.greet" and key in shown:
            continue
        shown.add(key)
        detail = current.last_error_code or (str(current.output) if current.output is not None else "")
        out.write(f"{current.job_type:<14} {current.status.value:<14} {current.attempt:>8}  {detail}\n")
    stats = rl.queue_stats(engine)
    out.write("\ncounts: " + ", ".join(f"{k}={v}" for k, v in stats.by_status.items() if v) + "\n")
    dead = rl.list_dead_letters(engine)
    for letter in dead:
        out.write(f"dead letter: {letter.job_type} {letter.job_id} {letter.error_code}: {letter.error_message}\n")
    out.write("\ninspect the dead letters with SQL: SELECT job_type, error_code, failed_at FROM job_dead_letters;\n")
    expected_dead = sum(1 for job in jobs if job.job_type == "demo.broken")
    succeeded = stats.by_status[rl.JobStatus.SUCCEEDED.value]
    ok = len(dead) == expected_dead and succeeded == len(jobs) - expected_dead
    out.write("demo finished as expected\n" if ok else "demo did NOT finish as expected\n")
    return 0 if ok else 1
