"""Print what the store alone costs per job, with no worker around it: the ceiling of any worker on this schema.

Usage: python bench/ceiling.py [--jobs 8000] [--batches 8,64] [--event-log full|transitions] [--database-url URL]
One thread claims a batch of no-op jobs and marks it running (one round trip, two
transactions) and completes it, in a loop, on held connections as the worker's
own roles do: the three fenced transactions every job needs, with their attempt
and event rows, and no thread pool, handler, timer or completer. PostgreSQL's CPU per job here bounds every
worker on the same box: with C cores it cannot pass C / (PostgreSQL ms per job)
thousand jobs/s even if the worker cost nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import _common as bench

from runledger_sync.core.outcomes import Succeed
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.types import JobCompletion
from runledger_sync.store import driver
from runledger_sync.store.driver import HeldConnection

#: The no-op handler's outcome: a success that stores nothing.
SUCCEED = Succeed(JobCompletion())


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8_000)
    parser.add_argument("--batches", default="8,64", help="claim sizes to measure, comma-separated")
    parser.add_argument("--event-log", default="full", choices=["full", "transitions"],
                        help="the JobsConfig.event_log level the claim and running writes use")
    bench.add_database_option(parser)
    return parser.parse_args()


def drain(engine, url: str, jobs: int, batch: int, event_log: str) -> tuple[float, float, float]:
    """Run the store's three transactions per batch until ``jobs`` are done; return jobs/s and CPU ms per job."""
    claims, writes = HeldConnection(engine), HeldConnection(engine)
    window = bench.CpuWindow(time.process_time, bench.PostgresCpu(url))
    try:
        done = 0
        window.start()
        started = time.perf_counter()
        while done < jobs:
            started_batch = driver.claim_and_start_jobs(
                claims, worker_id="ceiling", lease_ttl_seconds=60, limit=batch, job_types=[bench.NOOP_TYPE],
                event_log=event_log,
            )
            claimed = started_batch.running
            if started_batch.unstarted or started_batch.error is not None:
                raise RuntimeError(f"a running write did not land: {started_batch.error}")
            if not claimed:
                raise RuntimeError(f"the queue ran dry after {done} jobs")
            driver.apply_transitions(writes, [(LeaseIdentity.of(job), SUCCEED) for job in claimed])
            done += len(claimed)
        elapsed = time.perf_counter() - started
        window.stop()
    finally:
        claims.close()
        writes.close()
    client_ms, postgres_ms = window.per_job_ms(done)
    return done / elapsed, client_ms, postgres_ms


def main() -> int:
    args = parse_args()
    batches = [int(size) for size in args.batches.split(",")]
    cores = os.cpu_count() or 1
    print(f"jobs={args.jobs} cores={cores} event_log={args.event_log}")
    print(f"{'batch':>5}  {'jobs/s':>7}  {'client ms/job':>13}  {'PostgreSQL ms/job':>17}  {'PostgreSQL-bound ceiling':>24}")
    with bench.server(args.database_url) as srv:
        for batch in batches:
            with bench.fresh_database(srv, f"bench_ceiling_{batch}") as url:
                engine = bench.migrated_engine(url)
                try:
                    bench.noop_registry().sync_definitions(engine)
                    bench.enqueue_noops(engine, args.jobs)
                    rate, client_ms, postgres_ms = drain(engine, url, args.jobs, batch, args.event_log)
                finally:
                    engine.dispose()
            ceiling = "-" if not postgres_ms else f"{cores * 1000 / postgres_ms:,.0f} jobs/s"
            print(f"{batch:>5}  {rate:>7,.0f}  {client_ms:>13.3f}  {bench.fmt(postgres_ms, 3):>17}  {ceiling:>24}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
