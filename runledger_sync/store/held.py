"""A connection one thread keeps for its many short transactions.

The worker's polling thread and its completer each run a transaction every
few milliseconds. Through an Engine each of those checks a connection out of
the pool, and the pool's pre-ping (kept on for the application's own queries)
spends a round trip on ``SELECT 1`` before every one. A held connection is
checked out once and reused; when it breaks, the failed transaction is retried
like any lost connection, on a new one.

A readiness probe keeps a connection of its own too, but outside the bind's
pool altogether (:func:`engine_apart`): a pool the jobs have taken whole must
not read as an outage.
"""

from __future__ import annotations

import math
from typing import Optional

from sqlalchemy.engine import Connection, Engine

from runledger_sync.core.store_errors import ConnectionFailed
from runledger_sync.db.engine import create_engine
from runledger_sync.db.pool_mode import policy_of


class HeldConnection:
    """One thread's connection, reopened after it breaks; pass it wherever the store takes an Engine.

    Not thread-safe: each thread that writes holds its own.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._connection: Optional[Connection] = None

    def connect(self) -> "_Use":
        """Like ``Engine.connect()``: the (re)opened connection, as a context that does not close it."""
        current = self._connection
        if current is None or current.closed or current.invalidated:
            self.close()
            current = self._connection = self.engine.connect()
        return _Use(self, current)

    def close(self) -> None:
        current, self._connection = self._connection, None
        if current is not None:
            current.close()


class _Use:
    def __init__(self, held: HeldConnection, connection: Connection) -> None:
        self._held = held
        self._connection = connection

    def __enter__(self) -> Connection:
        return self._connection

    def __exit__(self, exc_type: object, error: Optional[BaseException], traceback: object) -> None:
        # A broken connection is replaced next time; after a refused write it is fine as it is.
        if error is not None and (self._connection.invalidated or isinstance(error, ConnectionFailed)):
            self._held.close()


def engine_apart(engine: Engine, *, timeout_seconds: float) -> Engine:
    """An engine of one connection to ``engine``'s database, with its pool mode, that waits ``timeout_seconds`` at most.

    Its one connection is opened on first use and kept, so a server with no
    connection slot left for newcomers still answers it; dispose of it when done.
    """
    return create_engine(
        engine.url, schema="", pool_size=1, max_overflow=0, pool_mode=policy_of(engine).mode,
        pool_timeout=timeout_seconds, connect_args={"connect_timeout": max(1, math.ceil(timeout_seconds))},
    )
