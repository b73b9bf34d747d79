"""Print enqueue-to-start latency of an idle worker: jobs enqueued one at a time, 20 ms apart.

Usage: python bench/latency.py [--jobs 200] [--gap-ms 20] [--no-listen] [--database-url URL]
Latency is from just after the enqueue commits to the first line of the handler
(both time.perf_counter() in this process). With no URL an embedded PostgreSQL
is started in a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

import runledger_sync as rl


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    parser.add_argument("--no-listen", action="store_true", help="poll only, for comparison")
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()

    server = None
    url = args.database_url
    if url is None:
        server = rl.EmbeddedPostgres(os.path.join(tempfile.mkdtemp(prefix="rl-bench-"), "pgdata"), delete_on_stop=True)
        url = server.start().create_database("bench_latency", drop_existing=True)
    engine = rl.create_engine(url)
    try:
        rl.migrate(engine)
        registry = rl.JobRegistry()
        started_at: dict[int, float] = {}
        committed_at: dict[int, float] = {}
        all_started = threading.Event()

        @registry.job("bench.latency")
        def record(ctx: rl.JobContext, payload: dict) -> None:
            started_at[payload["n"]] = time.perf_counter()
            if len(started_at) == args.jobs:
                all_started.set()

        registry.sync_definitions(engine)
        config = rl.JobsConfig()
        shutdown = threading.Event()
        worker = threading.Thread(
            target=rl.run_worker_loop, args=(engine, registry, config, shutdown), kwargs={"listen": not args.no_listen}
        )
        worker.start()
        time.sleep(1.0)  # let the worker connect its listener and go idle

        def produce() -> None:
            for n in range(args.jobs):
                rl.enqueue(engine, "bench.latency", {"n": n})
                committed_at[n] = time.perf_counter()
                time.sleep(args.gap_ms / 1000.0)

        producer = threading.Thread(target=produce)
        producer.start()
        producer.join()
        finished = all_started.wait(60)
        shutdown.set()
        worker.join()
        latencies = [(started_at[n] - committed_at[n]) * 1000.0 for n in started_at]
        print(f"jobs={args.jobs} gap_ms={args.gap_ms:g} listen={not args.no_listen} "
              f"poll_interval_ms={config.poll_interval_ms} started={len(started_at)}"
              + ("" if finished else " (timed out)"))
        print(f"latency ms: p50={percentile(latencies, 0.50):.2f} p95={percentile(latencies, 0.95):.2f} "
              f"p99={percentile(latencies, 0.99):.2f} max={max(latencies):.2f} mean={statistics.fmean(latencies):.2f}")
    finally:
        engine.dispose()
        if server is not None:
            server.stop()
    return 0 if len(started_at) == args.jobs else 1


if __name__ == "__main__":
    sys.exit(main())
