"""A connection one thread keeps for its many short transactions.

The worker's polling thread and its completer each run a transaction every
few milliseconds. Through an Engine each of those checks a connection out of
the pool, and the pool's pre-ping (kept on for the application's own queries)
spends a round trip on ``SELECT 1`` before every one. A held connection is
checked out once and reused; when it breaks, the failed transaction is retried
like any lost connection, on a new one.
"""

from __future__ import annotations

from typing import Optional

from sqlalchemy.engine import Connection, Engine

from runledger_sync.core.store_errors import ConnectionFailed


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
