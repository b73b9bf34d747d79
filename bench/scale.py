"""Print throughput with 1, 2 and 4 worker processes, and the claim statement's time at 10,000 vs 1,000,000 pending jobs.

Usage: python bench/scale.py [--jobs 10000] [--workers 1,2,4] [--concurrency 8]
                             [--pending 10000,1000000] [--claims 200] [--database-url URL]
Throughput: N pre-inserted no-op jobs drained by K worker processes (bench/peers/run_runledger.py,
the same runner and outside timing as compare.py). Claim time: the real
store.claim.claim_jobs, a batch of --claim-limit, each in a transaction rolled
back so every call sees the same queue; the rows are inserted with one
INSERT ... SELECT generate_series into the library's own job_queue table.
The worker's own claim (claim_prestart_jobs_for_types on a held connection: a
prepared statement planned once, at the first size, and kept as the queue grows)
is timed too, after the rolled-back ones; its claims commit, so each size's queue
loses --claims x --claim-limit pending jobs while it is timed.
Target: the claim at the largest size within 2x of the smallest.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import _common as bench
import compare
from sqlalchemy import Integer, bindparam, func, literal, select

import runledger_sync as rl
from runledger_sync.db.schema import job_queue
from runledger_sync.store.claim import claim_jobs, claim_prestart_jobs_for_types
from runledger_sync.store.held import HeldConnection


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--workers", default="1,2,4", help="comma-separated worker process counts")
    parser.add_argument("--concurrency", type=int, default=8, help="per worker process")
    parser.add_argument("--pending", default="10000,1000000", help="comma-separated queue sizes for the claim timing")
    parser.add_argument("--claims", type=int, default=200, help="timed claims per size")
    parser.add_argument("--claim-limit", type=int, default=rl.JobsConfig().claim_batch_size)
    bench.add_database_option(parser)
    args = parser.parse_args()
    args.workers = [int(k) for k in args.workers.split(",")]
    args.pending = sorted(int(k) for k in args.pending.split(","))
    return args


# -- throughput by worker count --------------------------------------------------------


def drain_with(srv: bench.Server, workers: int, args: argparse.Namespace) -> tuple[float, float, float]:
    """jobs/s, worker CPU ms/job (all processes) and PostgreSQL CPU ms/job with ``workers`` processes."""
    system = compare.SYSTEMS[compare.OURS]
    runner = compare.Runner(system, Path(sys.executable))
    with compare.phase_database(srv, runner, f"scale{workers}") as url:
        runner.call("bulk", url, args.jobs, bench.ENQUEUE_BATCH)
        observer = compare.Observer(url, system, args.jobs)
        try:
            with contextlib.ExitStack() as stack:
                processes = [stack.enter_context(runner.worker(url, args.concurrency)) for _ in range(workers)]
                window = bench.CpuWindow(lambda: sum(bench.tree_cpu_seconds(p.pid) for p in processes), observer.postgres)
                if not observer.wait_until(0, 1, time.monotonic() + 120, processes):
                    raise RuntimeError("no job started within 120 s")
                window.start()
                started = time.perf_counter()
                if not observer.wait_until(1, args.jobs, time.monotonic() + 1_800, processes):
                    raise RuntimeError("the drain did not finish within 30 min")
                elapsed = time.perf_counter() - started
                window.stop()
        finally:
            observer.close()
    worker_ms, postgres_ms = window.per_job_ms(args.jobs)
    return args.jobs / elapsed, worker_ms, postgres_ms


def report_throughput(srv: bench.Server, args: argparse.Namespace) -> None:
    rows, base = [], None
    for workers in args.workers:
        print(f"draining {args.jobs:,} jobs with {workers} worker process(es)", flush=True)
        rate, worker_ms, postgres_ms = drain_with(srv, workers, args)
        base = base or rate
        rows.append([str(workers), bench.fmt(rate), f"{rate / base:.2f}x", f"{worker_ms:.3f}", bench.fmt(postgres_ms, 3)])
    print(f"\njobs={args.jobs} concurrency per process={args.concurrency}")
    bench.print_table(["processes", "processed/s", f"vs {args.workers[0]}", "worker CPU ms/job", "PG CPU ms/job"], rows)


# -- claim time by queue size -----------------------------------------------------------


def _bulk_insert_statement():
    series = func.generate_series(1, bindparam("count", type_=Integer)).table_valued("value").render_derived()
    # Stagger the timestamps as a stream of enqueues would, so the claim order is not all ties.
    stamp = func.now() - func.make_interval(0, 0, 0, 0, 0, 0, (bindparam("count", type_=Integer) - series.c.value) / 1000.0)
    rows = select(
        func.gen_random_uuid(), literal(bench.NOOP_TYPE), func.jsonb_build_object("n", series.c.value), literal(1), stamp, stamp
    ).select_from(series)
    return job_queue.insert().from_select(["id", "job_type", "payload", "max_attempts", "created_at", "next_run_at"], rows)


def grow_queue(engine, count: int) -> float:
    started = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(_bulk_insert_statement(), {"count": count})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE job_queue")
    return time.perf_counter() - started


def time_claims(engine, args: argparse.Namespace) -> list[float]:
    timings = []
    with engine.connect() as conn:
        for _ in range(args.claims):
            transaction = conn.begin()
            started = time.perf_counter()
            claimed = claim_jobs(conn, worker_id="bench-scale", lease_ttl_seconds=60, limit=args.claim_limit)
            timings.append((time.perf_counter() - started) * 1000)
            transaction.rollback()
            _check_full(claimed, args)
    return timings


def time_worker_claims(held: HeldConnection, args: argparse.Namespace) -> list[float]:
    timings = []
    for _ in range(args.claims):
        started = time.perf_counter()
        claimed = claim_prestart_jobs_for_types(held, worker_id="bench-scale", lease_ttl_seconds=60,
                                                limit=args.claim_limit, job_types=[bench.NOOP_TYPE])
        timings.append((time.perf_counter() - started) * 1000)
        _check_full(claimed, args)
    return timings


def _check_full(claimed: list, args: argparse.Namespace) -> None:
    if len(claimed) != args.claim_limit:
        raise RuntimeError(f"claimed {len(claimed)} of {args.claim_limit}: the queue ran short of pending jobs")


def report_claims(srv: bench.Server, args: argparse.Namespace) -> None:
    rows, medians, worker_medians = [], [], []
    with bench.fresh_database(srv, "bench_scale_claim") as url:
        engine = bench.migrated_engine(url)
        held = HeldConnection(engine)
        try:
            bench.noop_registry().sync_definitions(engine)
            size = 0
            for pending in args.pending:
                print(f"growing the queue to {pending:,} pending jobs", flush=True)
                insert_seconds = grow_queue(engine, pending - size)
                size = pending
                timings = time_claims(engine, args)
                worker_timings = time_worker_claims(held, args)
                medians.append(bench.percentile(timings, 0.50))
                worker_medians.append(bench.percentile(worker_timings, 0.50))
                rows.append([f"{pending:,}", f"{medians[-1]:.2f}", f"{bench.percentile(timings, 0.95):.2f}",
                             f"{worker_medians[-1]:.2f}", f"{bench.percentile(worker_timings, 0.95):.2f}",
                             f"{insert_seconds:.1f}"])
        finally:
            held.close()
            engine.dispose()
    print(f"\nclaim_jobs(limit={args.claim_limit}) rolled back, and the worker's prepared claim, {args.claims} calls each per size")
    bench.print_table(["pending jobs", "claim p50 ms", "claim p95 ms", "worker claim p50 ms", "worker claim p95 ms",
                       "insert+analyze s"], rows)
    for label, values in (("claim", medians), ("worker claim", worker_medians)):
        print(f"{label} p50 at {args.pending[-1]:,} / at {args.pending[0]:,}: {values[-1] / values[0]:.2f}x (target <= 2x)")


def main() -> int:
    args = parse_args()
    with bench.server(args.database_url) as srv:
        report_throughput(srv, args)
        report_claims(srv, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
