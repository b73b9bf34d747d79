"""Turn whatever the caller holds into a SQLAlchemy Connection in the caller's transaction.

Store functions accept four kinds of ``bind``:

- an ``Engine``: the store opens, commits and retries its own transaction;
- a ``Connection``: the statements join its transaction;
- an ORM ``Session`` or ``scoped_session`` (Flask-SQLAlchemy's ``db.session``):
  the statements run on ``session.connection()``, so they join the session's
  transaction;
- a raw psycopg2 connection (Django's ``connection.connection``, or what a plain
  psycopg2 app holds): the statements run on that very connection, inside its
  current transaction.

In every joined case the commit or rollback stays the caller's. A psycopg2
connection is lent to :data:`_lent_engine`, an engine whose dialect never
begins, commits, rolls back or closes a DBAPI connection and whose pool never
keeps one, so SQLAlchemy's result handling is reused without it touching the
caller's transaction. Its search_path is used as it is: ``with_schema`` only
applies to SQLAlchemy binds.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator, Optional, Union

import psycopg2.extensions
import psycopg2.extras
import sqlalchemy
from sqlalchemy.dialects import registry as dialect_registry
from sqlalchemy.dialects.postgresql.psycopg2 import PGDialect_psycopg2, PGExecutionContext_psycopg2
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session, scoped_session
from sqlalchemy.pool import NullPool

from runledger_sync.core.errors import InvalidArgument

#: What every store function accepts as its first argument.
Bind = Union[Engine, Connection, Session, scoped_session, psycopg2.extensions.connection]

BIND_DESCRIPTION = "an Engine, a Connection, an ORM Session or a psycopg2 connection"

_DIALECT_NAME = "runledger_lent"


class _LentExecutionContext(PGExecutionContext_psycopg2):
    def create_default_cursor(self) -> Any:
        # A plain cursor even when the caller's connection defaults to dict rows
        # (RealDictConnection, cursor_factory=...): SQLAlchemy reads rows as tuples.
        cursor = self._dbapi_connection.cursor(cursor_factory=psycopg2.extensions.cursor)
        # The usual dialect registers these typecasters on the connection at
        # connect time. A lent connection is not ours to change (Django makes
        # jsonb come back as text, for one), so they are scoped to our cursor.
        psycopg2.extras.register_uuid(None, cursor)
        psycopg2.extras.register_default_json(cursor, loads=json.loads)
        psycopg2.extras.register_default_jsonb(cursor, loads=json.loads)
        return cursor


class LentConnectionDialect(PGDialect_psycopg2):
    """psycopg2 dialect that leaves the transaction and life of the DBAPI connection to its owner."""

    execution_ctx_cls = _LentExecutionContext
    # The statements compile exactly as for the stock dialect, so caching is safe.
    supports_statement_cache = True

    def get_isolation_level(self, dbapi_connection: Any) -> str:
        # Read once at first connect, through the caller's connection: ask for a
        # plain cursor, as its default cursor may return dict rows.
        with dbapi_connection.cursor(cursor_factory=psycopg2.extensions.cursor) as cursor:
            cursor.execute("show transaction isolation level")
            return str(cursor.fetchone()[0]).upper()

    def on_connect(self) -> None:  # type: ignore[override]
        # No connect-time setup: it would change the caller's connection for good.
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


class _LentPool(NullPool):
    """Hands out the connection lent for the current call and forgets it on return."""

    def _do_return_conn(self, record: Any) -> None:
        pass


dialect_registry.register(f"postgresql.{_DIALECT_NAME}", __name__, "LentConnectionDialect")

_lent: ContextVar[Optional[psycopg2.extensions.connection]] = ContextVar("runledger_lent_connection", default=None)
_engine_lock = threading.Lock()
_lent_engine: Optional[Engine] = None


def _borrowed() -> psycopg2.extensions.connection:
    connection = _lent.get()
    if connection is None:  # pragma: no cover - only reachable by misuse of the private engine
        raise RuntimeError("no psycopg2 connection is lent to the runledger engine")
    return connection


def _engine_for_lent_connections() -> Engine:
    # One engine per process: its compiled-statement cache is what keeps the
    # store's statements from being recompiled on every call.
    global _lent_engine
    with _engine_lock:
        if _lent_engine is None:
            _lent_engine = sqlalchemy.create_engine(
                f"postgresql+{_DIALECT_NAME}://",
                creator=_borrowed,
                poolclass=_LentPool,
                pool_reset_on_return=None,
                # Looking up hstore can roll back an idle connection.
                use_native_hstore=False,
            )
        return _lent_engine


def is_lent(connection: Connection) -> bool:
    """True when ``connection`` wraps a caller's psycopg2 connection."""
    return isinstance(connection.dialect, LentConnectionDialect)


@contextmanager
def joined_connection(bind: Any) -> Iterator[Connection]:
    """Yield a Connection whose statements run in the caller's transaction.

    Raises:
        InvalidArgument: ``bind`` is none of the accepted kinds (an Engine is
            handled by the caller, which owns that transaction).
    """
    if isinstance(bind, Connection):
        yield bind
    elif isinstance(bind, (Session, scoped_session)):
        yield bind.connection()
    elif isinstance(bind, psycopg2.extensions.connection):
        if bind.closed:
            raise InvalidArgument("bind", "a closed psycopg2 connection", "an open connection")
        token = _lent.set(bind)
        try:
            connection = _engine_for_lent_connections().connect()
        finally:
            _lent.reset(token)
        with connection:
            yield connection
    else:
        raise InvalidArgument("bind", type(bind).__name__, BIND_DESCRIPTION)
