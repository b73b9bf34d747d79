"""runledger-sync behind the bench protocol: enqueue, enqueue_many and a Supervisor (JobsConfig defaults, or concurrency N).

Runs in the project's own virtualenv; compare.py and scale.py start it as a process.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

import _protocol

import runledger_sync as rl

NOOP_TYPE = "bench.noop"


class RunledgerRunner:
    distribution = "runledger-sync"

    def __init__(self) -> None:
        self.registry = rl.JobRegistry()
        self.recorder = _protocol.Recorder(enabled=False)

        @self.registry.job(NOOP_TYPE)
        def noop(ctx: rl.JobContext, payload: dict) -> None:
            self.recorder.job_started(payload["n"])

    def setup(self, url: str) -> None:
        engine = rl.create_engine(url)
        rl.migrate(engine)
        self.registry.sync_definitions(engine)
        engine.dispose()

    def bulk(self, url: str, count: int, batch: int) -> None:
        engine = rl.create_engine(url)
        for offset in range(0, count, batch):
            rl.enqueue_many(engine, [rl.JobSpec(NOOP_TYPE, {"n": n}) for n in range(offset, min(count, offset + batch))])
        engine.dispose()

    def single(self, url: str, count: int) -> None:
        engine = rl.create_engine(url)
        for n in range(count):
            rl.enqueue(engine, NOOP_TYPE, {"n": n})
        engine.dispose()

    def produce(self, url: str, count: int, gap_ms: float) -> list[float]:
        engine = rl.create_engine(url)
        committed = _protocol.paced(count, gap_ms, lambda n: rl.enqueue(engine, NOOP_TYPE, {"n": n}))
        engine.dispose()
        return committed

    def work(self, url: str, concurrency: Optional[int], recorder: _protocol.Recorder, ready: Callable[[], None]) -> None:
        self.recorder = recorder
        if concurrency is None:
            engine, config = rl.create_engine(url), rl.JobsConfig()
        else:
            engine = rl.create_engine(url, pool_size=concurrency + 4)
            config = rl.JobsConfig(max_global_concurrency=concurrency)
        supervisor = rl.Supervisor(engine, self.registry, config)
        ready()
        supervisor.run_until_shutdown()
        engine.dispose()


if __name__ == "__main__":
    sys.exit(_protocol.main(RunledgerRunner()))
