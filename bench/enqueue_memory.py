"""Print the peak RSS of one enqueue_many (and enqueue_many_ids) call of N specs, with and without idempotency keys.

Usage: python bench/enqueue_memory.py [--jobs 200000] [--database-url URL]

Each case runs in a fresh subprocess against a fresh database, so its peak RSS
(``resource.getrusage``'s ``ru_maxrss``) is that one call's, over what the
process held before it (imports, an engine, one connection), which the table
also shows. The specs come from a generator, as an import of a large file
would make them. To measure other code (an older commit, say), put its
package first on PYTHONPATH: the child imports whichever ``runledger_sync`` it
finds, and the table names its path.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import _common as bench

import runledger_sync as rl

DEFAULT_JOBS = 200_000
#: (function, with idempotency keys); enqueue_many returns a record per job, enqueue_many_ids an id.
CASES = (("enqueue_many", False), ("enqueue_many", True), ("enqueue_many_ids", False), ("enqueue_many_ids", True))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS)
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--keyed", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--call", default="enqueue_many", help=argparse.SUPPRESS)
    bench.add_database_option(parser)
    return parser.parse_args()


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def child(url: str, jobs: int, keyed: bool, call: str) -> None:
    """Run one enqueue call and print its figures as one JSON line."""
    module = os.path.dirname(rl.__file__)
    if not hasattr(rl, call):  # older code
        print(json.dumps({"missing": True, "module": module}))
        return
    engine = rl.create_engine(url)
    with engine.connect():
        pass  # the pool's first connection is not the call's cost
    before = _peak_mib()
    specs = (rl.JobSpec(bench.NOOP_TYPE, {"n": n}, idempotency_key=f"key-{n}" if keyed else None)
             for n in range(jobs))
    started = time.perf_counter()
    returned = len(getattr(rl, call)(engine, specs))
    seconds = time.perf_counter() - started
    print(json.dumps({"before": before, "peak": _peak_mib(), "seconds": seconds, "returned": returned,
                      "stored": rl.count_jobs(engine), "module": module}))


def run_case(srv: bench.Server, jobs: int, call: str, keyed: bool) -> dict:
    with bench.fresh_database(srv, f"rl_bench_enqueue_memory_{os.getpid()}") as url:
        engine = bench.migrated_engine(url)
        bench.noop_registry().sync_definitions(engine)
        engine.dispose()
        argv = [sys.executable, os.path.abspath(__file__), "--child", url, "--jobs", str(jobs), "--call", call]
        result = subprocess.run(argv + (["--keyed"] if keyed else []), capture_output=True, text=True, check=False)  # noqa: S603 - this script
        if result.returncode != 0:
            raise SystemExit(f"the child failed:\n{result.stderr}")
        figures = json.loads(result.stdout.splitlines()[-1])
    if figures.get("missing"):
        return figures
    if figures["stored"] != jobs or figures["returned"] != jobs:
        raise SystemExit(f"expected {jobs} jobs, the child stored {figures['stored']}, returned {figures['returned']}")
    return figures


def main() -> None:
    args = parse_args()
    if args.child:
        child(args.child, args.jobs, args.keyed, args.call)
        return
    rows = []
    module = ""
    with bench.server(args.database_url) as srv:
        for call, keyed in CASES:
            figures = run_case(srv, args.jobs, call, keyed)
            module = figures["module"]
            keys = "yes" if keyed else "no"
            if figures.get("missing"):
                rows.append([call, keys, f"{args.jobs:,}", "n/a", "n/a", "n/a", "n/a"])
                continue
            grown = figures["peak"] - figures["before"]
            rows.append([call, keys, f"{args.jobs:,}", bench.fmt(figures["before"]), bench.fmt(figures["peak"]),
                         bench.fmt(grown * 1024 / args.jobs, 2), bench.fmt(figures["seconds"], 1)])
    print(f"{args.jobs:,} specs from a generator, one call each, in a fresh process ({module})")
    bench.print_table(["call", "keys", "jobs", "RSS before MiB", "peak RSS MiB", "KiB per job", "seconds"], rows)


if __name__ == "__main__":
    main()
