"""Print the time to build and check a workflow of N chained steps, and to enqueue it.

Usage: python bench/workflow_build.py [--steps 5000 10000 20000] [--database-url URL]

Building (``Workflow.job`` per step, then ``validate()``) runs in memory; the
enqueue writes the run, its steps and edges in one transaction against a fresh
database. Both should grow linearly with the number of steps.
"""

from __future__ import annotations

import argparse
import os
import time

import _common as bench

import runledger_sync as rl

STEP_TYPE = "bench.step"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[5_000, 10_000, 20_000])
    bench.add_database_option(parser)
    return parser.parse_args()


def chain(steps: int) -> rl.Workflow:
    wf = rl.Workflow(f"chain-{steps}")
    for index in range(steps):
        wf.job(f"s{index}", STEP_TYPE, {"i": index}, after=[f"s{index - 1}"] if index else ())
    wf.validate()
    return wf


def main() -> None:
    args = parse_args()
    rows = []
    with bench.server(args.database_url) as srv:
        with bench.fresh_database(srv, f"rl_bench_workflow_build_{os.getpid()}") as url:
            engine = bench.migrated_engine(url)
            registry = rl.JobRegistry()
            registry.job(STEP_TYPE)(lambda ctx, payload: None)
            registry.sync_definitions(engine)
            for steps in args.steps:
                started = time.perf_counter()
                wf = chain(steps)
                built = time.perf_counter() - started
                started = time.perf_counter()
                rl.enqueue_workflow(engine, wf)
                enqueued = time.perf_counter() - started
                rows.append([f"{steps:,}", bench.fmt(built, 3), bench.fmt(built * 1e6 / steps, 1),
                             bench.fmt(enqueued, 2), bench.fmt(enqueued * 1e6 / steps, 0)])
            engine.dispose()
    bench.print_table(["steps", "build s", "build us/step", "enqueue s", "enqueue us/step"], rows)


if __name__ == "__main__":
    main()
