"""Turn whatever the caller holds into a SQLAlchemy Connection in the caller's transaction.

Store functions accept five kinds of ``bind``:

- an ``Engine``: the store opens, commits and retries its own transaction;
- a ``Connection``: the statements join its transaction;
- an ORM ``Session`` or ``scoped_session`` (Flask-SQLAlchemy's ``db.session``):
  the statements run on ``session.connection()``, so they join the session's
  transaction;
- a raw psycopg2 connection, or a raw psycopg 3 ``psycopg.Connection``
  (Django's ``connection.connection`` is one or the other, by the driver Django
  picked; plain psycopg apps hold one): the statements run on that very
  connection, inside its current transaction.

In every joined case the commit or rollback stays the caller's. A raw
connection is lent to a private engine, one per driver, whose dialect never
begins, commits, rolls back or closes a DBAPI connection, runs no connect-time
setup on it, and whose pool never keeps one, so SQLAlchemy's result handling is
reused without it touching the caller's transaction. Our statements run on a
cursor of our own, with tuple rows and our own decoding of uuid, json, jsonb
(and, on psycopg 3, timestamptz), whatever row factory or type loaders the
caller set on its connection. Its search_path is used as it is: ``with_schema``
only applies to SQLAlchemy binds.

psycopg 3 is optional: it is never imported here unless the caller already
imported it and hands in one of its connections.
"""

from __future__ import annotations

import json
import sys
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Iterator, Optional, Protocol, Union, cast

import psycopg2.extensions
import psycopg2.extras
import sqlalchemy
from sqlalchemy.dialects import registry as dialect_registry
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg, PGExecutionContext_psycopg
from sqlalchemy.dialects.postgresql.psycopg2 import PGDialect_psycopg2, PGExecutionContext_psycopg2
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.engine.interfaces import IsolationLevel
from sqlalchemy.orm import Session, scoped_session
from sqlalchemy.pool import NullPool

from runledger_sync.core.errors import InvalidArgument

if TYPE_CHECKING:
    import psycopg


class OwnConnections(Protocol):
    """Where the store takes connections for transactions of its own, as from an Engine.

    The runtime's :class:`~runledger_sync.store.transactions.HeldConnection` is one.
    """

    engine: Engine

    def connect(self) -> AbstractContextManager[Connection]: ...


#: What every store function accepts as its first argument (a held connection is
#: the runtime's stand-in for an Engine: the store owns its transactions too).
Bind = Union[
    Engine, Connection, Session, scoped_session, psycopg2.extensions.connection, "psycopg.Connection[Any]",
    OwnConnections,
]

BIND_DESCRIPTION = "an Engine, a Connection, an ORM Session or a psycopg2 or psycopg 3 connection"

_PSYCOPG2_DIALECT = "runledger_lent"
_PSYCOPG_DIALECT = "runledger_lent_psycopg"


class _LeavesTheConnectionToItsOwner:
    """Dialect mixin: the transaction and the life of a lent DBAPI connection stay its owner's."""

    # A server-side cursor would be the connection's own kind, with its row
    # factory; the store streams no results, so every cursor is our plain one.
    supports_server_side_cursors = False

    def on_connect(self) -> None:
        # No connect-time setup (typecasters, notice handlers, isolation level):
        # it would change the caller's connection for good.
        return None

    # Connection.close() rolls back an autobegun transaction, and the pool resets
    # and closes what it is given back; on a lent connection each of those would
    # end the caller's transaction, so they do nothing here.
    def do_begin(self, dbapi_connection: Any) -> None:
        pass

    def do_commit(self, dbapi_connection: Any) -> None:
        pass

    def do_rollback(self, dbapi_connection: Any) -> None:
        pass

    def do_close(self, dbapi_connection: Any) -> None:
        pass

    def do_terminate(self, dbapi_connection: Any) -> None:
        pass


class _LentExecutionContext(PGExecutionContext_psycopg2):
    def create_default_cursor(self) -> Any:
        # A plain cursor even when the caller's connection defaults to dict rows
        # (RealDictConnection, cursor_factory=...): SQLAlchemy reads rows as tuples.
        # SQLAlchemy types the cursor as a generic DBAPI one; with this factory it is psycopg2's.
        cursor = cast(psycopg2.extensions.cursor, self._dbapi_connection.cursor(cursor_factory=psycopg2.extensions.cursor))
        # The usual dialect registers these typecasters on the connection at
        # connect time. A lent connection is not ours to change (Django makes
        # jsonb come back as text, for one), so they are scoped to our cursor.
        psycopg2.extras.register_uuid(None, cursor)
        psycopg2.extras.register_default_json(cursor, loads=json.loads)
        psycopg2.extras.register_default_jsonb(cursor, loads=json.loads)
        return cursor


class LentConnectionDialect(_LeavesTheConnectionToItsOwner, PGDialect_psycopg2):
    """psycopg2 dialect that leaves the transaction and life of the DBAPI connection to its owner."""

    execution_ctx_cls = _LentExecutionContext
    # The statements compile exactly as for the stock dialect, so caching is safe
    # (SQLAlchemy reads this flag from each dialect class itself).
    supports_statement_cache = True

    def get_isolation_level(self, dbapi_connection: Any) -> IsolationLevel:
        # Read once at first connect, through the caller's connection: ask for a
        # plain cursor, as its default cursor may return dict rows.
        with dbapi_connection.cursor(cursor_factory=psycopg2.extensions.cursor) as cursor:
            cursor.execute("show transaction isolation level")
            # The server names one of SQLAlchemy's levels (AUTOCOMMIT is never a server's).
            return cast(IsolationLevel, str(cursor.fetchone()[0]).upper())


def _own_psycopg_cursor(psycopg_module: Any, connection: Any, cursor_class: Any = None) -> Any:
    """A psycopg 3 cursor on ``connection`` that reads rows and types our way, and changes nothing else.

    ``cursor_class`` is ``psycopg.Cursor`` unless given (``psycopg.AsyncCursor`` for an AsyncConnection).
    """
    from psycopg.types.datetime import TimestamptzBinaryLoader, TimestamptzLoader
    from psycopg.types.json import set_json_dumps, set_json_loads
    from psycopg.types.uuid import UUIDBinaryLoader, UUIDLoader

    # The cursor class is named, not taken from the connection's cursor_factory
    # (Django's is a client-side-binding cursor), and rows are tuples whatever
    # row_factory the caller set (dict_row...): SQLAlchemy reads rows as tuples.
    cursor = (cursor_class or psycopg_module.Cursor)(connection, row_factory=psycopg_module.rows.tuple_row)
    # A cursor copies the connection's adapters on write, so these loaders are
    # ours alone: Django loads jsonb as text and timestamptz in its own time zone
    # (naive with USE_TZ = False) on its connection, and that stays so for it.
    adapters = cursor.adapters
    adapters.register_loader("uuid", UUIDLoader)
    adapters.register_loader("uuid", UUIDBinaryLoader)
    adapters.register_loader("timestamptz", TimestamptzLoader)
    adapters.register_loader("timestamptz", TimestamptzBinaryLoader)
    set_json_loads(json.loads, cursor)
    set_json_dumps(json.dumps, cursor)
    return cursor


class _LentPsycopgExecutionContext(PGExecutionContext_psycopg):
    def create_default_cursor(self) -> Any:
        return _own_psycopg_cursor(self.dialect.dbapi, self._dbapi_connection.driver_connection)


class LentPsycopgConnectionDialect(_LeavesTheConnectionToItsOwner, PGDialect_psycopg):
    """psycopg 3 dialect that leaves the transaction and life of the DBAPI connection to its owner."""

    execution_ctx_cls = _LentPsycopgExecutionContext
    # The statements compile exactly as for the stock dialect, so caching is safe
    # (SQLAlchemy reads this flag from each dialect class itself).
    supports_statement_cache = True

    def get_isolation_level(self, dbapi_connection: Any) -> IsolationLevel:
        # Read once at first connect. The stock dialect rolls back afterwards when
        # the connection was idle; a lent one is left as the statement leaves it.
        with _own_psycopg_cursor(self.dbapi, dbapi_connection) as cursor:
            cursor.execute("show transaction isolation level")
            # The server names one of SQLAlchemy's levels (AUTOCOMMIT is never a server's).
            return cast(IsolationLevel, str(cursor.fetchone()[0]).upper())


class _LentPool(NullPool):
    """Hands out the connection lent for the current call and forgets it on return."""

    def _do_return_conn(self, record: Any) -> None:
        pass


dialect_registry.register(f"postgresql.{_PSYCOPG2_DIALECT}", __name__, "LentConnectionDialect")
dialect_registry.register(f"postgresql.{_PSYCOPG_DIALECT}", __name__, "LentPsycopgConnectionDialect")

_lent: ContextVar[Optional[Any]] = ContextVar("runledger_lent_connection", default=None)
_engine_lock = threading.Lock()
_lent_engines: dict[str, Engine] = {}


def _borrowed() -> Any:
    connection = _lent.get()
    if connection is None:  # pragma: no cover - only reachable by misuse of the private engines
        raise RuntimeError("no DBAPI connection is lent to the runledger engine")
    return connection


#: How an engine that runs our statements on a caller's connection is built (sync or async):
#: a pool that never resets, closes or keeps the lent connection.
LENT_ENGINE_OPTIONS: dict[str, Any] = {
    "poolclass": _LentPool,
    "pool_reset_on_return": None,
    # Looking up hstore can roll back an idle connection.
    "use_native_hstore": False,
}


def _engine_for_lent_connections(dialect_name: str = _PSYCOPG2_DIALECT) -> Engine:
    # One engine per driver and process: its compiled-statement cache is what
    # keeps the store's statements from being recompiled on every call.
    with _engine_lock:
        engine = _lent_engines.get(dialect_name)
        if engine is None:
            engine = _lent_engines[dialect_name] = sqlalchemy.create_engine(
                f"postgresql+{dialect_name}://", creator=_borrowed, **LENT_ENGINE_OPTIONS)
        return engine


def _is_psycopg3_connection(bind: Any) -> bool:
    # Without psycopg in sys.modules, nothing can be one of its connections, and
    # an app without psycopg 3 never imports it through us.
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(bind, psycopg.Connection)


def is_lent(connection: Connection) -> bool:
    """True when ``connection`` wraps a caller's raw psycopg2 or psycopg 3 connection."""
    return isinstance(connection.dialect, _LeavesTheConnectionToItsOwner)


@contextmanager
def _lent_connection(bind: Any, dialect_name: str) -> Iterator[Connection]:
    token = _lent.set(bind)
    try:
        connection = _engine_for_lent_connections(dialect_name).connect()
    finally:
        _lent.reset(token)
    with connection:
        yield connection


@contextmanager
def joined_connection(bind: Any) -> Iterator[Connection]:
    """Yield a Connection whose statements run in the caller's transaction.

    Raises:
        InvalidArgument: ``bind`` is none of the accepted kinds, or a closed
            psycopg connection (an Engine is handled by the caller, which owns
            that transaction).
    """
    if isinstance(bind, Connection):
        yield bind
    elif isinstance(bind, (Session, scoped_session)):
        yield bind.connection()
    elif isinstance(bind, psycopg2.extensions.connection):
        if bind.closed:
            raise InvalidArgument("bind", "a closed psycopg2 connection", "an open connection")
        with _lent_connection(bind, _PSYCOPG2_DIALECT) as connection:
            yield connection
    elif _is_psycopg3_connection(bind):
        if bind.closed:
            raise InvalidArgument("bind", "a closed psycopg connection", "an open connection")
        with _lent_connection(bind, _PSYCOPG_DIALECT) as connection:
            yield connection
    else:
        raise InvalidArgument("bind", type(bind).__name__, BIND_DESCRIPTION)
