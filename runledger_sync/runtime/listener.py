"""The worker's LISTEN connection: wake an idle polling thread when its job types are enqueued.

It runs on the polling thread itself (``WorkerLoop.pause`` calls :meth:`JobListener.wait`),
so it adds no thread. When the connection is lost the worker falls back to plain
polling and the listener reconnects on a later pause, at most once per
:data:`RECONNECT_SECONDS`. Each change of state is logged once.
"""

from __future__ import annotations

import select
import time
from typing import Any, Iterable, Optional

import psycopg2.extensions
from sqlalchemy.engine import Engine

from runledger_sync.logging import get_logger
from runledger_sync.store import notify

log = get_logger(__name__)

#: How long a lost listener waits before trying to LISTEN again.
RECONNECT_SECONDS = 1.0


class JobListener:
    """One LISTEN connection and its connected/lost state."""

    def __init__(self, engine: Engine, job_types: Iterable[str], *, worker_id: str) -> None:
        self.engine = engine
        self.job_types = frozenset(job_types)
        self.worker_id = worker_id
        self._connection: Optional[psycopg2.extensions.connection] = None
        self._retry_at = 0.0
        # None until the first attempt, so the first outcome is logged either way.
        self._was_connected: Optional[bool] = None

    @property
    def connected(self) -> bool:
        return self._connection is not None

    def connect_if_due(self) -> bool:
        """LISTEN if not listening and the backoff has passed; return True only on a new connection.

        A new connection has missed whatever was enqueued before it, so the caller
        should claim once more before waiting.
        """
        if self._connection is not None or time.monotonic() < self._retry_at:
            return False
        try:
            self._connection = notify.open_listener(self.engine)
        except Exception as error:  # noqa: BLE001 - any failure means: poll, try again later
            self._lost(error)
            return False
        if self._was_connected is not True:
            log.info("listener connected", extra={"worker_id": self.worker_id, "channel": notify.CHANNEL})
        self._was_connected = True
        return True

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; return True when one of our job types was notified.

        Returns False at once when not connected (the caller polls instead), and
        on a lost connection, after marking it lost.
        """
        connection = self._connection
        if connection is None:
            return False
        try:
            # Notifications already read into psycopg2's buffer do not make the socket readable.
            if self._relevant(notify.read_notified_types(connection)):
                return True
            readable, _, _ = select.select([connection], [], [], timeout)
            return bool(readable) and self._relevant(notify.read_notified_types(connection))
        except (OSError, ValueError, psycopg2.Error) as error:
            # ValueError: select() on a connection whose socket is already closed.
            self._lost(error)
            return False

    def discard_pending(self) -> None:
        """Read and drop what has arrived, so a busy worker's listener does not back up the server's queue."""
        if self._connection is None:
            return
        try:
            notify.read_notified_types(self._connection)
        except (OSError, ValueError, psycopg2.Error) as error:
            self._lost(error)

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                notify.close_listener(connection)
            except psycopg2.Error:  # pragma: no cover - closing a broken socket
                pass

    def _relevant(self, types: set[str]) -> bool:
        return not self.job_types.isdisjoint(types)

    def _lost(self, error: Any) -> None:
        self.close()
        self._retry_at = time.monotonic() + RECONNECT_SECONDS
        if self._was_connected is not False:
            log.warning("listener lost; polling", extra={"worker_id": self.worker_id, "error": str(error)})
        self._was_connected = False
