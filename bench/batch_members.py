"""Print how fast one worker drains plain jobs and batch members, taken in turn, and the ratio.

Usage: python bench/batch_members.py [--rounds 6] [--jobs 2000] [--concurrency 32] [--database-url URL]

One fresh database, migrated and analyzed while empty. Each round enqueues
``--jobs`` no-op jobs of one kind, then runs one worker (a thread, as in
bench/throughput.py) until every one has succeeded, timed from the worker's start:

- plain: jobs of no batch;
- member: members of one batch opened for the round and closed before the worker
  starts (so the last member's end finishes it, in its outcome write).

The kinds alternate round by round, so load from elsewhere on a shared machine falls
on both alike. A member's outcome write costs one more row update (the batch's
counts), made by the member trigger in the same transaction; a plain job's does not
call the trigger at all.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import _common as bench

import runledger_sync as rl

KINDS = ("plain", "member")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds per kind")
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per round")
    parser.add_argument("--concurrency", type=int, default=rl.JobsConfig().max_global_concurrency)
    bench.add_database_option(parser)
    return parser.parse_args()


def enqueue_round(engine, kind: str, jobs: int) -> None:
    batch = rl.open_batch(engine) if kind == "member" else None
    for offset in range(0, jobs, bench.ENQUEUE_BATCH):
        rl.enqueue_many(engine, [rl.JobSpec(bench.NOOP_TYPE, {"n": n}, batch=None if batch is None else batch.id)
                                 for n in range(offset, min(jobs, offset + bench.ENQUEUE_BATCH))])
    if batch is not None:
        rl.close_batch(engine, batch.id)


def drain_round(engine, registry: rl.JobRegistry, config: rl.JobsConfig, target: int) -> float:
    """Run a worker until ``target`` jobs have succeeded in all; return the seconds it took."""
    shutdown = threading.Event()
    worker = threading.Thread(target=rl.run_worker_loop, args=(engine, registry, config, shutdown))
    started = time.perf_counter()
    worker.start()
    while rl.count_jobs(engine, status=rl.JobStatus.SUCCEEDED) < target:
        time.sleep(0.005)
    elapsed = time.perf_counter() - started
    shutdown.set()
    worker.join()
    return elapsed


def main() -> None:
    args = parse_args()
    rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with bench.server(args.database_url) as srv, bench.fresh_database(srv, f"rl_bench_batch_{os.getpid()}") as url:
        engine = bench.migrated_engine(url, pool_size=args.concurrency + 4)
        registry = bench.noop_registry()
        registry.sync_definitions(engine)
        with engine.begin() as connection:
            connection.exec_driver_sql("ANALYZE")
        config = rl.JobsConfig(max_global_concurrency=args.concurrency, poll_interval_ms=20)
        done = 0
        # A warm-up round of each kind: connections opened, statements prepared.
        for kind in (*KINDS, *(kind for _ in range(args.rounds) for kind in KINDS)):
            enqueue_round(engine, kind, args.jobs)
            done += args.jobs
            seconds = drain_round(engine, registry, config, done)
            if done > len(KINDS) * args.jobs:
                rates[kind].append(args.jobs / seconds)
        finished = rl.list_batches(engine, status=rl.BatchStatus.SUCCEEDED, limit=args.rounds + 1)
        if len(finished) != args.rounds + 1 or any(b.succeeded != args.jobs for b in finished):
            raise SystemExit(f"the batches did not all finish with {args.jobs} members: {finished}")
        engine.dispose()
    print(f"jobs={args.jobs} per round, rounds={args.rounds} per kind, concurrency={args.concurrency}")
    ratios = [plain / member for plain, member in zip(rates["plain"], rates["member"], strict=True)]
    bench.print_table(["kind", "jobs/s (median)", "rounds"], [
        [kind, f"{statistics.median(values):,.0f}", ", ".join(f"{value:,.0f}" for value in values)]
        for kind, values in rates.items()])
    print(f"plain / member, round by round: median {statistics.median(ratios):.3f}x "
          f"({', '.join(f'{ratio:.2f}' for ratio in ratios)})")


if __name__ == "__main__":
    main()
