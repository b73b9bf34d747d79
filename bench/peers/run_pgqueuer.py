"""pgqueuer behind the bench protocol, through its public API on asyncpg.

Schema: Queries.install() (what ``pgq install`` runs). Enqueue: Queries.enqueue,
one job per call or lists of a batch. Worker: PgQueuer(...).run(), stopped by
setting PgQueuer.shutdown on SIGTERM: with its defaults (batch_size 10, no cap on
tasks in flight), or capped at N in flight with max_concurrent_tasks=N, which it
allows only with a batch of at most N/2 (so batch_size=N//2).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Callable, Optional

import _protocol
import asyncpg
from pgqueuer import AsyncpgDriver, Job, PgQueuer, Queries

ENTRYPOINT = "bench_noop"


def _payload(n: int) -> bytes:
    return str(n).encode()


async def _queries(url: str) -> tuple[asyncpg.Connection, Queries]:
    connection = await asyncpg.connect(url)
    return connection, Queries(AsyncpgDriver(connection))


class PgqueuerRunner:
    distribution = "pgqueuer"

    def setup(self, url: str) -> None:
        async def install() -> None:
            connection, queries = await _queries(url)
            await queries.install()
            await connection.close()

        asyncio.run(install())

    def bulk(self, url: str, count: int, batch: int) -> None:
        async def insert() -> None:
            connection, queries = await _queries(url)
            for offset in range(0, count, batch):
                ordinals = range(offset, min(count, offset + batch))
                await queries.enqueue([ENTRYPOINT] * len(ordinals), [_payload(n) for n in ordinals], [0] * len(ordinals))
            await connection.close()

        asyncio.run(insert())

    def single(self, url: str, count: int) -> None:
        async def insert() -> None:
            connection, queries = await _queries(url)
            for n in range(count):
                await queries.enqueue(ENTRYPOINT, _payload(n))
            await connection.close()

        asyncio.run(insert())

    def produce(self, url: str, count: int, gap_ms: float) -> list[float]:
        async def insert() -> list[float]:
            connection, queries = await _queries(url)
            committed = []
            for n in range(count):
                await queries.enqueue(ENTRYPOINT, _payload(n))
                committed.append(asyncio.get_running_loop().time())
                await asyncio.sleep(gap_ms / 1000.0)
            await connection.close()
            return committed

        # The event loop's clock is time.monotonic(), the protocol's clock.
        return asyncio.run(insert())

    def work(self, url: str, concurrency: Optional[int], recorder: _protocol.Recorder, ready: Callable[[], None]) -> None:
        capped = {} if concurrency is None else {
            "batch_size": max(1, concurrency // 2), "max_concurrent_tasks": max(2, concurrency)}

        async def run() -> None:
            connection = await asyncpg.connect(url)
            pgq = PgQueuer.from_asyncpg_connection(connection)

            @pgq.entrypoint(ENTRYPOINT)
            async def noop(job: Job) -> None:
                recorder.job_started(int(job.payload))

            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, pgq.shutdown.set)
            ready()
            await pgq.run(**capped)
            await connection.close()

        asyncio.run(run())


if __name__ == "__main__":
    sys.exit(_protocol.main(PgqueuerRunner()))
