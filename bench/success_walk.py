"""Print the files and threads a success crosses, from the handler's return to its durable row.

Usage: python bench/success_walk.py [--jobs 20] [--to-slot] [--database-url URL]

A worker runs no-op jobs one at a time. For each, every Python call made in
``runledger_sync`` between the handler's return and the moment its SUCCEEDED
row is committed (the store's group write returns) is recorded by a profile
hook on every thread; with --to-slot, until its attempt has ended and freed its
slot (the counting and logging after the commit included). The walk of the job
seen most often is printed: its files, in the order they were first entered,
and its threads. With no URL an embedded PostgreSQL is started in a temporary
directory.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import threading

import _common as bench

import runledger_sync as rl
from runledger_sync.runtime.worker.loop import WorkerLoop
from runledger_sync.store import driver

PACKAGE = os.path.dirname(rl.__file__)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--to-slot", action="store_true", help="walk on until the attempt has freed its slot")
    bench.add_database_option(parser)
    return parser.parse_args()


class Walk:
    """Records the package's files and threads entered while ``recording`` is set."""

    def __init__(self) -> None:
        self.recording = False
        self.files: dict[str, None] = {}
        self.threads: set[str] = set()

    def profile(self, frame, event, _arg):
        if self.recording and event == "call":
            path = frame.f_code.co_filename
            if path.startswith(PACKAGE):
                self.files.setdefault(os.path.relpath(path, os.path.dirname(PACKAGE)))
                self.threads.add(threading.current_thread().name.rsplit("-", 1)[0])


def main() -> int:
    args = parse_args()
    walks: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    walk = Walk()
    registry = rl.JobRegistry()

    @registry.job("bench.noop")
    def noop(ctx, payload):
        walk.recording = True  # the handler's last line: from here on is its success's walk

    with bench.server(args.database_url) as server, bench.fresh_database(server, "rl_bench_walk") as url:
        engine = bench.migrated_engine(url)
        registry.sync_definitions(engine)
        config = rl.JobsConfig(worker_id="walk", max_global_concurrency=1, claim_batch_size=1)
        # Before the loop: its writer threads start with it, and a thread takes the hook when it starts.
        threading.setprofile(walk.profile)
        loop = WorkerLoop(driver.driver_for(engine), registry, config, threading.Event(), listen=False)
        slot_ended = loop._slot_ended
        ended = threading.Event()

        def end_of_walk(queue: str) -> None:
            walk.recording = False
            slot_ended(queue)
            ended.set()

        loop._slot_ended = end_of_walk
        if not args.to_slot:
            write_outcomes = driver.apply_transitions

            def durable_then_stop(*write_args, **write_kwargs):
                written = write_outcomes(*write_args, **write_kwargs)
                walk.recording = False
                return written

            driver.apply_transitions = durable_then_stop
        try:
            for _ in range(args.jobs):
                rl.enqueue(engine, "bench.noop", {})
                walk.files, walk.threads = {}, set()
                ended.clear()
                while not loop.turn() and loop.in_flight == 0:
                    pass
                sys.setprofile(walk.profile)
                if not ended.wait(10):
                    print("a job did not end within 10 s", file=sys.stderr)
                    return 1
                walks.append((tuple(walk.files), tuple(sorted(walk.threads))))
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
            loop.drain()
            engine.dispose()
    (files, threads), seen = collections.Counter(walks).most_common(1)[0]
    print(f"success walk (seen in {seen} of {len(walks)} jobs): {len(files)} files, {len(threads)} threads")
    for path in files:
        print(f"  {path}")
    print("threads: " + ", ".join(threads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
