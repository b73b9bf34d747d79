"""Print how fast one worker process drains N pre-inserted no-op jobs, and its peak RSS.

Usage: python bench/throughput.py [--jobs 10000] [--concurrency 32] [--database-url URL]
With no URL an embedded PostgreSQL is started in a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import threading
import time

import runledger_sync as rl


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=rl.JobsConfig().max_global_concurrency)
    parser.add_argument("--batch", type=int, default=rl.JobsConfig().claim_batch_size)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()

    server = None
    url = args.database_url
    if url is None:
        server = rl.EmbeddedPostgres(os.path.join(tempfile.mkdtemp(prefix="rl-bench-"), "pgdata"), delete_on_stop=True)
        url = server.start().create_database("bench_throughput", drop_existing=True)
    engine = rl.create_engine(url, pool_size=args.concurrency + 4)
    try:
        rl.migrate(engine)
        registry = rl.JobRegistry()
        done = threading.Semaphore(0)

        @registry.job("bench.noop")
        def noop(ctx: rl.JobContext, payload: dict) -> None:
            done.release()

        registry.sync_definitions(engine)
        started = time.perf_counter()
        for offset in range(0, args.jobs, 5_000):
            rl.enqueue_many(engine, [rl.JobSpec("bench.noop", {"n": n}) for n in range(offset, min(args.jobs, offset + 5_000))])
        enqueue_seconds = time.perf_counter() - started

        config = rl.JobsConfig(max_global_concurrency=args.concurrency, claim_batch_size=args.batch)
        shutdown = threading.Event()
        worker = threading.Thread(target=rl.run_worker_loop, args=(engine, registry, config, shutdown))
        started = time.perf_counter()
        worker.start()
        for _ in range(args.jobs):
            done.acquire()
        while rl.count_jobs(engine, status=rl.JobStatus.SUCCEEDED) < args.jobs:
            time.sleep(0.01)
        elapsed = time.perf_counter() - started
        shutdown.set()
        worker.join()
        peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"jobs={args.jobs} concurrency={args.concurrency} batch={args.batch}")
        print(f"enqueue_many: {args.jobs / enqueue_seconds:,.0f} jobs/s")
        print(f"processed:    {args.jobs / elapsed:,.0f} jobs/s ({elapsed:.2f} s)")
        print(f"worker peak RSS: {peak_rss_mb:.0f} MiB")
    finally:
        engine.dispose()
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
