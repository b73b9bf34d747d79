"""Print what metrics cost: the worker's observer per job, and one scrape over a table of finished jobs.

Usage: python bench/metrics_cost.py [--finished 1000000] [--pending 1000] [--database-url URL]

The observer part calls WorkerMetrics as a worker does for one claimed batch of
16 jobs (one claim, 16 job ends, one running and one success group write) and
divides by 16; the figure without metrics is the attribute check the worker
makes at each of those points. The scrape part fills a fresh database with
finished jobs (one INSERT ... SELECT generate_series) and pending ones, then times
the queue read alone and a whole scrape (registry_for(...) to exposition text),
and for comparison rl.queue_stats, which counts the finished jobs too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import timeit
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import _common as bench
from prometheus_client import generate_latest
from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.metrics import WorkerMetrics, registry_for

BATCH = 16
REPEATS = 5


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--pending", type=int, default=1_000)
    bench.add_database_option(parser)
    return parser.parse_args()


def observer_cost_us() -> tuple[float, float]:
    """Microseconds per job of the observer's calls, with metrics on and off (best of REPEATS)."""
    metrics = WorkerMetrics()
    now = datetime.now(timezone.utc)
    batch = [SimpleNamespace(job_type=bench.NOOP_TYPE, next_run_at=now, last_heartbeat_at=now + timedelta(milliseconds=3))
             for _ in range(BATCH)]

    def on() -> None:
        metrics.claimed(batch)
        for _ in batch:
            metrics.job_finished(bench.NOOP_TYPE, "succeeded", 0.0002)
        metrics.group_written("running", BATCH, 0.001)
        metrics.group_written("success", BATCH, 0.001)

    holder = SimpleNamespace(observer=None)

    def off() -> None:
        # The worker's checks for one batch: the claim, each job's end, two group writes.
        for _ in range(BATCH + 3):
            if holder.observer is not None:
                raise AssertionError("metrics are off")

    rounds = 2_000
    best = {name: min(timeit.repeat(call, number=rounds, repeat=REPEATS)) for name, call in (("on", on), ("off", off))}
    return best["on"] / rounds / BATCH * 1e6, best["off"] / rounds / BATCH * 1e6


def scrape_cost_ms(url: str, args: argparse.Namespace) -> tuple[float, float, float]:
    engine = bench.migrated_engine(url)
    try:
        bench.noop_registry().sync_definitions(engine)
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO job_queue (id, job_type, status, stage, max_attempts, attempt, started_at, finished_at) "
                "SELECT gen_random_uuid(), :t, 'SUCCEEDED', 'completed', 3, 1, now(), now() FROM generate_series(1, :n)"),
                {"t": bench.NOOP_TYPE, "n": args.finished})
        bench.enqueue_noops(engine, args.pending)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE job_queue"))
        registry = registry_for(engine)
        reads, scrapes, stats = [], [], []
        for _ in range(20):
            started = time.perf_counter()
            rl.queue_stats(engine)
            stats.append(time.perf_counter() - started)
            started = time.perf_counter()
            rl.queue_gauges(engine)
            reads.append(time.perf_counter() - started)
            started = time.perf_counter()
            generate_latest(registry)
            scrapes.append(time.perf_counter() - started)
        return tuple(statistics.median(times) * 1000 for times in (reads, scrapes, stats))  # type: ignore[return-value]
    finally:
        engine.dispose()


def main() -> int:
    args = parse_args()
    on_us, off_us = observer_cost_us()
    print(f"observer per job: {on_us:.2f} us with WorkerMetrics, {off_us:.3f} us without (batches of {BATCH})")
    with bench.server(args.database_url) as srv, bench.fresh_database(srv, "bench_metrics") as url:
        read_ms, scrape_ms, stats_ms = scrape_cost_ms(url, args)
    print(f"scrape over {args.finished:,} finished and {args.pending:,} pending jobs: queue read {read_ms:.2f} ms, "
          f"whole scrape {scrape_ms:.2f} ms; rl.queue_stats {stats_ms:.1f} ms (medians of 20)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
