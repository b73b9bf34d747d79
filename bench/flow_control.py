"""Print what flow control costs: plain jobs old vs new code, keyed jobs vs plain ones, a claim among held-back jobs.

Usage: python bench/flow_control.py [--only plain|keyed|plan] [--code PATH ...] [--rounds 3]
                                    [--jobs 10000] [--concurrency 8] [--keys 1000]
                                    [--busy-keys 1000] [--held-back 100000] [--claims 200]
                                    [--database-url URL]

plain: bench/throughput.py (N pre-inserted no-op jobs in the default queue, no
  limits, one worker in-process) in a fresh process per run, for each ``--code``
  tree in turn, round after round. With two trees it prints each round's ratio,
  the second tree's jobs/s over the first's (target: at least 0.95).
keyed: in this process, N no-op jobs in a queue with key_limit 1, job n on key
  n % --keys (so every key's jobs are spread through the queue), against N plain
  no-op jobs in the default queue; each drain on a fresh database, the two in
  turn (ABBA), round after round. Prints each round's ratio (target: at least 0.70).
plan: --busy-keys keys each with one LEASED job and --held-back jobs held back
  behind them (PENDING and due), nothing else claimable. Prints the worker's claim
  under EXPLAIN ANALYZE, which of job_queue's indexes it reads, and the median of
  --claims claims on one held connection (the worker's prepared statement), next
  to the same claims on an empty queue.
With no URL an embedded PostgreSQL is started in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Any, Iterator, Optional

import _common as bench
import throughput
from sqlalchemy import event, text

import runledger_sync as rl
from runledger_sync.store.driver import HeldConnection, claim_jobs, claim_prestart_jobs_for_types

HERE = os.path.dirname(os.path.abspath(__file__))
KEYED_TYPE = "bench.keyed"
KEYED_QUEUE = "bench_keyed"
_PROCESSED = re.compile(r"^processed:\s+([\d,]+) jobs/s", re.MULTILINE)
_CPU = re.compile(r"^CPU per job:\s+worker ([\d.]+) ms, PostgreSQL ([\d.]+|n/a) ms", re.MULTILINE)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("plain", "keyed", "plan"), help="run one of the three parts")
    parser.add_argument("--code", action="append", default=[], help="plain: a source tree to measure (repeatable)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--busy-keys", type=int, default=1_000)
    parser.add_argument("--held-back", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=200)
    bench.add_database_option(parser)
    return parser.parse_args()


def registry(handler: Any = None) -> rl.JobRegistry:
    """The no-op type in the default queue, and a keyed one in a queue of key_limit 1."""
    made = bench.noop_registry(handler)
    made.queue(KEYED_QUEUE, key_limit=1)

    @made.job(KEYED_TYPE, queue=KEYED_QUEUE)
    def keyed(ctx: rl.JobContext, payload: dict) -> None:
        if handler is not None:
            handler(payload)

    return made


def keyed_specs(count: int, keys: int, offset: int = 0) -> Iterator[rl.JobSpec]:
    for n in range(offset, offset + count):
        yield rl.JobSpec(KEYED_TYPE, {"n": n}, concurrency_key=f"key-{n % keys}")


def enqueue(engine: Any, specs: Iterator[rl.JobSpec]) -> float:
    """``enqueue_many`` in lists of bench.ENQUEUE_BATCH; the seconds it took."""
    started = time.perf_counter()
    batch: list[rl.JobSpec] = []
    for spec in specs:
        batch.append(spec)
        if len(batch) == bench.ENQUEUE_BATCH:
            rl.enqueue_many(engine, batch)
            batch = []
    if batch:
        rl.enqueue_many(engine, batch)
    return time.perf_counter() - started


# -- plain: throughput.py per tree, in turn ---------------------------------------------


def plain_run(srv: bench.Server, tree: str, args: argparse.Namespace) -> tuple[float, float, Optional[float]]:
    """Jobs/s, and worker and PostgreSQL CPU ms per job, of one throughput.py run on ``tree``'s code."""
    argv = [sys.executable, os.path.join(HERE, "throughput.py"), "--jobs", str(args.jobs),
            "--concurrency", str(args.concurrency), "--database-url", srv.admin_url]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, HERE]))
    result = subprocess.run(argv, capture_output=True, text=True, check=False, env=environment)  # noqa: S603 - our script
    found, cpu = _PROCESSED.search(result.stdout), _CPU.search(result.stdout)
    if result.returncode != 0 or found is None or cpu is None:
        raise SystemExit(f"throughput.py failed for {tree}:\n{result.stdout}\n{result.stderr}")
    postgres = None if cpu.group(2) == "n/a" else float(cpu.group(2))
    return float(found.group(1).replace(",", "")), float(cpu.group(1)), postgres


def plain(srv: bench.Server, args: argparse.Namespace) -> None:
    trees = args.code or [os.path.dirname(HERE)]
    runs: dict[str, list[tuple[float, float, Optional[float]]]] = {tree: [] for tree in trees}
    for _ in range(args.rounds):
        for tree in trees:
            runs[tree].append(plain_run(srv, tree, args))
    print(f"\n(a) plain no-op jobs, default queue, no limits: jobs={args.jobs} concurrency={args.concurrency}")
    rows = []
    for tree, figures in runs.items():
        rates = [rate for rate, _, _ in figures]
        worker = [ms for _, ms, _ in figures]
        postgres = [ms for _, _, ms in figures if ms is not None]
        rows.append([tree, ", ".join(bench.fmt(v) for v in rates), bench.fmt(statistics.median(rates)),
                     f"{statistics.median(worker):.3f}", bench.fmt(statistics.median(postgres) if postgres else None, 3)])
    bench.print_table(["code", "jobs/s run by run (the trees took turns)", "median", "worker CPU ms/job",
                       "PostgreSQL CPU ms/job"], rows)
    if len(trees) == 2:
        for name, index in (("jobs/s", 0), ("worker CPU per job", 1)):
            ratios = [new[index] / old[index] for old, new in zip(runs[trees[0]], runs[trees[1]], strict=True)]
            print(f"{name}, {trees[1]} / {trees[0]} round by round: {', '.join(f'{r:.3f}' for r in ratios)}"
                  f" (median {statistics.median(ratios):.3f})")
        print("target: jobs/s at least 0.95 of the old code's")


# -- keyed vs plain ----------------------------------------------------------------------


def drain(srv: bench.Server, args: argparse.Namespace, keyed: bool) -> tuple[float, float, Optional[float]]:
    """Jobs/s, and worker and PostgreSQL CPU ms per job, of one worker draining ``--jobs`` pre-inserted no-op jobs."""
    progress = throughput.Progress(args.jobs, 0.0)
    with bench.fresh_database(srv, f"rl_bench_flow_{os.getpid()}") as url:
        engine = bench.migrated_engine(url, pool_size=args.concurrency + 4)
        try:
            made = registry(progress.ran)
            made.sync_definitions(engine)
            if keyed:
                enqueue(engine, keyed_specs(args.jobs, args.keys))
            else:
                bench.enqueue_noops(engine, args.jobs)
            window = bench.CpuWindow(lambda: bench.process_cpu_seconds(os.getpid()) - time.thread_time(),
                                     bench.PostgresCpu(url))
            config = rl.JobsConfig(max_global_concurrency=args.concurrency,
                                   claim_batch_size=min(args.concurrency, rl.JobsConfig().claim_batch_size))
            elapsed = throughput.drain(engine, made, config, progress, window)
        finally:
            engine.dispose()
    return (args.jobs / elapsed, *window.per_job_ms(args.jobs))


def keyed(srv: bench.Server, args: argparse.Namespace) -> None:
    Figures = tuple[float, float, Optional[float]]
    pairs: list[tuple[Figures, Figures]] = []
    for number in range(args.rounds):
        # ABBA: whichever goes second in a round has the warmer machine; alternate it.
        if number % 2 == 0:
            plain_rate = drain(srv, args, keyed=False)
            keyed_rate = drain(srv, args, keyed=True)
        else:
            keyed_rate = drain(srv, args, keyed=True)
            plain_rate = drain(srv, args, keyed=False)
        pairs.append((plain_rate, keyed_rate))
    print(f"\n(b) keyed no-op jobs at key_limit 1 over {args.keys:,} keys vs plain ones:"
          f" jobs={args.jobs} concurrency={args.concurrency}")
    bench.print_table(
        ["round", "plain jobs/s", "keyed jobs/s", "keyed / plain", "worker CPU ms/job plain, keyed",
         "PostgreSQL CPU ms/job plain, keyed"],
        [[str(n + 1), bench.fmt(p[0]), bench.fmt(k[0]), f"{k[0] / p[0]:.2f}", f"{p[1]:.3f}, {k[1]:.3f}",
          f"{bench.fmt(p[2], 3)}, {bench.fmt(k[2], 3)}"] for n, (p, k) in enumerate(pairs)])
    print(f"median keyed / plain: {statistics.median(k[0] / p[0] for p, k in pairs):.2f} (target >= 0.70)")


# -- plan: a claim among held-back jobs ------------------------------------------------------


class ClaimExplainer:
    """EXPLAIN ANALYZE the next claim run on the engine, on its cursor, after its settings, in its transaction."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.plans: list[tuple[str, dict]] = []
        event.listen(engine, "before_cursor_execute", self._explain)

    def _explain(self, _conn: Any, cursor: Any, statement: str, parameters: Any, _context: Any, _many: Any) -> None:
        *settings, claim = statement.split("; ")
        if not claim.lstrip().startswith(("WITH clock AS", "EXECUTE runledger_claim")):
            return
        answers = []
        for explain in ("EXPLAIN (ANALYZE, BUFFERS) ", "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "):
            cursor.execute("; ".join([*settings, explain + claim]), parameters)
            answers.append(cursor.fetchall())
        plan_text = "\n".join(row[0] for row in answers[0])
        plan_json = answers[1][0][0]
        self.plans.append((plan_text, (json.loads(plan_json) if isinstance(plan_json, str) else plan_json)[0]))

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._explain)


def plan_nodes(node: dict) -> Iterator[dict]:
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def claim_times_ms(engine: Any, claims: int) -> list[float]:
    """Each of ``claims`` worker claims (prestart, limit 8, on one held connection), in ms."""
    held = HeldConnection(engine)
    times = []
    try:
        for _ in range(claims + 1):
            started = time.perf_counter()
            claimed = claim_prestart_jobs_for_types(held, worker_id="bench-worker", lease_ttl_seconds=60, limit=8,
                                                    job_types=[KEYED_TYPE, bench.NOOP_TYPE])
            times.append((time.perf_counter() - started) * 1000)
            if claimed:
                raise SystemExit(f"the claim found {len(claimed)} claimable jobs; the set-up left none")
    finally:
        held.close()
    return times[1:]  # the first prepares the statement


def hold_keys(engine: Any, keys: int) -> None:
    """One LEASED job per key: its turn taken, as by a running job."""
    enqueue(engine, keyed_specs(keys, keys))
    leased = 0
    while leased < keys:
        leased += len(claim_jobs(engine, worker_id="bench-holder", lease_ttl_seconds=3600, limit=min(1_000, keys - leased),
                                 job_types=[KEYED_TYPE]))


def plan(srv: bench.Server, args: argparse.Namespace) -> None:
    with bench.fresh_database(srv, f"rl_bench_flow_empty_{os.getpid()}") as url:
        engine = bench.migrated_engine(url)
        registry().sync_definitions(engine)
        empty_ms = claim_times_ms(engine, args.claims)
        engine.dispose()
    with bench.fresh_database(srv, f"rl_bench_flow_plan_{os.getpid()}") as url:
        engine = bench.migrated_engine(url)
        try:
            registry().sync_definitions(engine)
            hold_keys(engine, args.busy_keys)
            seconds = enqueue(engine, keyed_specs(args.held_back, args.busy_keys, offset=args.busy_keys))
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
                connection.exec_driver_sql("VACUUM ANALYZE job_queue")
                counts = dict(connection.execute(text(
                    "SELECT CASE WHEN blocked_by_key THEN 'held back' ELSE status END, count(*) FROM job_queue"
                    " GROUP BY 1")).all())
            explainer = ClaimExplainer(engine)
            claim_times_ms(engine, 0)
            explainer.close()
            held_ms = claim_times_ms(engine, args.claims)
        finally:
            engine.dispose()
    plan_text, plan_json = explainer.plans[0]
    print(f"\n(c) the worker's claim among {args.held_back:,} jobs held back on {args.busy_keys:,} busy keys: {counts}")
    print(f"enqueue of the held-back jobs: {args.held_back / seconds:,.0f} jobs/s ({seconds:.1f} s)")
    print(plan_text)
    scans = [node for node in plan_nodes(plan_json["Plan"])
             if node.get("Relation Name") == "job_queue" and "Scan" in node["Node Type"]]
    print("job_queue read by: " + "; ".join(
        f"{node['Node Type']} {node.get('Index Name', '')}: {node.get('Actual Rows', 0)} rows, "
        f"{node.get('Shared Hit Blocks', 0) + node.get('Shared Read Blocks', 0)} blocks" for node in scans))
    print(f"claim time over {args.claims} claims, median (p95): {statistics.median(held_ms):.2f} ms"
          f" ({bench.percentile(held_ms, 0.95):.2f} ms); on an empty queue {statistics.median(empty_ms):.2f} ms"
          f" ({bench.percentile(empty_ms, 0.95):.2f} ms)")


def main() -> int:
    args = parse_args()
    parts = [args.only] if args.only else ["plain", "keyed", "plan"]
    with bench.server(args.database_url) as srv:
        for part in parts:
            {"plain": plain, "keyed": keyed, "plan": plan}[part](srv, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
