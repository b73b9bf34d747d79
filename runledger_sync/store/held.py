"""A connection one thread keeps for its many short transactions.

The worker's polling thread and its group writers each run a transaction every
few milliseconds. Through an Engine each of those checks a connection out of
the pool, and the pool's pre-ping (kept on for the application's own queries)
spends a round trip on ``SELECT 1`` before every one. A held connection is
checked out once and reused; when it breaks, the failed transaction is retried
like any lost connection, on a new one.
"""

from __future__ import annotations

from typing import Optional

from sqlalchemy.engine import Connection, Engine


class HeldConnection:
    """One thread's connection, reopened after it breaks; pass it wherever the store takes an Engine.

    Not thread-safe: each thread that writes holds its own.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._connection: Optional[Connection] = None

    def connection(self) -> Connection:
        """The held connection, opened anew if it is missing or was invalidated by a lost server."""
        current = self._connection
        if current is None or current.closed or current.invalidated:
            if current is not None:
                current.close()
            current = self._connection = self.engine.connect()
        return current

    def release(self) -> None:
        """Give the connection back (after a failure its state is unknown, so it is not reused)."""
        current, self._connection = self._connection, None
        if current is not None:
            current.close()

    def close(self) -> None:
        self.release()
