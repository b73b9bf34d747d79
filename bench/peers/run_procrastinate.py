"""procrastinate behind the bench protocol, through its public API with its psycopg 3 connector.

Schema: app.schema_manager.apply_schema(). Enqueue: task.defer() per job and
task.batch_defer() per batch. Worker: app.run_worker(concurrency=N), which
stops gracefully on SIGTERM and LISTENs for new jobs by default.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

import _protocol
import procrastinate

_UNRECORDED = _protocol.Recorder(enabled=False)


def _app(url: str, recorder: _protocol.Recorder = _UNRECORDED) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="bench_noop")
    def noop(n: int) -> None:
        recorder.job_started(n)

    return app


class ProcrastinateRunner:
    distribution = "procrastinate"

    def setup(self, url: str) -> None:
        with _app(url).open() as app:
            app.schema_manager.apply_schema()

    def bulk(self, url: str, count: int, batch: int) -> None:
        with _app(url).open() as app:
            task = app.tasks["bench_noop"]
            for offset in range(0, count, batch):
                task.batch_defer(*({"n": n} for n in range(offset, min(count, offset + batch))))

    def single(self, url: str, count: int) -> None:
        with _app(url).open() as app:
            task = app.tasks["bench_noop"]
            for n in range(count):
                task.defer(n=n)

    def produce(self, url: str, count: int, gap_ms: float) -> list[float]:
        with _app(url).open() as app:
            task = app.tasks["bench_noop"]
            return _protocol.paced(count, gap_ms, lambda n: task.defer(n=n))

    def work(self, url: str, concurrency: Optional[int], recorder: _protocol.Recorder, ready: Callable[[], None]) -> None:
        app = _app(url, recorder)
        ready()
        app.run_worker(**({} if concurrency is None else {"concurrency": concurrency}))


if __name__ == "__main__":
    sys.exit(_protocol.main(ProcrastinateRunner()))
