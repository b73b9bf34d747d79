"""Print what encryption at rest costs: enqueue and claim rates with and without keys, and a rotation under traffic.

Usage: python bench/encryption.py [--jobs 20000] [--rounds 3] [--rotate-jobs 100000] [--database-url URL]

Rates: each round enqueues ``--jobs`` jobs (``enqueue_many`` in lists of 1,000, a
payload of about 300 bytes) and then claims and completes them in batches of 64 on
held connections, as :mod:`ceiling` does, once clear and once with keys, in turn,
each on a fresh database. Each round's clear rate over its encrypted one is printed,
and the median of those paired ratios (a shared machine moves too much between rounds
for the best of each to mean anything).

Rotation: ``--rotate-jobs`` clear jobs of a type no worker serves sit in the table
(as history does: SUCCEEDED, with an output); a worker runs no-op jobs enqueued one at a time, 20 ms apart,
and their pickup latency (enqueue commit to handler start) is measured first
without a rotation, then while ``rotate_encryption`` seals the rows beside it.
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
from runledger_sync.core.outcomes import Succeed
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.types import JobCompletion
from runledger_sync.store import driver
from runledger_sync.store.driver import HeldConnection

SUCCEED = Succeed(JobCompletion())
PAYLOAD = {"to": "ada@example.com", "name": "Ada Lovelace", "account": "GB82 WEST 1234 5698 7654 32",
           "body": "x" * 200}
ARCHIVE_TYPE = "bench.archive"
KEYS = rl.Encryption(keys={"bench": os.urandom(32)}, current="bench")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rotate-jobs", type=int, default=100_000)
    parser.add_argument("--pickups", type=int, default=300, help="jobs whose pickup is timed in each phase")
    bench.add_database_option(parser)
    return parser.parse_args()


def enqueue_rate(engine, jobs: int) -> tuple[float, float]:
    """Jobs/s and this process's CPU microseconds per job."""
    started, cpu = time.perf_counter(), time.process_time()
    for offset in range(0, jobs, 1000):
        rl.enqueue_many(engine, [rl.JobSpec(bench.NOOP_TYPE, PAYLOAD | {"n": n})
                                 for n in range(offset, min(jobs, offset + 1000))])
    return jobs / (time.perf_counter() - started), (time.process_time() - cpu) / jobs * 1e6


def claim_rate(engine, jobs: int) -> tuple[float, float]:
    """Jobs/s and this process's CPU microseconds per job."""
    claims, writes = HeldConnection(engine), HeldConnection(engine)
    try:
        done = 0
        started, cpu = time.perf_counter(), time.process_time()
        while done < jobs:
            batch = driver.claim_and_start_jobs(claims, worker_id="bench", lease_ttl_seconds=60, limit=64,
                                                job_types=[bench.NOOP_TYPE])
            if batch.unstarted or not batch.running:
                raise RuntimeError(f"claim left {len(batch.unstarted)} unstarted after {done} jobs")
            driver.apply_transitions(writes, [(LeaseIdentity.of(job), SUCCEED) for job in batch.running])
            done += len(batch.running)
        return done / (time.perf_counter() - started), (time.process_time() - cpu) / done * 1e6
    finally:
        claims.close()
        writes.close()


def rates(srv, args) -> None:
    results: dict[str, list[tuple[float, float]]] = {"clear": [], "encrypted": []}
    cpu: dict[str, list[tuple[float, float]]] = {"clear": [], "encrypted": []}
    for round_number in range(args.rounds):
        for label in ("clear", "encrypted"):
            rl.configure_encryption(KEYS if label == "encrypted" else None)
            with bench.fresh_database(srv, f"bench_encryption_{label}") as url:
                engine = bench.migrated_engine(url)
                try:
                    bench.noop_registry().sync_definitions(engine)
                    enqueued, enqueue_cpu = enqueue_rate(engine, args.jobs)
                    claimed, claim_cpu = claim_rate(engine, args.jobs)
                finally:
                    engine.dispose()
            results[label].append((enqueued, claimed))
            cpu[label].append((enqueue_cpu, claim_cpu))
            print(f"round {round_number + 1} {label:>9}: enqueue {enqueued:8.0f} jobs/s ({enqueue_cpu:5.0f} us CPU/job), "
                  f"claim+complete {claimed:8.0f} jobs/s ({claim_cpu:5.0f} us CPU/job)", flush=True)
    rl.configure_encryption(None)
    pairs = list(zip(results["clear"], results["encrypted"], strict=True))
    enqueue_ratios = [clear[0] / sealed[0] for clear, sealed in pairs]
    claim_ratios = [clear[1] / sealed[1] for clear, sealed in pairs]
    print("clear/encrypted by round: enqueue " + ", ".join(f"{r:.2f}x" for r in enqueue_ratios)
          + "; claim " + ", ".join(f"{r:.2f}x" for r in claim_ratios))
    print(f"median clear/encrypted: enqueue {statistics.median(enqueue_ratios):.2f}x, "
          f"claim {statistics.median(claim_ratios):.2f}x")
    # This process's CPU per job moves far less with the machine's load than a rate does.
    for phase, index in (("enqueue", 0), ("claim+complete", 1)):
        clear = statistics.median(row[index] for row in cpu["clear"])
        sealed = statistics.median(row[index] for row in cpu["encrypted"])
        print(f"median client CPU per job, {phase}: clear {clear:.0f} us, encrypted {sealed:.0f} us "
              f"= {sealed / clear:.2f}x")


def pickups(engine, started_at: dict[int, float], first: int, count: int, gap_s: float = 0.02) -> list[float]:
    committed = {}
    for n in range(first, first + count):
        rl.enqueue(engine, bench.NOOP_TYPE, {"n": n})
        committed[n] = time.perf_counter()
        time.sleep(gap_s)
    deadline = time.monotonic() + 60
    while any(n not in started_at for n in committed) and time.monotonic() < deadline:
        time.sleep(0.01)
    return [(started_at[n] - committed[n]) * 1000.0 for n in committed if n in started_at]


def rotation(srv, args) -> None:
    rl.configure_encryption(None)
    with bench.fresh_database(srv, "bench_encryption_rotation") as url:
        engine = bench.migrated_engine(url)
        try:
            started_at: dict[int, float] = {}
            registry = bench.noop_registry(lambda payload: started_at.setdefault(payload["n"], time.perf_counter()))
            registry.sync_definitions(engine)
            with engine.begin() as connection:
                connection.exec_driver_sql(
                    "INSERT INTO job_definitions (job_type) VALUES (%(t)s) ON CONFLICT DO NOTHING", {"t": ARCHIVE_TYPE})
            for offset in range(0, args.rotate_jobs, 5000):
                rl.enqueue_many(engine, [rl.JobSpec(ARCHIVE_TYPE, PAYLOAD | {"n": n})
                                         for n in range(offset, min(args.rotate_jobs, offset + 5000))])
            with engine.begin() as connection:
                # History, as a table that turns encryption on holds it: finished jobs with an output.
                connection.exec_driver_sql(
                    "UPDATE job_queue SET status = 'SUCCEEDED', attempt = 1, output = payload, finished_at = now() "
                    "WHERE job_type = %(t)s", {"t": ARCHIVE_TYPE})
            with engine.connect() as connection:
                connection.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM ANALYZE job_queue")
            rl.configure_encryption(KEYS)
            shutdown = threading.Event()
            worker = threading.Thread(target=rl.run_worker_loop, args=(engine, registry, rl.JobsConfig(), shutdown))
            worker.start()
            time.sleep(1.0)
            quiet = pickups(engine, started_at, 0, args.pickups)
            rotated: list[float] = []

            def rotate() -> None:
                began = time.perf_counter()
                rotated.append(rl.rotate_encryption(engine))
                rotated.append(time.perf_counter() - began)

            rotator = threading.Thread(target=rotate)
            rotator.start()
            during: list[float] = []
            first = args.pickups
            while rotator.is_alive():
                during += pickups(engine, started_at, first, 50)
                first += 50
            rotator.join()
            shutdown.set()
            worker.join()
        finally:
            rl.configure_encryption(None)
            engine.dispose()
    rows, seconds = rotated
    q95, d95 = bench.percentile(quiet, 0.95), bench.percentile(during, 0.95)
    print(f"rotation: {rows:.0f} rows in {seconds:.1f} s ({rows / seconds:.0f} rows/s), batch 1000")
    print(f"pickup ms without rotation: p50={bench.percentile(quiet, 0.5):.1f} p95={q95:.1f} (n={len(quiet)})")
    print(f"pickup ms during rotation:  p50={bench.percentile(during, 0.5):.1f} p95={d95:.1f} (n={len(during)}) "
          f"= {d95 / q95:.2f}x")


def main() -> int:
    args = parse_args()
    print(f"jobs={args.jobs} rounds={args.rounds} rotate_jobs={args.rotate_jobs} cores={os.cpu_count()}")
    with bench.server(args.database_url) as srv:
        if args.rounds:
            rates(srv, args)
        if args.rotate_jobs:
            rotation(srv, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
