"""Print single enqueue/s of plain, unique and debounced jobs, taken in turn, on a new database analyzed while empty.

Usage: python bench/unique_enqueue.py [--runs 3] [--rounds 25] [--jobs 100] [--database-url URL]

Each run is a fresh subprocess against a fresh database, migrated and analyzed
while empty (as a new deployment's is). In it the kinds take turns, round by
round, ``--jobs`` ``enqueue(engine, ...)`` calls each from one thread (short rounds, so
a burst of other load on a shared box falls on every kind alike):

- plain: no option;
- unique: ``unique=rl.Unique()``, a new payload each time (each inserts);
- unique dup: ``unique=rl.Unique(key=...)`` of one live job (each returns it);
- debounced: ``debounce=rl.Debounce(key, ...)``, a new key each time (each inserts);
- debounce hit: ``debounce=`` of one waiting job's key (each replaces it).

It prints each kind's jobs/s (median of its rounds, per run) and its ratio to plain: per
run, the median over rounds of plain's rate in the round over the kind's in the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from itertools import count

import _common as bench

HERE = os.path.dirname(os.path.abspath(__file__))
KINDS = ("plain", "unique", "unique dup", "debounced", "debounce hit")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    bench.add_database_option(parser)
    return parser.parse_args()


def child(url: str, args: argparse.Namespace) -> None:
    """Time each kind in turn with whichever ``runledger_sync`` is first on the path; print one JSON line."""
    import runledger_sync as rl

    engine = rl.create_engine(url)
    serial = count()
    delay = rl.Debounce("warm", 3600, 7200)

    def options(kind: str) -> dict:
        n = next(serial)
        if kind == "unique":
            return {"unique": rl.Unique()}
        if kind == "unique dup":
            return {"unique": rl.Unique(key="one")}
        if kind == "debounced":
            return {"debounce": rl.Debounce(f"key-{n}", delay.delay, delay.max_delay)}
        if kind == "debounce hit":
            return {"debounce": rl.Debounce("one", delay.delay, delay.max_delay)}
        return {}

    def payload() -> dict:
        return {"n": next(serial)}

    for kind in KINDS:  # connect and prepare each statement outside the timed part
        rl.enqueue(engine, bench.NOOP_TYPE, payload(), **options(kind))
    rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for _ in range(args.rounds):
        for kind in KINDS:
            calls = [(payload(), options(kind)) for _ in range(args.jobs)]
            started = time.perf_counter()
            for job_payload, job_options in calls:
                rl.enqueue(engine, bench.NOOP_TYPE, job_payload, **job_options)
            rates[kind].append(args.jobs / (time.perf_counter() - started))
    engine.dispose()
    print(json.dumps({kind: {"rate": statistics.median(values),
                             "ratio": statistics.median(p / v for p, v in zip(rates["plain"], values, strict=True))}
                      for kind, values in rates.items()}))


def run_one(srv: bench.Server, args: argparse.Namespace) -> dict:
    with bench.fresh_database(srv, f"rl_bench_unique_enqueue_{os.getpid()}") as url:
        engine = bench.migrated_engine(url)
        bench.noop_registry().sync_definitions(engine)
        with engine.begin() as connection:
            connection.exec_driver_sql("ANALYZE")
        engine.dispose()
        argv = [sys.executable, os.path.abspath(__file__), "--child", url, "--rounds", str(args.rounds),
                "--jobs", str(args.jobs)]
        environment = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), HERE]))
        result = subprocess.run(argv, capture_output=True, text=True, check=False, env=environment)  # noqa: S603 - this script
        if result.returncode != 0:
            raise SystemExit(f"the child failed:\n{result.stderr}")
        return json.loads(result.stdout.splitlines()[-1])


def main() -> None:
    args = parse_args()
    if args.child:
        child(args.child, args)
        return
    with bench.server(args.database_url) as srv:
        runs = [run_one(srv, args) for _ in range(args.runs)]
    print(f"jobs={args.jobs} per kind per round, rounds={args.rounds}, runs={args.runs}")
    rows = []
    for kind in KINDS:
        rates = [run[kind]["rate"] for run in runs]
        ratios = [run[kind]["ratio"] for run in runs]
        rows.append([kind, bench.fmt_range(rates), ", ".join(f"{ratio:.2f}x" for ratio in ratios)])
    bench.print_table(["kind", "enqueue/s", "plain's rate / this one's, run by run"], rows)


if __name__ == "__main__":
    main()
