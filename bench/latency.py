"""Print enqueue-to-start latency of an idle worker: jobs enqueued one at a time, 20 ms apart.

Usage: python bench/latency.py [--jobs 200] [--gap-ms 20] [--no-listen] [--database-url URL]
Latency is from just after the enqueue commits to the first line of the handler
(both time.perf_counter() in this process). Worker CPU is this process's minus
the main and producer threads'; PostgreSQL CPU per job covers the enqueue and the
run. With no URL an embedded PostgreSQL is started in a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import _common as bench

import runledger_sync as rl

SETTLE_SECONDS = 1.0  # the worker connects its listener and goes idle


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    parser.add_argument("--no-listen", action="store_true", help="poll only, for comparison")
    bench.add_database_option(parser)
    return parser.parse_args()


class Producer(threading.Thread):
    """Enqueues jobs one at a time, noting each commit time and its own CPU."""

    def __init__(self, engine, jobs: int, gap_ms: float) -> None:
        super().__init__()
        self.engine, self.jobs, self.gap_ms = engine, jobs, gap_ms
        self.committed_at: dict[int, float] = {}
        self.cpu_seconds = 0.0

    def run(self) -> None:
        for n in range(self.jobs):
            rl.enqueue(self.engine, bench.NOOP_TYPE, {"n": n})
            self.committed_at[n] = time.perf_counter()
            time.sleep(self.gap_ms / 1000.0)
        self.cpu_seconds = time.thread_time()


def main() -> int:
    args = parse_args()
    started_at: dict[int, float] = {}
    all_started = threading.Event()

    def record(payload: dict) -> None:
        started_at[payload["n"]] = time.perf_counter()
        if len(started_at) == args.jobs:
            all_started.set()

    registry = bench.noop_registry(record)
    with bench.server(args.database_url) as srv, bench.fresh_database(srv, "bench_latency") as url:
        engine = bench.migrated_engine(url)
        try:
            registry.sync_definitions(engine)
            config = rl.JobsConfig()
            shutdown = threading.Event()
            worker = threading.Thread(
                target=rl.run_worker_loop, args=(engine, registry, config, shutdown), kwargs={"listen": not args.no_listen}
            )
            worker.start()
            time.sleep(SETTLE_SECONDS)
            producer = Producer(engine, args.jobs, args.gap_ms)
            window = bench.CpuWindow(
                lambda: bench.process_cpu_seconds(os.getpid()) - time.thread_time() - producer.cpu_seconds,
                bench.PostgresCpu(url),
            )
            window.start()
            producer.start()
            producer.join()
            finished = all_started.wait(60)
            window.stop()
            shutdown.set()
            worker.join()
        finally:
            engine.dispose()
    latencies = [(started_at[n] - producer.committed_at[n]) * 1000.0 for n in started_at]
    worker_ms, postgres_ms = window.per_job_ms(args.jobs)
    print(f"jobs={args.jobs} gap_ms={args.gap_ms:g} listen={not args.no_listen} "
          f"poll_interval_ms={config.poll_interval_ms} started={len(started_at)}"
          + ("" if finished else " (timed out)"))
    print(f"latency ms: p50={bench.percentile(latencies, 0.50):.2f} p95={bench.percentile(latencies, 0.95):.2f} "
          f"p99={bench.percentile(latencies, 0.99):.2f} max={max(latencies):.2f} mean={statistics.fmean(latencies):.2f}")
    print(f"CPU per job: worker {worker_ms:.3f} ms, PostgreSQL {bench.fmt(postgres_ms, 3)} ms (idle polling included)")
    return 0 if finished else 1


if __name__ == "__main__":
    sys.exit(main())
