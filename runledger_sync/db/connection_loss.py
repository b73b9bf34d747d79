"""The one rule for which SQLSTATEs mean "this connection is done; a fresh one may succeed".

Connection exceptions (class 08), operator intervention (57P01 admin shutdown,
57P02 crash shutdown, 57P03 cannot connect now, ...) and a server that stopped
taking writes (25006 read_only_sql_transaction: a primary demoted by a failover,
or a standby reached first) all end the connection: through a multi-host URL with
``target_session_attrs=read-write`` the next one reaches the server that takes
writes. :mod:`runledger_sync.db.errors` classifies with this rule, and every
engine :func:`runledger_sync.create_engine` builds invalidates its pool by it
(:func:`end_connections_on_loss`), so no connection to a demoted primary, which
still answers the pool's pre-ping, is handed out again.
"""

from __future__ import annotations

from typing import Any, Optional

from sqlalchemy import event
from sqlalchemy.engine import Engine

_CONNECTION_LOSS_PREFIXES = ("08", "57P")
READ_ONLY_SQL_TRANSACTION = "25006"
CANNOT_CONNECT_NOW = "57P03"


def means_connection_loss(state: Optional[str]) -> bool:
    """True for a SQLSTATE after which this connection is of no more use and a fresh one may succeed."""
    return state is not None and (state.startswith(_CONNECTION_LOSS_PREFIXES) or state == READ_ONLY_SQL_TRANSACTION)


def refused_unwritten(state: Optional[str]) -> bool:
    """True for a SQLSTATE that says the statement was refused before it wrote anything.

    A read-only server rejects a write before it runs (the whole transaction rolls
    back), and 57P03 refuses the connection itself: running the work again on a
    fresh connection cannot write twice. A shutdown (57P01) may end a session whose
    commit had just landed, so its outcome stays unknown.
    """
    return state in (READ_ONLY_SQL_TRANSACTION, CANNOT_CONNECT_NOW)


def sqlstate_of(error: Any) -> Optional[str]:
    """The SQLSTATE a driver error carries: psycopg2 names it ``pgcode``, psycopg 3 ``sqlstate``."""
    return getattr(error, "pgcode", None) or getattr(error, "sqlstate", None)


def end_connections_on_loss(engine: Engine) -> None:
    """Make ``engine`` treat every connection-loss SQLSTATE as a disconnect.

    SQLAlchemy knows a dropped socket, not a server that answers "read-only": it
    would give that connection back to the pool, whose pre-ping the demoted server
    passes. Flagged as a disconnect, the connection is closed, the pool's other
    connections (opened to the same server) are replaced as they are next checked
    out, and the error reaches the store flagged ``connection_invalidated``.
    """
    event.listen(engine, "handle_error", _flag_disconnect)


def _flag_disconnect(context: Any) -> None:
    if not context.is_disconnect and means_connection_loss(sqlstate_of(context.original_exception)):
        context.is_disconnect = True
