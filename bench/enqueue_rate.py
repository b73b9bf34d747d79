"""Print single and bulk enqueue rates, with client and PostgreSQL CPU per job, for one or more source trees in turn.

Usage: python bench/enqueue_rate.py [--code PATH ...] [--runs 3] [--single 2000] [--bulk 100000] [--database-url URL]

Each run of each tree is a fresh subprocess against a fresh database, with the
tree first on PYTHONPATH (``--code`` may be given several times, and the trees
take turns run by run), so old and new code are measured under the same load.
Without ``--code`` the tree this script belongs to is measured.

- single: ``enqueue(engine, ...)`` called ``--single`` times from one thread,
  as ``bench/compare.py`` does.
- bulk: ``--bulk`` jobs by ``enqueue_many`` in lists of ``--batch`` (compare's
  bulk phase), and by one ``enqueue_many_ids`` call over a generator.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import _common as bench

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", action="append", default=[], help="a source tree to measure (repeatable)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--single", type=int, default=2_000)
    parser.add_argument("--bulk", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=bench.ENQUEUE_BATCH)
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    bench.add_database_option(parser)
    return parser.parse_args()


def _timed(postgres: bench.PostgresCpu, jobs: int, action) -> dict:
    cpu0, pg0, started = time.process_time(), postgres.seconds(), time.perf_counter()
    action()
    seconds = time.perf_counter() - started
    pg1 = postgres.seconds()
    return {
        "per_s": jobs / seconds,
        "client_ms": (time.process_time() - cpu0) * 1000 / jobs,
        "postgres_ms": None if pg1 is None else (pg1 - pg0) * 1000 / jobs,
    }


def child(url: str, args: argparse.Namespace) -> None:
    """Measure the three phases with whichever ``runledger_sync`` is first on the path; print one JSON line."""
    import runledger_sync as rl

    engine = rl.create_engine(url)
    postgres = bench.PostgresCpu(url)
    rl.enqueue(engine, bench.NOOP_TYPE, {"n": -1})  # connect (and prepare) outside the timed part
    figures = {"module": os.path.dirname(rl.__file__)}
    figures["single"] = _timed(postgres, args.single, lambda: [
        rl.enqueue(engine, bench.NOOP_TYPE, {"n": n}) for n in range(args.single)
    ])

    def many() -> None:
        for offset in range(0, args.bulk, args.batch):
            rl.enqueue_many(engine, [rl.JobSpec(bench.NOOP_TYPE, {"n": n})
                                     for n in range(offset, min(args.bulk, offset + args.batch))])

    figures["bulk"] = _timed(postgres, max(args.bulk, 1), many)
    figures["bulk_ids"] = _timed(postgres, max(args.bulk, 1), lambda: rl.enqueue_many_ids(
        engine, (rl.JobSpec(bench.NOOP_TYPE, {"n": n}) for n in range(args.bulk))
    ))
    stored = rl.count_jobs(engine)
    expected = 1 + args.single + 2 * args.bulk
    if stored != expected:
        raise SystemExit(f"expected {expected} jobs stored, found {stored}")
    engine.dispose()
    print(json.dumps(figures))


def run_one(srv: bench.Server, code: str, args: argparse.Namespace) -> dict:
    with bench.fresh_database(srv, f"rl_bench_enqueue_rate_{os.getpid()}") as url:
        engine = bench.migrated_engine(url)
        bench.noop_registry().sync_definitions(engine)
        engine.dispose()
        argv = [sys.executable, os.path.abspath(__file__), "--child", url, "--single", str(args.single),
                "--bulk", str(args.bulk), "--batch", str(args.batch)]
        environment = dict(os.environ, PYTHONPATH=os.pathsep.join([code, HERE]))
        result = subprocess.run(argv, capture_output=True, text=True, check=False, env=environment)  # noqa: S603 - this script
        if result.returncode != 0:
            raise SystemExit(f"the child failed:\n{result.stderr}")
        return json.loads(result.stdout.splitlines()[-1])


def main() -> None:
    args = parse_args()
    if args.child:
        child(args.child, args)
        return
    trees = args.code or [os.path.dirname(HERE)]
    runs: dict[str, list[dict]] = {tree: [] for tree in trees}
    with bench.server(args.database_url) as srv:
        for _ in range(args.runs):
            for tree in trees:
                runs[tree].append(run_one(srv, tree, args))
    print(f"single={args.single} bulk={args.bulk} batch={args.batch} runs={args.runs}")
    rows = []
    for tree, figures in runs.items():
        for phase in ("single", "bulk", "bulk_ids"):
            rows.append([
                tree, phase,
                bench.fmt_range([f[phase]["per_s"] for f in figures]),
                bench.fmt_range([f[phase]["client_ms"] for f in figures], 3),
                bench.fmt_range([f[phase]["postgres_ms"] for f in figures], 3),
            ])
    bench.print_table(["code", "phase", "jobs/s", "client CPU ms/job", "PostgreSQL CPU ms/job"], rows)
    print("\njobs/s run by run (the trees took turns):")
    for tree, figures in runs.items():
        for phase in ("single", "bulk", "bulk_ids"):
            print(f"  {tree} {phase}: {', '.join(bench.fmt(f[phase]['per_s']) for f in figures)}")
    if len(trees) == 2:
        print(f"\nmedian jobs/s, {trees[1]} / {trees[0]}:")
        for phase in ("single", "bulk", "bulk_ids"):
            old, new = ([f[phase]["per_s"] for f in runs[tree]] for tree in trees)
            print(f"  {phase}: {statistics.median(new) / statistics.median(old):.2f}x")


if __name__ == "__main__":
    main()
