"""Print what a prune of many aged finished jobs costs the live traffic, and the rows it leaves.

Usage: python bench/retention.py [--database-url URL] [--jobs 100000] [--rate 50] [--seconds 10]
                                 [--batch-size 1000] [--pause 0]

A fresh database gets ``--jobs`` finished jobs aged 40 days (SUCCEEDED, and one in
twenty DEAD_LETTERED with its dead letter), each with one attempt and three events
as ``event_log=full`` leaves them, plus a tenth as many finished an hour ago (kept)
and written by SQL in chunks. A worker (retention off, so only this script prunes)
then serves live traffic: one no-op job enqueued every 1/``--rate`` s. Pickup
(enqueue ``created_at`` to the attempt's ``leased_at``, the database's clock) is
read for ``--seconds`` without a prune, then for as long as ``rl.prune`` runs with
the default retention. Printed: pickup p50/p95/max of both phases, the prune's
counts, batches and rate, and the rows of each table before and after.
"""

from __future__ import annotations

import argparse
import threading
import time
from datetime import datetime, timezone

import _common as bench
import sqlalchemy

import runledger_sync as rl

CHUNK = 50_000
DEAD_EVERY = 20
TABLES = ("job_queue", "job_attempts", "job_events", "job_dead_letters")

#: Aged finished jobs, their attempt, three events and (one in DEAD_EVERY) dead letter; all from one statement.
_SEED = sqlalchemy.text("""
WITH jobs AS (
  INSERT INTO job_queue (id, job_type, status, attempt, max_attempts, finished_at, created_at, stage)
  SELECT gen_random_uuid(), :job_type,
         CASE WHEN n % :dead_every = 0 THEN 'DEAD_LETTERED' ELSE 'SUCCEEDED' END, 1, 1,
         now() - make_interval(secs => :age_seconds) + n * interval '1 ms',
         now() - make_interval(secs => :age_seconds), 'completed'
  FROM generate_series(:first, :last) AS n
  RETURNING id, status, finished_at
), attempts AS (
  INSERT INTO job_attempts (id, job_id, attempt, finished_at, outcome)
  SELECT gen_random_uuid(), id, 1, finished_at, CASE WHEN status = 'DEAD_LETTERED' THEN 'TERMINAL' END FROM jobs
), events AS (
  INSERT INTO job_events (job_id, run_number, attempt, event_type)
  SELECT id, 1, 1, kind FROM jobs, unnest(ARRAY['ENQUEUED', 'LEASED', 'SUCCEEDED']) AS kind
)
INSERT INTO job_dead_letters (job_id, job_type, run_number, attempt, error_code, payload_snapshot)
SELECT id, :job_type, 1, 1, 'bench.failed', '{}' FROM jobs WHERE status = 'DEAD_LETTERED'
""")



def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench.add_database_option(parser)
    parser.add_argument("--jobs", type=int, default=100_000, help="aged finished jobs to prune (default 100,000)")
    parser.add_argument("--rate", type=float, default=50.0, help="live jobs enqueued per second (default 50)")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the phase without a prune")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between two batches (prune's pause_seconds)")
    return parser.parse_args()


def seed(engine: sqlalchemy.engine.Engine, count: int, age_seconds: float) -> None:
    for first in range(0, count, CHUNK):
        with engine.begin() as connection:
            connection.execute(_SEED, {"job_type": bench.NOOP_TYPE, "dead_every": DEAD_EVERY,
                                       "age_seconds": age_seconds, "first": first,
                                       "last": min(count, first + CHUNK) - 1})
    with engine.begin() as connection:
        for table in TABLES:
            connection.execute(sqlalchemy.text(f"ANALYZE {table}"))  # fixed names, not input


def row_counts(engine: sqlalchemy.engine.Engine) -> dict[str, int]:
    with engine.connect() as connection:
        return {table: connection.execute(
                    sqlalchemy.select(sqlalchemy.func.count()).select_from(sqlalchemy.table(table))).scalar_one()
                for table in TABLES}


class Traffic:
    """Enqueue one live job every 1/rate s on a thread until stopped."""

    def __init__(self, engine: sqlalchemy.engine.Engine, rate: float) -> None:
        self.engine, self.interval = engine, 1.0 / rate
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.wait(self.interval):
            rl.enqueue(self.engine, bench.NOOP_TYPE, {"live": n})
            n += 1



def run(url: str, args: argparse.Namespace) -> None:
    engine = rl.create_engine(url, pool_size=12)
    registry = bench.noop_registry()
    try:
        rl.migrate(engine)
        registry.sync_definitions(engine)
        started = time.perf_counter()
        seed(engine, args.jobs, age_seconds=40 * 86400)
        seed(engine, max(1, args.jobs // 10), age_seconds=3600)
        print(f"seeded {args.jobs:,} aged and {max(1, args.jobs // 10):,} recent finished jobs "
              f"in {time.perf_counter() - started:.1f}s")
        before = row_counts(engine)
        config = rl.JobsConfig(max_global_concurrency=8, retention=None)
        with rl.Supervisor(engine, registry, config, run_scheduler=False):
            traffic = Traffic(engine, args.rate)
            traffic.thread.start()
            time.sleep(1.0)  # the worker listens and its pool is warm
            quiet_from = datetime.now(timezone.utc)
            time.sleep(args.seconds)
            prune_from = datetime.now(timezone.utc)
            result = rl.prune(engine, batch_size=args.batch_size, pause_seconds=args.pause)
            prune_until = datetime.now(timezone.utc)
            time.sleep(1.0)
            traffic.stop.set()
            traffic.thread.join()
            time.sleep(1.0)  # the last live jobs are picked up
        after = row_counts(engine)
        print(f"pickup without prune: {bench.pickup_summary(bench.live_pickups(engine, quiet_from, prune_from))}")
        print(f"pickup during prune:  {bench.pickup_summary(bench.live_pickups(engine, prune_from, prune_until))}")
        rate = result.total_jobs / result.elapsed_seconds if result.elapsed_seconds else 0.0
        print(f"prune: {result.total_jobs:,} jobs {dict(result.jobs)}, {result.attempts:,} attempts, "
              f"{result.events:,} events, {result.dead_letters:,} dead letters in {result.batches} batches, "
              f"{result.elapsed_seconds:.1f}s ({rate:,.0f} jobs/s)")
        print("rows before -> after: " + ", ".join(f"{table} {before[table]:,} -> {after[table]:,}"
                                                    for table in TABLES))
        left = rl.prune(engine, dry_run=True)
        print(f"aged finished jobs left (dry run): {left.total_jobs}")
    finally:
        engine.dispose()


def main() -> None:
    args = parse_args()
    with bench.server(args.database_url) as srv, bench.fresh_database(srv, "rl_bench_retention") as url:
        run(url, args)


if __name__ == "__main__":
    main()
