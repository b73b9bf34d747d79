"""Run store transactions with a retry budget for lost connections.

Given an Engine, the transaction is the store's own. Given anything the caller
holds (a Connection, an ORM Session, a psycopg 2 or 3 connection; see
:mod:`runledger_sync.store.binds`), the work joins the caller's transaction.

Only transient connection failures are retried, and only while retrying cannot
repeat a write: a failure while sending COMMIT leaves the outcome unknown, and
is reported as such, unless the work says that running it again cannot write
twice (enqueue: its job ids are chosen before the first try).

The hot path's transactions (claim, running, success) are each one query of
prepared statements. On the store's own connections they are sent without BEGIN
and COMMIT: PostgreSQL runs the statements of one query as one implicit
transaction and commits it at the end, so each costs one round trip instead of
three. A connection lost during such a query leaves its outcome unknown.

The worker's polling thread and its completer each run a transaction every few
milliseconds. Through an Engine each of those checks a connection out of the
pool, and the pool's pre-ping (kept on for the application's own queries)
spends a round trip on ``SELECT 1`` before every one. A
:class:`HeldConnection` is checked out once and reused; when it breaks, the
failed transaction is retried like any lost connection, on a new one.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, TypeGuard, TypeVar, cast

import psycopg2.extensions
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential

from runledger_sync.core.errors import RunledgerError
from runledger_sync.core.store_errors import CommitOutcomeUnknown, ConnectionFailed
from runledger_sync.db.pool_mode import policy_of
from runledger_sync.db.engine import create_engine
from runledger_sync.db.connection_loss import refused_unwritten, sqlstate_of
from runledger_sync.db.errors import is_transient, translate
from runledger_sync.store import prepared as _prepared
from runledger_sync.store.binds import Bind, is_lent, joined_connection

T = TypeVar("T")

#: Drivers whose connections switch autocommit locally, without a round trip.
_DRIVERS_WITH_AUTOCOMMIT = ("psycopg2", "psycopg")
#: How long one store call keeps retrying a lost connection before giving up.
TRANSIENT_RETRY_BUDGET_SECONDS = 2.0
TRANSIENT_RETRY_ATTEMPTS = 4


def retry_policy() -> dict[str, Any]:
    """tenacity's arguments for the tries after a first one failed with :func:`worth_retrying`.

    One policy for the sync store (``Retrying``) and its asyncio reads (``AsyncRetrying``,
    which sleeps without blocking the event loop).
    """
    return dict(
        retry=retry_if_exception(worth_retrying),
        stop=stop_after_delay(TRANSIENT_RETRY_BUDGET_SECONDS) | stop_after_attempt(TRANSIENT_RETRY_ATTEMPTS - 1),
        wait=wait_exponential(multiplier=0.05, max=0.5),
        reraise=True,
    )


class HeldConnection:
    """One thread's connection, reopened after it breaks; pass it wherever the store takes an Engine.

    Not thread-safe: each thread that writes holds its own.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        #: The engine's pool policy, looked up once rather than at each of its transactions.
        self.policy = policy_of(engine)
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

    For a readiness probe: a pool the jobs have taken whole must not read as an
    outage. Its one connection is opened on first use and kept, so a server with
    no connection slot left for newcomers still answers it; dispose of it when done.
    """
    return create_engine(
        engine.url, schema="", pool_size=1, max_overflow=0, pool_mode=policy_of(engine).mode,
        pool_timeout=timeout_seconds, connect_args={"connect_timeout": max(1, math.ceil(timeout_seconds))},
    )


def run_in_transaction(
    bind: Bind,
    work: Callable[[Connection], T],
    *,
    one_repeatable_write: bool = False,
    one_query: bool = False,
    retry: bool = True,
) -> T:
    """Run ``work`` in one transaction and return its result.

    Given an Engine (or a HeldConnection of one), the transaction is committed here, and a lost connection is
    retried within a small budget. Given a Connection, an ORM Session or a
    psycopg connection, ``work`` joins the caller's transaction and nothing is
    retried or committed: the caller owns the transaction.

    Args:
        bind: an Engine or a :class:`HeldConnection` (the store's own transaction, retried), or a
            Connection, Session or psycopg (2 or 3) connection (the caller's).
        one_repeatable_write: ``work`` writes with one statement at most, and running it
            again after a lost connection cannot write twice. On an Engine's connection
            that statement then commits by itself (autocommit), which saves the BEGIN and
            COMMIT round trips, and a connection lost mid-way is retried rather than
            reported as an unknown outcome.
        one_query: ``work`` sends everything it writes as one query (one
            :func:`~runledger_sync.store.prepared.execute_in_turn` call). Where its
            statements run prepared, that query is then the whole transaction,
            committed by the server without BEGIN or COMMIT round trips, and a
            connection lost during it raises ``CommitOutcomeUnknown``.
        retry: False for a caller with a retry policy of its own (the worker's
            completer): a lost connection is raised at once.

    Raises:
        InvalidArgument: ``bind`` is none of the accepted kinds.
    """
    if not owns_transaction(bind):
        try:
            with joined_connection(bind) as connection:
                try:
                    return work(connection)
                except sa_exc.DBAPIError as exc:
                    raise translate(exc, _url_of(connection)) from exc
        except sa_exc.DBAPIError as exc:
            # Getting the connection failed (a Session connecting lazily, say).
            raise translate(exc) from exc
    try:
        # The first try outside tenacity: building its Retrying costs about 8 us,
        # paid on every store call although nearly all of them succeed at once.
        return _once(bind, work, one_repeatable_write, one_query)
    except ConnectionFailed as exc:
        if not retry or not worth_retrying(exc):
            raise
    for attempt in Retrying(**retry_policy()):
        with attempt:
            return _once(bind, work, one_repeatable_write, one_query)
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover


def require_read_committed(connection: Connection, refusal: type[RunledgerError], what: str) -> None:
    """Raise ``refusal`` unless ``connection``'s transaction is READ COMMITTED.

    ``what`` reads a row another transaction wrote or moved meanwhile: only READ
    COMMITTED shows it the row as that transaction left it, where a higher level
    would answer with a serialization failure or an old snapshot.
    """
    level = connection.exec_driver_sql("SHOW transaction_isolation").scalar_one()
    if level != "read committed":
        raise refusal(f"{what} needs READ COMMITTED isolation, the transaction uses {level.upper()}")


def owns_transaction(bind: Any) -> TypeGuard[Engine | HeldConnection]:
    """True when the store runs (and commits) its own transaction on ``bind``, False when it joins the caller's."""
    return isinstance(bind, (Engine, HeldConnection))


def _url_of(connection: Connection) -> Any:
    # A lent psycopg connection has no URL of ours to show.
    return None if is_lent(connection) else connection.engine.url


def worth_retrying(exc: BaseException) -> bool:
    """True for a lost or refused connection, whose work a fresh connection may run again.

    An unknown commit outcome is never retried blindly: that could write twice.
    """
    return isinstance(exc, ConnectionFailed) and not isinstance(exc, CommitOutcomeUnknown)


def _once(
    source: Engine | HeldConnection, work: Callable[[Connection], T], one_repeatable_write: bool, one_query: bool,
) -> T:
    engine = source if isinstance(source, Engine) else source.engine
    try:
        checkout = source.connect()
    except sa_exc.DBAPIError as exc:
        raise translate(exc, engine.url) from exc
    with checkout as connection:
        _prepared.own(connection, policy_of(engine) if isinstance(source, Engine) else source.policy)
        implicit = one_query and _prepared.may_prepare(connection)
        autocommit = implicit or (one_repeatable_write and isinstance(source, Engine))
        # The driver's own switch: SQLAlchemy's isolation_level="AUTOCOMMIT" costs a SET
        # round trip on psycopg2 when the pool puts the level back. psycopg 2 and 3 both
        # flip it locally while no transaction is open, as just after checkout.
        if not autocommit or connection.dialect.driver not in _DRIVERS_WITH_AUTOCOMMIT:
            return _run_owned(engine, connection, work, one_repeatable_write, implicit)
        # An engine made with isolation_level="AUTOCOMMIT" is in autocommit already, and stays so.
        with _DriverAutocommit(connection, True):
            return _run_owned(engine, connection, work, one_repeatable_write, implicit)


def _run_owned(
    engine: Engine, connection: Connection, work: Callable[[Connection], T], one_repeatable_write: bool,
    implicit: bool,
) -> T:
    """Run ``work`` on the store's own connection, preparing afresh (or not at all) as the session allows."""
    if _prepared.needs_sweep(connection):
        # Its engine stopped preparing after this connection had prepared: take its
        # statements away where it can (the session its next transaction runs in).
        _sweep(engine, connection)
    for rerun in (False, True):
        try:
            return _transaction(engine, connection, work, one_repeatable_write, implicit)
        except _prepared.PreparedStatementsLost as lost:
            if rerun:
                # Gone again at once: the next transaction ran in another session.
                _prepared.stop_preparing(connection, lost)
                break
            # Nothing was written (the transaction rolled back). The session lost some
            # of them (DISCARD ALL, DEALLOCATE, a migration): drop the rest and run it
            # again, preparing afresh.
            _sweep(engine, connection)
        except _prepared.SessionsShared as shared:
            _prepared.stop_preparing(connection, shared)
            break
    # Sessions are shared with other clients: run it once more, unprepared, after
    # taking this connection's statements away from the session it now runs in.
    _sweep(engine, connection)
    if implicit:
        # Unprepared, its statements go one by one: they need an explicit transaction.
        with _DriverAutocommit(connection, False):
            return _transaction(engine, connection, work, one_repeatable_write, False)
    return _transaction(engine, connection, work, one_repeatable_write, False)


def _sweep(engine: Engine, connection: Connection) -> None:
    try:
        _prepared.sweep(connection)
    except sa_exc.DBAPIError as exc:
        connection.rollback()
        raise translate(exc, engine.url) from exc


class _DriverAutocommit:
    """The driver connection's autocommit switched to ``on`` for a block, and put back after it.

    A class rather than a generator: an enqueue on an Engine passes through it on every call.
    """

    def __init__(self, connection: Connection, on: bool) -> None:
        # Only an Engine's (or a HeldConnection's) checked-out connection comes here: psycopg2's, never None.
        self._driver_connection = cast(psycopg2.extensions.connection, connection.connection.dbapi_connection)
        self._on = on

    def __enter__(self) -> None:
        self._before = self._driver_connection.autocommit
        self._driver_connection.autocommit = self._on

    def __exit__(self, *exc_info: object) -> None:
        if not self._driver_connection.closed:
            self._driver_connection.autocommit = self._before


def _transaction(
    engine: Engine, connection: Connection, work: Callable[[Connection], T], one_repeatable_write: bool,
    implicit: bool,
) -> T:
    try:
        result = work(connection)
    except sa_exc.DBAPIError as exc:
        connection.rollback()
        _prepared.raise_if_ours(connection, exc)
        if implicit and is_transient(exc) and not refused_unwritten(sqlstate_of(exc.orig)):
            # The query was its own transaction: it may have committed before the connection went
            # (unless the server refused it, read-only after a failover: then nothing was written).
            raise CommitOutcomeUnknown(f"outcome of a one-query transaction unknown: {exc.orig}") from exc
        raise translate(exc, engine.url) from exc
    except BaseException:
        connection.rollback()
        raise
    try:
        connection.commit()
    except sa_exc.DBAPIError as exc:
        if not is_transient(exc) or one_repeatable_write:
            raise translate(exc, engine.url) from exc
        raise CommitOutcomeUnknown(f"commit outcome unknown: {exc.orig}") from exc
    return result
