"""Run the store's synchronous calls on what an asyncio caller holds, in the caller's transaction.

The store's functions are written once, against a SQLAlchemy ``Connection``.
SQLAlchemy's asyncio layer runs such code on an async driver: ``run_sync``
hands it a ``Connection`` (or ``Session``) whose every statement awaits the
driver underneath, in a greenlet. So an asyncio call here is the synchronous
call itself, with the same validation, statements and error codes, run through
``run_sync``:

- a SQLAlchemy ``AsyncConnection`` or ``AsyncSession`` (on psycopg 3 or
  asyncpg): its own ``run_sync``, so the call joins its transaction;
- a psycopg 3 ``AsyncConnection``: lent to a private async engine, one per
  process, whose dialect never begins, commits, rolls back or closes it, as
  :mod:`runledger_sync.store.binds` lends a sync one; our statements run on a
  cursor of our own with tuple rows and our own type loaders;
- an ``AsyncEngine`` (reads only): a transaction of the store's own, committed here,
  and retried on a lost connection as the sync store retries its own
  (:mod:`runledger_sync.store.transactions`: the same errors, attempts and budget), sleeping
  with asyncio between tries. A caller's connection or session is never retried: its
  transaction is the caller's.
"""

from __future__ import annotations

import sys
import threading
from contextvars import ContextVar
from typing import Any, Callable, Optional, TypeVar

from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import registry as dialect_registry
from sqlalchemy.dialects.postgresql.psycopg import (
    AsyncAdapt_psycopg_connection,
    AsyncAdapt_psycopg_cursor,
    PGDialectAsync_psycopg,
    PsycopgAdaptDBAPI,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.util.concurrency import await_
from tenacity import AsyncRetrying

from runledger_sync.core.errors import InvalidArgument
from runledger_sync.core.store_errors import ConnectionFailed
from runledger_sync.db.errors import translate
from runledger_sync.store.binds import LENT_ENGINE_OPTIONS, _LeavesTheConnectionToItsOwner, _own_psycopg_cursor
from runledger_sync.store.transactions import retry_policy, worth_retrying
from runledger_sync.store.notify import ENDED_CHANNEL, LISTENER_APPLICATION_NAME

T = TypeVar("T")

#: What the asyncio calls that join a transaction accept as their first argument.
BIND_DESCRIPTION = "a SQLAlchemy AsyncConnection or AsyncSession, or a psycopg 3 AsyncConnection"

_DIALECT = "runledger_lent_psycopg_async"
_lent: ContextVar[Optional[Any]] = ContextVar("runledger_lent_async_connection", default=None)
_engine: Optional[AsyncEngine] = None
_engine_lock = threading.Lock()


class _LentAsyncCursor(AsyncAdapt_psycopg_cursor):
    __slots__ = ()

    def _make_new_cursor(self, connection: Any) -> Any:
        psycopg = sys.modules["psycopg"]
        return _own_psycopg_cursor(psycopg, connection, psycopg.AsyncCursor)


class _LentAsyncConnection(AsyncAdapt_psycopg_connection):
    __slots__ = ()

    def cursor(self, *name: Any) -> Any:
        # The store streams no results: every cursor is our plain one, whatever
        # cursor_factory or row_factory the caller set on its connection.
        return _LentAsyncCursor(self)


class _LentAsyncDBAPI(PsycopgAdaptDBAPI):
    def connect(self, *arg: Any, **kw: Any) -> Any:
        return await_(_LentAsyncConnection.create(self, kw["async_creator_fn"]()))


class LentAsyncPsycopgDialect(_LeavesTheConnectionToItsOwner, PGDialectAsync_psycopg):
    """Async psycopg 3 dialect that leaves the transaction and life of the connection to its owner."""

    # The statements compile exactly as for the stock dialect, so caching is safe.
    supports_statement_cache = True

    @classmethod
    def get_async_dialect_cls(cls, url: Any) -> Any:
        # The stock one would swap in the stock async dialect.
        return cls

    @classmethod
    def import_dbapi(cls) -> Any:
        import psycopg
        from psycopg.pq import ExecStatus

        return _LentAsyncDBAPI(psycopg, ExecStatus)

    def get_isolation_level(self, dbapi_connection: Any) -> Any:
        # Read once at first connect. The stock dialect rolls back afterwards when
        # the connection was idle; a lent one is left as the statement leaves it.
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("show transaction isolation level")
            return str(cursor.fetchone()[0]).upper()
        finally:
            cursor.close()


dialect_registry.register(f"postgresql.{_DIALECT}", __name__, "LentAsyncPsycopgDialect")


async def _borrowed() -> Any:
    connection = _lent.get()
    if connection is None:  # pragma: no cover - only reachable by misuse of the private engine
        raise RuntimeError("no psycopg AsyncConnection is lent to the runledger engine")
    return connection


def _lent_engine() -> AsyncEngine:
    # One engine per process, whatever the event loops (it holds no connection
    # between calls): its compiled-statement cache is what keeps the store's
    # statements from being recompiled on every call.
    global _engine
    with _engine_lock:
        if _engine is None:
            _engine = create_async_engine(f"postgresql+{_DIALECT}://", async_creator=_borrowed, **LENT_ENGINE_OPTIONS)
        return _engine


def is_psycopg_async_connection(bind: Any) -> bool:
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(bind, psycopg.AsyncConnection)


async def run_joined(bind: Any, work: Callable[[Any], T]) -> T:
    """Run ``work`` (a sync store call) on a Connection or Session in the caller's transaction.

    Raises:
        InvalidArgument: ``bind`` is none of the accepted kinds, or a closed psycopg connection.
    """
    if isinstance(bind, (AsyncConnection, AsyncSession)):
        return await bind.run_sync(work)
    if is_psycopg_async_connection(bind):
        if bind.closed:
            raise InvalidArgument("bind", "a closed psycopg connection", "an open connection")
        token = _lent.set(bind)
        try:
            async with _lent_engine().connect() as connection:
                return await connection.run_sync(work)
        finally:
            _lent.reset(token)
    raise InvalidArgument("bind", type(bind).__name__, BIND_DESCRIPTION)


async def run_read(bind: Any, work: Callable[[Any], T]) -> T:
    """Like :func:`run_joined`, and an ``AsyncEngine`` too: then the read is a transaction of its own,
    retried on a lost connection within the sync store's budget (``work`` must only read).

    Raises:
        ConnectionFailed: the connection was still lost when the budget was spent (``db.connection_failed``).
    """
    if not isinstance(bind, AsyncEngine):
        return await run_joined(bind, work)
    try:
        # The first try outside tenacity, as the sync store does: nearly every read succeeds at once.
        return await _read_once(bind, work)
    except ConnectionFailed as exc:
        if not worth_retrying(exc):
            raise
    async for attempt in AsyncRetrying(**retry_policy()):
        with attempt:
            return await _read_once(bind, work)
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover


async def _read_once(engine: AsyncEngine, work: Callable[[Any], T]) -> T:
    try:
        async with engine.begin() as connection:
            return await connection.run_sync(work)
    except sa_exc.DBAPIError as exc:
        # Connecting, or the commit: ``work`` translates its own statements' errors.
        raise translate(exc, engine.url) from exc


def engine_of(bind: Any) -> Optional[AsyncEngine]:
    """The AsyncEngine behind a SQLAlchemy async bind (None for a psycopg connection or an unbound session)."""
    if isinstance(bind, AsyncEngine):
        return bind
    if isinstance(bind, AsyncConnection):
        return bind.engine
    if isinstance(bind, AsyncSession):
        inner = bind.bind
        if isinstance(inner, (AsyncEngine, AsyncConnection)):
            return engine_of(inner)
    return None


def ended_listener_names() -> tuple[str, str]:
    """The application name a LISTEN session of ours shows, and the channel of ended jobs it listens to."""
    return LISTENER_APPLICATION_NAME, ENDED_CHANNEL
