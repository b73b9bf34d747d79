"""Print how long rl.wait_for_job takes to return after the job it waits for ends: p50/p95 over N jobs.

Usage: python bench/wait_for_job.py [--jobs 50] [--job-ms 50] [--poll] [--database-url URL]
One job at a time: enqueue a job whose handler sleeps --job-ms (so the wait is
set up before it ends), then wait for it. The latency is from the job's
``finished_at`` (the database clock, at its end's write) to the database clock
read just after the wait returned, on a connection already open: so it includes
one short query, and both ends are read from one clock. ``--poll`` waits on an
engine in pool mode ``transaction``, which polls instead of listening. With no
URL an embedded PostgreSQL is started in a temporary directory.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import _common as bench
import sqlalchemy

import runledger_sync as rl

SETTLE_SECONDS = 1.0  # the worker connects its listener and goes idle


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--job-ms", type=float, default=50.0, help="each job sleeps this long (default 50)")
    parser.add_argument("--poll", action="store_true", help="wait on a pool-mode-transaction engine: polling")
    bench.add_database_option(parser)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    registry = bench.noop_registry(lambda payload: time.sleep(args.job_ms / 1000.0))
    latencies: list[float] = []
    with bench.server(args.database_url) as srv, bench.fresh_database(srv, "bench_wait_for_job") as url:
        engine = bench.migrated_engine(url)
        waiting = rl.create_engine(url, pool_mode="transaction") if args.poll else engine
        try:
            registry.sync_definitions(engine)
            shutdown = threading.Event()
            worker = threading.Thread(target=rl.run_worker_loop, args=(engine, registry, rl.JobsConfig(), shutdown))
            worker.start()
            time.sleep(SETTLE_SECONDS)
            with engine.connect() as clock:
                for n in range(args.jobs):
                    job = rl.enqueue(engine, bench.NOOP_TYPE, {"n": n})
                    done = rl.wait_for_job(waiting, job.id, timeout=30)
                    returned_at = clock.execute(sqlalchemy.text("SELECT clock_timestamp()")).scalar_one()
                    clock.rollback()
                    latencies.append((returned_at - done.finished_at).total_seconds() * 1000.0)
            shutdown.set()
            worker.join()
        finally:
            if waiting is not engine:
                waiting.dispose()
            engine.dispose()
    print(f"jobs={args.jobs} job_ms={args.job_ms:g} waiting={'polling' if args.poll else 'listening'}")
    print(f"job end -> wait return, ms: p50={bench.percentile(latencies, 0.50):.2f} "
          f"p95={bench.percentile(latencies, 0.95):.2f} max={max(latencies):.2f} mean={statistics.fmean(latencies):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
