"""Wait for one job to end without blocking the event loop: ``aio.wait_for_job``.

The rules are :func:`runledger_sync.wait_for_job`'s (:mod:`runledger_sync.runtime.job_wait`):
ended means SUCCEEDED, DEAD_LETTERED or CANCELED; the waiter LISTENs on
:data:`~runledger_sync.store.driver.ENDED_CHANNEL` before it first reads the job,
reads it again when a notification names it (or names none) and at least every
:data:`~runledger_sync.runtime.job_wait.LISTENING_POLL_SECONDS`; it polls,
backing off, when it cannot listen. The same errors: ``job.wait_timeout``,
``job.not_found``.

The listening session is a connection of its own, taken from the bind's
AsyncEngine (an ``AsyncEngine``, or the engine of an ``AsyncConnection`` or
``AsyncSession``) and detached from its pool; it runs ``UNLISTEN *`` before it
is closed. A psycopg 3 ``AsyncConnection`` has no engine to open another
session from, so that wait polls. The job is read through the bind, as
:func:`runledger_sync.aio.get_job` reads it: inside the caller's transaction,
where one is joined, which must be READ COMMITTED to see the end. On an
``AsyncEngine`` each read is retried on a lost connection, as ``aio.get_job`` is.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Optional
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncEngine

from runledger_sync.store.aio_binds import ended_listener_names, engine_of, run_read
from runledger_sync.core.records import JobRecord
from runledger_sync.db.pool_mode import policy_of
from runledger_sync.logging import get_logger
from runledger_sync.runtime.job_wait import (
    FIRST_POLL_SECONDS,
    LISTENING_POLL_SECONDS,
    MAX_POLL_SECONDS,
    check_timeout,
    found,
    names,
    timed_out,
)
from runledger_sync.store.admin import jobs

log = get_logger(__name__)


async def wait_for_job(
    bind: Any, job_id: UUID | str, timeout: float = 30.0, *, organization_id: Optional[str] = None,
) -> JobRecord:
    """Wait until the job has ended, and return its final row (see :func:`runledger_sync.wait_for_job`).

    Args:
        bind: an ``AsyncEngine``, or a SQLAlchemy ``AsyncConnection`` or
            ``AsyncSession``, or a psycopg 3 ``AsyncConnection`` (that one polls).
        job_id: The job to wait for.
        timeout: The most seconds to wait (0: look once).
        organization_id: Only a job of this organization is found.

    Raises:
        JobWaitTimeout: The job had not ended after ``timeout`` seconds (``job.wait_timeout``).
        JobNotFound: No such job in the scope (``job.not_found``).
        InvalidArgument: ``timeout`` is not a finite number of seconds >= 0, or ``bind`` of another kind.
    """
    check_timeout(timeout)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    engine = engine_of(bind)
    listener = await _Listener.open(engine) if timeout > 0 and engine is not None else None
    try:
        pause = FIRST_POLL_SECONDS
        while True:
            job = found(
                await run_read(bind, lambda c: jobs.get_job(c, job_id, organization_id=organization_id)), job_id,
            )
            if job.status.is_terminal:
                return job
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise timed_out(job, timeout)
            if listener is not None and listener.alive:
                if not await listener.heard(str(job.id), min(remaining, LISTENING_POLL_SECONDS)):
                    pause = FIRST_POLL_SECONDS  # lost: poll from here on; closed below
                continue
            await asyncio.sleep(min(remaining, pause))
            pause = min(MAX_POLL_SECONDS, pause * 2)
    finally:
        if listener is not None:
            await listener.close()


class _Listener:
    """A session of its own LISTENing on the ended channel (psycopg 3 or asyncpg)."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.alive = True
        self._payloads: asyncio.Queue[str] = asyncio.Queue()

    @classmethod
    async def open(cls, engine: AsyncEngine) -> Optional[_Listener]:
        """A listener, or None to poll (shared sessions, a driver we cannot listen on, or the LISTEN failed)."""
        if not policy_of(engine.sync_engine).listens:
            return None
        try:
            fairy = await engine.raw_connection()
        except Exception as error:  # noqa: BLE001 - any failure means: poll; reading the job reports an outage
            log.debug("wait_for_job polls: connecting failed", extra={"error": str(error)})
            return None
        listener = cls(fairy.driver_connection)
        # A listening session is never given back to the pool for someone else.
        fairy.detach()
        try:
            await listener._listen()
        except Exception as error:  # noqa: BLE001 - as above
            log.debug("wait_for_job polls: LISTEN failed", extra={"error": str(error)})
            await listener.close()
            return None
        return listener

    def _is_psycopg(self) -> bool:
        psycopg = sys.modules.get("psycopg")
        return psycopg is not None and isinstance(self.connection, psycopg.AsyncConnection)

    async def _listen(self) -> None:
        connection = self.connection
        if self._is_psycopg():
            # Notifications arrive only between transactions: autocommit, after
            # ending whatever the pool's checkout left open.
            await connection.rollback()
            await connection.set_autocommit(True)
            application_name, channel = ended_listener_names()
            await connection.execute(f"SET application_name = '{application_name}'")
            await connection.execute(f"LISTEN {channel}")
            self._reader = asyncio.ensure_future(self._read_psycopg())
        elif hasattr(connection, "add_listener"):  # asyncpg: autocommit outside a transaction block
            if connection.is_in_transaction():
                raise RuntimeError("the pool's connection is inside a transaction")
            application_name, channel = ended_listener_names()
            await connection.execute(f"SET application_name = '{application_name}'")
            await connection.add_listener(channel, self._on_asyncpg_notification)
            connection.add_termination_listener(self._on_asyncpg_lost)
        else:
            raise RuntimeError(f"cannot listen on a {type(connection).__name__}")

    async def _read_psycopg(self) -> None:
        try:
            async for message in self.connection.notifies():
                self._payloads.put_nowait(message.payload)
        except Exception as error:  # noqa: BLE001 - a lost session: the waiter polls
            log.debug("wait_for_job polls: listener lost", extra={"error": str(error)})
        self.alive = False
        self._payloads.put_nowait("")  # wakes the waiter, which looks once more and then polls

    def _on_asyncpg_notification(self, connection: Any, pid: int, channel: str, payload: str) -> None:
        self._payloads.put_nowait(payload)

    def _on_asyncpg_lost(self, connection: Any) -> None:
        self.alive = False
        self._payloads.put_nowait("")  # as for psycopg: one more look, then poll

    async def heard(self, job_id: str, timeout: float) -> bool:
        """Wait up to ``timeout`` for a notification naming ``job_id``; False when the listener was lost."""
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        while True:
            if not self._connection_open():
                self.alive = False
                return False
            remaining = until - loop.time()
            if remaining <= 0:
                return True  # read the job anyway: the periodic look
            try:
                payload = await asyncio.wait_for(self._payloads.get(), remaining)
            except asyncio.TimeoutError:
                return True
            payloads = [payload]
            while not self._payloads.empty():
                payloads.append(self._payloads.get_nowait())
            if names(payloads, job_id):
                return self.alive

    def _connection_open(self) -> bool:
        if self._is_psycopg():
            return self.alive and not self.connection.closed
        return self.alive and not self.connection.is_closed()

    async def close(self) -> None:
        """Stop listening and close the session; closing a lost one is fine too."""
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        try:
            if self._connection_open():
                # A pooler may keep the session after we close: leave no LISTEN on it.
                await self.connection.execute("UNLISTEN *")
        except Exception as error:  # noqa: BLE001 - a broken session is gone, or no longer reachable by us
            log.debug("wait_for_job: UNLISTEN failed", extra={"error": str(error)})
        finally:
            await self.connection.close()
