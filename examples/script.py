"""A plain script that runs runledger-sync end to end.

It defines two handlers, connects to RUNLEDGER_DATABASE_URL (or starts an
embedded PostgreSQL in a temporary directory when the variable is unset),
migrates, syncs the job definitions, enqueues a few jobs and runs a
supervisor in the foreground::

    python examples/script.py                  # until Ctrl-C (which drains)
    python examples/script.py --exit-when-idle # stop once every job has finished

Ctrl-C (SIGINT) or SIGTERM stops claiming and lets running jobs finish; a
second signal exits at once. The script prints a summary of the jobs it
enqueued and exits 0 after a clean stop.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from typing import Any, Optional

import runledger_sync as rl

registry = rl.JobRegistry()


@registry.job("example.greet")
def greet(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
    """Answer at once, with an output stored on the job row."""
    return rl.JobCompletion.success().with_output({"greeting": f"hello, {payload['name']}"})


@registry.job("example.slow", timeout_seconds=120)
def slow(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
    """Work for ``payload["seconds"]`` in small steps, reporting progress and honouring cancellation."""
    steps = 10
    for step in range(1, steps + 1):
        if ctx.wait_cancelled(payload["seconds"] / steps):
            ctx.check_cancelled()
        ctx.report_progress(step, steps)
    return rl.JobCompletion.success().with_output({"slept_seconds": payload["seconds"]})


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exit-when-idle", action="store_true",
                        help="stop the supervisor once no job is PENDING or LEASED")
    parser.add_argument("--greetings", type=int, default=5, help="how many example.greet jobs to enqueue (default 5)")
    parser.add_argument("--slow-seconds", type=float, default=1.0,
                        help="how long the one example.slow job works (default 1)")
    return parser.parse_args(argv)


def enqueue_jobs(engine: Any, args: argparse.Namespace) -> list[rl.JobRecord]:
    specs = [rl.JobSpec("example.greet", {"name": f"user-{n}"}) for n in range(args.greetings)]
    specs.append(rl.JobSpec("example.slow", {"seconds": args.slow_seconds}))
    return rl.enqueue_many(engine, specs)


def stop_when_idle(engine: Any, supervisor: rl.Supervisor, interval_seconds: float = 0.2) -> threading.Thread:
    """Set the supervisor's shutdown event once no job is PENDING or LEASED."""

    def watch() -> None:
        while not supervisor.shutdown_event.wait(interval_seconds):
            unfinished = sum(rl.count_jobs(engine, status=status) for status in (rl.JobStatus.PENDING, rl.JobStatus.LEASED))
            if unfinished == 0:
                print("queue is idle; stopping", flush=True)
                supervisor.shutdown_event.set()

    thread = threading.Thread(target=watch, name="example-idle-watch", daemon=True)
    thread.start()
    return thread


def print_summary(engine: Any, jobs: list[rl.JobRecord]) -> None:
    print(f"{'job id':<36}  {'type':<14}  {'status':<13}  output")
    for job in jobs:
        current = rl.get_job(engine, job.id)
        print(f"{job.id!s:<36}  {job.job_type:<14}  {current.status.value:<13}  {current.output}")
    counts = rl.queue_stats(engine).by_status
    print("counts: " + ", ".join(f"{status}={count}" for status, count in counts.items() if count), flush=True)


def run(database_url: str, args: argparse.Namespace) -> int:
    engine = rl.create_engine(database_url)
    try:
        rl.migrate(engine)
        registry.sync_definitions(engine)
        jobs = enqueue_jobs(engine, args)
        print(f"enqueued {len(jobs)} jobs; running a worker (Ctrl-C drains and stops)", flush=True)
        supervisor = rl.Supervisor(engine, registry, rl.JobsConfig(poll_interval_ms=50, reaper_interval_seconds=1))
        if args.exit_when_idle:
            stop_when_idle(engine, supervisor)
        status = supervisor.run_until_shutdown(drain_timeout=30)
        print_summary(engine, jobs)
        return status
    finally:
        engine.dispose()


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    rl.configure_logging(level="INFO")  # JSON lines on stderr
    url = os.environ.get("RUNLEDGER_DATABASE_URL")
    if url:
        return run(url, args)
    with tempfile.TemporaryDirectory(prefix="runledger-example-") as data_dir:
        print(f"RUNLEDGER_DATABASE_URL is unset; starting an embedded PostgreSQL in {data_dir}", flush=True)
        with rl.EmbeddedPostgres(os.path.join(data_dir, "pgdata"), delete_on_stop=True) as server:
            return run(server.create_database("runledger_example"), args)


if __name__ == "__main__":
    sys.exit(main())
