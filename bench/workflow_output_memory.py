"""Print the worker's peak RSS while a fan-in step reads two large outputs with ``ctx.workflow.output_of``.

Usage: python bench/workflow_output_memory.py [--output-mib 20] [--database-url URL]

Two branch steps each return an output of about ``--output-mib`` MiB of JSON; a
join step after both reads them. The worker runs in a fresh subprocess against
a fresh database, with ``max_output_bytes`` raised to let the outputs through;
the table shows its RSS before the run and at its peak. To measure other code,
put its package first on PYTHONPATH: the child imports whichever
``runledger_sync`` it finds, and the table names its path.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time

import _common as bench

import runledger_sync as rl

BRANCH, JOIN = "bench.branch", "bench.join"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-mib", type=int, default=20)
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    bench.add_database_option(parser)
    return parser.parse_args()


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def registry(size: int, read: dict) -> rl.JobRegistry:
    jobs = rl.JobRegistry()

    @jobs.job(BRANCH)
    def branch(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
        return rl.JobCompletion(output={"blob": "x" * size})

    @jobs.job(JOIN)
    def join(ctx: rl.JobContext, payload: dict) -> None:
        read["bytes"] = sum(len(ctx.workflow.output_of(key)["blob"]) for key in ("a", "b"))

    return jobs


def child(url: str, output_mib: int) -> None:
    """Run the fan-in with a worker in this process and print its figures as one JSON line."""
    size = output_mib * 1024 * 1024
    read: dict = {}
    jobs = registry(size, read)
    engine = rl.create_engine(url)
    jobs.sync_definitions(engine)
    wf = rl.Workflow("fan-in")
    wf.job("join", JOIN, after=[wf.job("a", BRANCH), wf.job("b", BRANCH)])
    run = rl.enqueue_workflow(engine, wf)
    before = _peak_mib()
    config = rl.JobsConfig(max_output_bytes=size + 1024, poll_interval_ms=50, max_global_concurrency=2)
    shutdown = threading.Event()
    worker = threading.Thread(target=rl.run_worker_loop, args=(engine, jobs, config, shutdown))
    started = time.perf_counter()
    worker.start()
    while rl.get_workflow_run(engine, run.id).status is not rl.WorkflowRunStatus.SUCCEEDED:
        if time.perf_counter() - started > 300:
            shutdown.set()
            raise SystemExit("the run did not succeed within 300 s")
        time.sleep(0.2)
    seconds = time.perf_counter() - started
    shutdown.set()
    worker.join()
    print(json.dumps({"before": before, "peak": _peak_mib(), "seconds": seconds, "read": read.get("bytes"),
                      "module": os.path.dirname(rl.__file__)}))


def main() -> None:
    args = parse_args()
    if args.child:
        child(args.child, args.output_mib)
        return
    with bench.server(args.database_url) as srv:
        with bench.fresh_database(srv, f"rl_bench_output_memory_{os.getpid()}") as url:
            bench.migrated_engine(url).dispose()
            argv = [sys.executable, os.path.abspath(__file__), "--child", url, "--output-mib", str(args.output_mib)]
            result = subprocess.run(argv, capture_output=True, text=True, check=False)  # noqa: S603 - this script
            if result.returncode != 0:
                raise SystemExit(f"the child failed:\n{result.stderr}")
            figures = json.loads(result.stdout.splitlines()[-1])
    print(f"two branch outputs of {args.output_mib} MiB each, one join reading both ({figures['module']})")
    bench.print_table(
        ["output MiB", "RSS before MiB", "peak RSS MiB", "grown MiB", "grown / output", "seconds"],
        [[str(args.output_mib), bench.fmt(figures["before"]), bench.fmt(figures["peak"]),
          bench.fmt(figures["peak"] - figures["before"]),
          bench.fmt((figures["peak"] - figures["before"]) / args.output_mib, 1), bench.fmt(figures["seconds"], 1)]],
    )


if __name__ == "__main__":
    main()
