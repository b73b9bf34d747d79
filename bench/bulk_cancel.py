"""Print what a bulk cancel of many jobs costs the live traffic of another queue, its longest lock wait, and its pace.

Usage: python bench/bulk_cancel.py [--database-url URL] [--jobs 100000] [--others 20000] [--rate 50]
                                   [--seconds 10]

A fresh database gets ``--jobs`` PENDING jobs of ``bench.target`` in the queue
``bulk`` with the metadata ``{"tenant": "acme"}``, and ``--others`` more of another
tenant (left alone), written by SQL in chunks and analyzed. A worker process (its own
Supervisor, retention off, concurrency 8) serves the ``default`` queue, fed one
no-op job every 1/``--rate`` s by this process. Pickup (the job's ``created_at`` to
its attempt's ``leased_at``, the database's clock) is read, once the worker keeps
up with the traffic, for ``--seconds`` without the cancel, then for as long as ``rl.cancel_jobs(JobFilter(job_types=[...],
meta={"tenant": "acme"}))`` runs. Meanwhile a thread samples ``pg_locks`` every
20 ms for the longest wait of any lock not yet granted (``waitstart``, PostgreSQL
14 and later). Printed: pickup p50/p95/max of both phases and their ratio, the
longest lock wait seen, the cancel's counts, time and jobs/s, and what is left.
"""

from __future__ import annotations

import argparse
import multiprocessing
import threading
import time
from datetime import datetime, timezone

import _common as bench
import sqlalchemy

import runledger_sync as rl

CHUNK = 50_000
TARGET_TYPE = "bench.target"
BULK_QUEUE = "bulk"
TENANT = {"tenant": "acme"}
SAMPLE_SECONDS = 0.02

_SEED = sqlalchemy.text("""
INSERT INTO job_queue (id, job_type, queue, status, max_attempts, meta, created_at, next_run_at)
SELECT gen_random_uuid(), :job_type, :queue, 'PENDING', 3, jsonb_build_object('tenant', CAST(:tenant AS text)),
       now() - interval '1 hour' + n * interval '1 ms', now() - interval '1 hour'
FROM generate_series(:first, :last) AS n
""")
_LONGEST_WAIT = sqlalchemy.text(
    "SELECT COALESCE(extract(epoch FROM max(clock_timestamp() - waitstart)), 0) FROM pg_locks WHERE NOT granted")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench.add_database_option(parser)
    parser.add_argument("--jobs", type=int, default=100_000, help="matching PENDING jobs to cancel (default 100,000)")
    parser.add_argument("--others", type=int, default=20_000, help="PENDING jobs of another tenant, left alone")
    parser.add_argument("--rate", type=float, default=50.0, help="live jobs enqueued per second (default 50)")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the phase without the cancel")
    return parser.parse_args()


def seed(engine: sqlalchemy.engine.Engine, count: int, tenant: str) -> None:
    for first in range(0, count, CHUNK):
        with engine.begin() as connection:
            connection.execute(_SEED, {"job_type": TARGET_TYPE, "queue": BULK_QUEUE, "tenant": tenant,
                                       "first": first, "last": min(count, first + CHUNK) - 1})
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text("ANALYZE job_queue"))


def serve(url: str, stop: "multiprocessing.synchronize.Event") -> None:
    """The worker process: a Supervisor running the no-op type of the default queue until told to stop."""
    engine = rl.create_engine(url, pool_size=12)
    try:
        with rl.Supervisor(engine, bench.noop_registry(), rl.JobsConfig(max_global_concurrency=8, retention=None),
                           run_scheduler=False):
            stop.wait()
    finally:
        engine.dispose()


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


class LockWaits:
    """Samples the longest wait of an ungranted lock on the server, every SAMPLE_SECONDS, until stopped."""

    def __init__(self, engine: sqlalchemy.engine.Engine) -> None:
        self.engine = engine
        self.longest_seconds = 0.0
        self.samples = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.engine.connect() as connection:
            while not self.stop.wait(SAMPLE_SECONDS):
                waited = float(connection.execute(_LONGEST_WAIT).scalar_one())
                connection.rollback()
                self.longest_seconds = max(self.longest_seconds, waited)
                self.samples += 1


def warm_up(engine: sqlalchemy.engine.Engine, timeout: float = 120.0) -> None:
    """Wait until the worker process has caught up with the live traffic (a job picked up within 100 ms), then 2 s."""
    deadline = time.monotonic() + timeout
    caught_up = sqlalchemy.text(
        "SELECT count(*) FROM job_queue q JOIN job_attempts a ON a.job_id = q.id "
        "WHERE q.payload ? 'live' AND a.leased_at - q.created_at < interval '100 milliseconds' "
        "AND q.created_at > now() - interval '1 second'")
    while time.monotonic() < deadline:
        with engine.connect() as connection:
            if connection.execute(caught_up).scalar_one() >= 5:
                break
        time.sleep(0.2)
    else:
        print(f"the worker had not caught up with the live traffic after {timeout:.0f}s")
    time.sleep(2.0)



def run(url: str, args: argparse.Namespace) -> None:
    engine = rl.create_engine(url, pool_size=12)
    definitions = bench.noop_registry()
    definitions.queue(BULK_QUEUE)
    definitions.job(TARGET_TYPE, queue=BULK_QUEUE)(lambda ctx, payload: None)
    stop = multiprocessing.Event()
    worker = multiprocessing.get_context("fork").Process(target=serve, args=(url, stop))
    try:
        rl.migrate(engine)
        definitions.sync_definitions(engine)
        started = time.perf_counter()
        seed(engine, args.jobs, "acme")
        seed(engine, args.others, "globex")
        print(f"seeded {args.jobs:,} matching and {args.others:,} other PENDING jobs in {time.perf_counter() - started:.1f}s")
        engine.dispose()  # the fork must not share our pooled connections
        worker.start()
        traffic = Traffic(engine, args.rate)
        traffic.thread.start()
        warm_up(engine)
        quiet_from = datetime.now(timezone.utc)
        time.sleep(args.seconds)
        waits = LockWaits(engine)
        waits.thread.start()
        cancel_from = datetime.now(timezone.utc)
        began = time.perf_counter()
        result = rl.cancel_jobs(engine, rl.JobFilter(job_types=[TARGET_TYPE], meta=TENANT),
                                reason="bench: tenant offboarded", actor="bench")
        elapsed = time.perf_counter() - began
        cancel_until = datetime.now(timezone.utc)
        waits.stop.set()
        waits.thread.join()
        time.sleep(1.0)
        traffic.stop.set()
        traffic.thread.join()
        time.sleep(1.0)  # the last live jobs are picked up
        quiet, during = bench.live_pickups(engine, quiet_from, cancel_from), bench.live_pickups(engine, cancel_from, cancel_until)
        print(f"pickup without cancel: {bench.pickup_summary(quiet)}")
        print(f"pickup during cancel:  {bench.pickup_summary(during)}")
        if quiet and during:
            ratio = bench.percentile(during, 0.95) / bench.percentile(quiet, 0.95)
            print(f"pickup p95 during / without: {ratio:.2f}x (target within 2x)")
        print(f"longest lock wait seen: {waits.longest_seconds * 1000:.1f} ms over {waits.samples} samples "
              "(target under 1 s)")
        print(f"cancel: matched {result.matched:,}, changed {result.changed:,} in {elapsed:.1f}s "
              f"({result.changed / elapsed:,.0f} jobs/s)")
        with engine.connect() as connection:
            left = dict(connection.execute(sqlalchemy.text(
                "SELECT meta ->> 'tenant', count(*) FROM job_queue WHERE job_type = :t AND status = 'PENDING' "
                "GROUP BY 1"), {"t": TARGET_TYPE}).all())
        print(f"PENDING {TARGET_TYPE} jobs left by tenant: {left}")
    finally:
        stop.set()
        if worker.pid is not None:
            worker.join(30)
        engine.dispose()


def main() -> None:
    args = parse_args()
    with bench.server(args.database_url) as srv, bench.fresh_database(srv, "rl_bench_bulk_cancel") as url:
        run(url, args)


if __name__ == "__main__":
    main()
