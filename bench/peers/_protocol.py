"""The command line every runner here speaks, so compare.py drives each queue the same way.

Standard library only: it is imported both by our runner (the project's venv) and
by the peers' runners (bench/.peers-venv). Times are time.monotonic(), which is
CLOCK_MONOTONIC, one clock for every process on the machine, so start times
written by a worker and commit times printed by a producer can be subtracted.

    setup URL                 install the system's schema in an empty database
    bulk URL N BATCH          insert N no-op jobs in batches; prints {"seconds": s}
    single URL N              insert N jobs one call at a time; prints {"seconds": s}
    produce URL N GAP_MS      insert N jobs GAP_MS apart; prints {"committed": [t0, ...]}
    work URL CONCURRENCY [RECORD]
                              run a worker until SIGTERM, at most CONCURRENCY jobs
                              in flight ("default": the system's own default
                              settings); with RECORD, write {"n": start time} of
                              every job there at exit
    version                   prints {"version": "x.y.z"}
Every job carries its ordinal n (0..N-1) so a start can be matched to its commit.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from typing import Callable, Optional, Protocol

READY_LINE = "ready"
#: The CONCURRENCY that leaves every setting of the worker at the system's own default.
DEFAULT = "default"


@dataclass
class Recorder:
    """Start times of jobs by ordinal, kept only when compare.py asks for them."""

    enabled: bool
    started: dict[int, float] = field(default_factory=dict)

    def job_started(self, n: int) -> None:
        if self.enabled:
            self.started[n] = time.monotonic()


class Runner(Protocol):
    distribution: str

    def setup(self, url: str) -> None: ...
    def bulk(self, url: str, count: int, batch: int) -> None: ...
    def single(self, url: str, count: int) -> None: ...
    def produce(self, url: str, count: int, gap_ms: float) -> list[float]: ...
    def work(self, url: str, concurrency: Optional[int], recorder: Recorder, ready: Callable[[], None]) -> None: ...


def announce_ready() -> None:
    """Tell compare.py that imports and connections are done and the worker loop starts."""
    print(READY_LINE, flush=True)


def _timed(action: Callable[[], None]) -> dict:
    started = time.perf_counter()
    action()
    return {"seconds": time.perf_counter() - started}


def main(runner: Runner, argv: Optional[list[str]] = None) -> int:
    command, *rest = argv if argv is not None else sys.argv[1:]
    result: Optional[dict] = None
    if command == "version":
        result = {"version": metadata.version(runner.distribution)}
    elif command == "setup":
        runner.setup(rest[0])
    elif command == "bulk":
        result = _timed(lambda: runner.bulk(rest[0], int(rest[1]), int(rest[2])))
    elif command == "single":
        result = _timed(lambda: runner.single(rest[0], int(rest[1])))
    elif command == "produce":
        result = {"committed": runner.produce(rest[0], int(rest[1]), float(rest[2]))}
    elif command == "work":
        recorder = Recorder(enabled=len(rest) > 2)
        runner.work(rest[0], None if rest[1] == DEFAULT else int(rest[1]), recorder, announce_ready)
        if recorder.enabled:
            with open(rest[2], "w") as handle:
                json.dump(recorder.started, handle)
    else:
        print(f"unknown command {command!r}", file=sys.stderr)
        return 2
    if result is not None:
        print(json.dumps(result), flush=True)
    return 0


def paced(count: int, gap_ms: float, insert_one: Callable[[int], None]) -> list[float]:
    """Insert jobs 0..count-1 one at a time, ``gap_ms`` apart; return each commit time."""
    committed = []
    for n in range(count):
        insert_one(n)
        committed.append(time.monotonic())
        time.sleep(gap_ms / 1000.0)
    return committed
