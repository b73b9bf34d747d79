"""Print how big the queue's tables get per million finished jobs, at each ``event_log`` level.

Usage: python bench/table_sizes.py [--database-url URL] [--jobs 20000]
       python bench/table_sizes.py --bounded [--jobs 200000] [--rate 1000]

For each level, a fresh database gets ``--jobs`` no-op jobs (payload ``{"n": N}``)
that one worker runs to success; the size of each table (heap, indexes and TOAST,
``pg_total_relation_size``) after a VACUUM is divided by the jobs and scaled to a
million. Failed jobs (more attempts, a dead letter, a traceback) and larger
payloads or outputs take more.

``--bounded``: a Supervisor with a retention of one minute (pruning every 5 s)
runs ``--jobs`` no-op jobs enqueued at ``--rate`` per second; the tables' row
counts are printed every 10 s and at the end, when they should hold about a
minute of jobs (plus one prune interval) whatever the total.
"""

from __future__ import annotations

import argparse
import threading
import time
from datetime import timedelta

import _common as bench
import sqlalchemy

import runledger_sync as rl

TABLES = ("job_queue", "job_attempts", "job_events", "job_dead_letters")
_SIZE = sqlalchemy.text("SELECT pg_total_relation_size(CAST(:table AS regclass))")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench.add_database_option(parser)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--bounded", action="store_true", help="run with a retention of one minute instead")
    parser.add_argument("--rate", type=float, default=1000.0, help="--bounded: jobs enqueued per second")
    return parser.parse_args()


def sizes(url: str, jobs: int, event_log: str) -> dict[str, int]:
    engine = rl.create_engine(url, pool_size=12)
    registry = bench.noop_registry()
    try:
        rl.migrate(engine)
        registry.sync_definitions(engine)
        with engine.connect() as connection:
            empty = {table: connection.execute(_SIZE, {"table": table}).scalar_one() for table in TABLES}
        bench.enqueue_noops(engine, jobs)
        shutdown = threading.Event()
        config = rl.JobsConfig(max_global_concurrency=16, event_log=event_log, retention=None)
        worker = threading.Thread(target=rl.run_worker_loop, args=(engine, registry, config, shutdown))
        worker.start()
        while rl.count_jobs(engine, status=rl.JobStatus.SUCCEEDED) < jobs:
            time.sleep(0.2)
        shutdown.set()
        worker.join()
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            for table in TABLES:
                connection.execute(sqlalchemy.text(f"VACUUM ANALYZE {table}"))  # fixed names, not input
            return {table: connection.execute(_SIZE, {"table": table}).scalar_one() - empty[table]
                    for table in TABLES}
    finally:
        engine.dispose()


def row_counts(engine: sqlalchemy.engine.Engine) -> str:
    with engine.connect() as connection:
        counts = {table: connection.execute(
            sqlalchemy.select(sqlalchemy.func.count()).select_from(sqlalchemy.table(table))).scalar_one()
            for table in TABLES}
    return ", ".join(f"{table} {count:,}" for table, count in counts.items())


def bounded(url: str, jobs: int, rate: float) -> None:
    engine = rl.create_engine(url, pool_size=12)
    registry = bench.noop_registry()
    minute = timedelta(minutes=1)
    config = rl.JobsConfig(max_global_concurrency=16, prune_interval_seconds=5,
                           retention=rl.Retention(succeeded=minute, canceled=minute, dead_lettered=minute,
                                                  workflow_runs=minute))
    try:
        rl.migrate(engine)
        registry.sync_definitions(engine)
        started = time.monotonic()
        with rl.Supervisor(engine, registry, config, run_scheduler=False):
            sent, next_report = 0, started + 10
            while sent < jobs:
                chunk = min(jobs - sent, max(1, int(rate / 10)))
                rl.enqueue_many_ids(engine, (rl.JobSpec(bench.NOOP_TYPE, {"n": sent + n}) for n in range(chunk)))
                sent += chunk
                time.sleep(max(0.0, started + sent / rate - time.monotonic()))
                if time.monotonic() >= next_report:
                    print(f"{time.monotonic() - started:5.0f}s enqueued {sent:,}: {row_counts(engine)}", flush=True)
                    next_report += 10
            while rl.count_jobs(engine, status=rl.JobStatus.PENDING) or rl.count_jobs(engine, status=rl.JobStatus.LEASED):
                time.sleep(0.5)
            print(f"{time.monotonic() - started:5.0f}s all {jobs:,} run: {row_counts(engine)}", flush=True)
            time.sleep(70)  # past the retention and a prune interval
            print(f"{time.monotonic() - started:5.0f}s a minute later: {row_counts(engine)}", flush=True)
    finally:
        engine.dispose()


def main() -> None:
    args = parse_args()
    with bench.server(args.database_url) as srv:
        if args.bounded:
            with bench.fresh_database(srv, "rl_bench_bounded") as url:
                bounded(url, args.jobs, args.rate)
            return
        for level in ("full", "transitions"):
            with bench.fresh_database(srv, f"rl_bench_sizes_{level}") as url:
                grown = sizes(url, args.jobs, level)
            per_million = {table: grown[table] / args.jobs * 1_000_000 / 2**20 for table in TABLES}
            print(f"event_log={level}: MiB per million succeeded jobs: "
                  + ", ".join(f"{table} {mib:,.0f}" for table, mib in per_million.items())
                  + f"; total {sum(per_million.values()):,.0f}")


if __name__ == "__main__":
    main()
