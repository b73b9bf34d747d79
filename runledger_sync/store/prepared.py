"""Run the store's hottest statements as server-side prepared statements.

psycopg2 sends every statement as text, so PostgreSQL parses and plans the
enqueue and lifecycle statements (several kilobytes of CTEs each) on every
call; on a small batch that costs more than running them. On the store's own
psycopg2 connections (an Engine's or a HeldConnection's, never a caller's) a
:class:`PreparedStatement` is PREPAREd once per database connection and then
run with ``EXECUTE``, which skips the parsing and the planning: each statement
is planned once per connection (see :data:`PLAN_ONCE_SQL`). Values are still
bound parameters. (psycopg 3 binds values on the server and
prepares frequent statements itself.)

A caller's connection gets the plain statement: its session is not ours to
leave prepared statements in. The store marks the connections it checks out for
its own transactions with :func:`own`; whether their sessions may keep prepared
statements is the engine's :class:`~runledger_sync.db.pool_mode.ConnectionPolicy`
(pool mode ``transaction``, or ``runledger_prepared_statements=False``: never).

What the server says when a statement and its session part ways:

- 26000 ``does not exist`` (or 0A000 ``cached plan must not change result
  type`` after a migration): the session lost them (``DISCARD ALL``,
  ``DEALLOCATE``) or was changed under them. The transaction fails with
  :class:`PreparedStatementsLost`; the session's ``runledger_`` statements are
  deallocated and the transaction is run again, prepared afresh.
- 42P05 ``already exists``, or 26000 again on that run: the session is shared
  with other clients from one transaction to the next (a transaction-pooling
  proxy the engine was not told about). :class:`SessionsShared`: the engine stops
  preparing for good, says so once in a warning naming the setting, deallocates
  its statements where it can (on each of its connections, in whatever session
  the next transaction lands) and runs the transaction again unprepared.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
from typing import Any, Mapping, Optional, Sequence

import psycopg2
import psycopg2.extensions
from sqlalchemy import bindparam, column, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, CursorResult
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.sql.sqltypes import NullType

from runledger_sync.db.pool_mode import PREPARED_STATEMENTS_OPTION, SETTING_NAMES, ConnectionPolicy, policy_of
from runledger_sync.logging import get_logger

log = get_logger(__name__)

#: Engine or connection execution option; False keeps every statement plain (pool mode transaction).
OPTION = PREPARED_STATEMENTS_OPTION
#: Connection execution option set by :func:`own`: the store checked this connection out for itself;
#: it holds the engine's ConnectionPolicy.
OWNED_OPTION = "runledger_store_owned"
#: Where a database connection's info dict keeps the names it has prepared.
_INFO_KEY = "runledger_prepared"
#: invalid_sql_statement_name (the statement is gone) and feature_not_supported
#: ("cached plan must not change result type", after a migration).
_LOST_SQLSTATES = ("26000", "0A000")
#: duplicate_prepared_statement: the session holds a statement this connection never made.
_FOUND_ELSEWHERE_SQLSTATE = "42P05"
#: The session's state after a query that stopped inside a BEGIN block.
_OPEN_BLOCK = (psycopg2.extensions.TRANSACTION_STATUS_INTRANS, psycopg2.extensions.TRANSACTION_STATUS_INERROR)
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_.]*")
#: Deallocates the library's statements in the session it runs in, in one round trip
#: (so in one transaction: behind a transaction pooler, on one server connection).
#: Every name is ours (``runledger_<label>_<digest>``) and the text is constant.
_DEALLOCATE_OURS_SQL = (
    "DO $$DECLARE ours record; BEGIN "
    "FOR ours IN SELECT name FROM pg_prepared_statements WHERE name LIKE 'runledger\\_%' "
    "LOOP EXECUTE format('DEALLOCATE %I', ours.name); END LOOP; END$$"
)


class PreparedStatementsLost(Exception):
    """The server no longer holds this connection's prepared statements; the transaction is worth running again."""


class SessionsShared(Exception):
    """Prepared statements do not stay with this engine's connections; run the transaction again unprepared."""


def own(connection: Connection, policy: ConnectionPolicy) -> Connection:
    """Mark ``connection`` as checked out by the store for its own transaction, so statements may be prepared on it.

    An execution option of the connection, not of its engine: a Connection the
    caller checked out of the same engine stays the caller's. It holds the
    engine's ``policy``, which says whether they may be, now and later.
    """
    return connection.execution_options(**{OWNED_OPTION: policy})


def raise_if_ours(connection: Connection, error: sa_exc.DBAPIError) -> None:
    """Raise PreparedStatementsLost or SessionsShared when ``error`` is about this connection's prepared statements.

    Call it after rolling back: both mean nothing was written (a PREPARE or
    EXECUTE failed), so the transaction may be run again.
    """
    code = getattr(error.orig, "pgcode", None)
    # The code first: after a lost connection (no code) reading connection.info
    # would reconnect, and a refused reconnect would hide that the write's outcome is unknown.
    if code not in (_FOUND_ELSEWHERE_SQLSTATE, *_LOST_SQLSTATES) or _INFO_KEY not in connection.info:
        return
    if code == _FOUND_ELSEWHERE_SQLSTATE:
        raise SessionsShared() from error
    if code in _LOST_SQLSTATES:
        raise PreparedStatementsLost() from error


def needs_sweep(connection: Connection) -> bool:
    """True when ``connection`` prepared statements that its engine no longer wants kept."""
    policy = connection.get_execution_options().get(OWNED_OPTION)
    return _INFO_KEY in connection.info and policy is not None and not policy.prepares


def sweep(connection: Connection) -> None:
    """Deallocate the library's statements in the session this connection's next transaction runs in, and forget them.

    Raises:
        sqlalchemy.exc.DBAPIError: the statement failed (the caller maps it).
    """
    connection.info.pop(_INFO_KEY, None)
    connection.exec_driver_sql(_DEALLOCATE_OURS_SQL, execution_options={"no_parameters": True})
    connection.commit()


def stop_preparing(connection: Connection, error: BaseException) -> None:
    """Turn prepared statements off for the connection's engine, warning once per engine."""
    if policy_of(connection).mark_sessions_shared():
        cause = error.__cause__
        code = getattr(getattr(cause, "orig", None), "pgcode", None)
        log.warning(
            "prepared statements do not stay on this engine's connections (a transaction-pooling proxy such as "
            f"PgBouncer in pool_mode=transaction?); running statements unprepared from now on. Set {SETTING_NAMES}",
            extra={"sqlstate": code, "setting": "RUNLEDGER_POOL_MODE", "detail": _first_line(cause)},
        )


def _first_line(error: Optional[BaseException]) -> str:
    orig = getattr(error, "orig", error)
    lines = [line.strip() for line in str(orig).splitlines() if line.strip()]
    return lines[0] if lines else ""


class _Rendered:
    """The PREPARE and EXECUTE forms of one statement for one dialect and schema."""

    def __init__(self, label: str, statement: Any, connection: Connection, translate: Optional[dict[Any, Any]]) -> None:
        schema = {"schema_translate_map": translate, "render_schema_translate": True} if translate else {}
        compiled = statement.compile(dialect=connection.dialect, **schema)
        names: list[str] = []

        def positional(match: re.Match[str]) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        # Without parameters psycopg2 sends the text as it is: undo its %% escape.
        body = _PLACEHOLDER.sub(positional, compiled.string).replace("%%", "%")
        binds = [compiled.binds[name] for name in names]
        for bind in binds:
            if isinstance(bind.type, NullType) or bind.expanding:
                raise TypeError(f"{label}: parameter {bind.key} needs one explicit type to be prepared")
        types = ", ".join(bind.type.compile(dialect=connection.dialect) for bind in binds)
        digest = hashlib.sha1(body.encode(), usedforsecurity=False).hexdigest()[:12]
        self.name = f"runledger_{label}_{digest}"
        self.prepare_sql = f"PREPARE {self.name} ({types}) AS {body}"
        arguments: list[str] = []
        self.parameters = []
        for name, bind in zip(names, binds, strict=True):
            constant = None if bind.required else _constant_sql(bind, connection)
            if constant is not None:
                # A value the statement carries itself, written into the EXECUTE as the
                # very text psycopg2 would send for it: not bound and processed on every call.
                arguments.append(constant)
                continue
            # Any other value of the statement's own gets a name of this statement's own:
            # two statements sent together may each have a "status_1" that means different things.
            sent = name if bind.required else f"{label}__{name}"
            arguments.append(f":{sent}")
            self.parameters.append(bindparam(sent, bind.value, type_=bind.type, required=bind.required))
        self.execute_sql = f"EXECUTE {self.name} ({', '.join(arguments)})"
        self.columns = [column(c.key, c.type) for c in statement.exported_columns]


def _constant_sql(bind: BindParameter[Any], connection: Connection) -> Optional[str]:
    """The SQL text psycopg2 sends for the statement's own value ``bind``, or None to bind it as usual.

    Only a number, or a word that needs no escaping in a string literal nor in the
    text of a :func:`~sqlalchemy.text` clause (no quote, colon or percent sign), and
    only when its type leaves the value as it is.
    """
    if bind.callable is not None or bind.type.dialect_impl(connection.dialect).bind_processor(connection.dialect):
        return None
    value = bind.value
    if type(value) is int or (type(value) is float and math.isfinite(value)):
        return repr(value)
    if type(value) is str and _PLAIN_WORD.fullmatch(value):
        return f"'{value}'"
    return None


#: Sent ahead of every prepared statement (SET LOCAL: gone when our transaction ends).
#: One generic plan per connection, kept for the connection's life, so it must not
#: depend on the statistics of the moment it was made: a worker's first calls run
#: on a new database whose tables were analyzed empty, where any read looks free.
#: Without sequential scans, and with every statement reaching the growing tables
#: through the leading column of an index by a bound value or array (a join alone
#: may be planned as a walk over two whole indexes, which on empty tables looks as
#: cheap; tests/db/store/test_plans_as_tables_grow.py holds each statement to
#: that), the one plan costs the rows it touches at any size. Left
#: to choose, PostgreSQL switches to a generic plan after five runs, made with the
#: statistics of that moment. A disabled plan node counts as a huge cost, which
#: would make the statement look worth compiling with JIT: JIT is off.
PLAN_ONCE_SQL = (
    "SELECT set_config('plan_cache_mode', 'force_generic_plan', true), "
    "set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)"
)


class PreparedStatement:
    """A Core statement that runs prepared on the store's own connections and as itself elsewhere.

    Its result rows are those of the statement itself, typed by its columns. It
    must reach the growing tables by the leading column of an index: it is
    planned once per connection, on whatever the tables hold then.
    """

    def __init__(self, label: str, statement: Any) -> None:
        self.label = label
        self.statement = statement
        #: By schema translation: only psycopg2 connections get here, so nothing else varies.
        self._rendered: dict[tuple[Any, ...], _Rendered] = {}
        self._lock = threading.Lock()
        self._parameter_names: Optional[frozenset[str]] = None

    def own_parameters(self, connection: Connection, parameters: Mapping[str, Any]) -> dict[str, Any]:
        """The values of ``parameters`` this statement binds, and no others.

        Run plain, a statement that writes (even in a CTE) would take any other
        key that names a column of its table as a value to SET.
        """
        if self._parameter_names is None:
            self._parameter_names = frozenset(self.statement.compile(dialect=connection.dialect).binds)
        return {name: value for name, value in parameters.items() if name in self._parameter_names}

    def execute(self, connection: Connection, parameters: Mapping[str, Any]) -> CursorResult[Any]:
        return execute_in_turn(connection, (self,), parameters)

    def _prepared_on(self, connection: Connection) -> _Rendered:
        translate = connection.get_execution_options().get("schema_translate_map")
        key = tuple(sorted(translate.items(), key=repr)) if translate else ()
        rendered = self._rendered.get(key)
        if rendered is None:
            with self._lock:
                rendered = self._rendered.get(key)
                if rendered is None:
                    rendered = self._rendered[key] = _Rendered(self.label, self.statement, connection, translate)
        info = connection.info
        prepared: Optional[set[str]] = info.get(_INFO_KEY)
        if prepared is None:
            prepared = info[_INFO_KEY] = set()
        if rendered.name not in prepared:
            # no_parameters: psycopg2 then sends the text as it is, not as a format string.
            connection.exec_driver_sql(rendered.prepare_sql, execution_options={"no_parameters": True})
            prepared.add(rendered.name)
        return rendered


_combined: dict[tuple[Any, ...], Any] = {}


def may_prepare(connection: Connection) -> bool:
    """True when statements run prepared on ``connection``, so :func:`execute_in_turn` sends them as one query."""
    # Only psycopg2 sends statements as text with the values inlined; psycopg 3
    # binds them on the server (where EXECUTE takes no parameters) and prepares
    # statements it sees often by itself.
    policy = connection.get_execution_options().get(OWNED_OPTION)
    return policy is not None and connection.dialect.driver == "psycopg2" and policy.prepares


def execute_in_turn(
    connection: Connection, statements: Sequence[PreparedStatement], parameters: Mapping[str, Any]
) -> CursorResult[Any]:
    """Run ``statements`` one after the other with the same parameters; return the last one's result.

    Prepared, they travel in one round trip (psycopg2 sends them as one query
    and keeps the last result); otherwise each is sent on its own. Where two
    statements name the same parameter it means the same value.
    """
    return execute_transactions(connection, (statements,), parameters)


def execute_transactions(
    connection: Connection, transactions: Sequence[Sequence[PreparedStatement]], parameters: Mapping[str, Any]
) -> CursorResult[Any]:
    """Run each group of ``transactions`` as a transaction of its own, in turn; return the last statement's result.

    Prepared, they all travel in one round trip: every group but the last is
    sent between BEGIN and COMMIT, and the last is the query's own implicit
    transaction, which the server commits when the query ends. An error stops
    the query where it happens: the groups before it stay committed. Unprepared,
    each group but the last is committed here, and the caller commits the last.
    Only for the store's own transactions (:func:`~runledger_sync.store.transactions.run_in_transaction`
    on an Engine or a HeldConnection): a caller's transaction is not ours to commit.
    """
    if not may_prepare(connection):
        for index, group in enumerate(transactions):
            if index:
                connection.commit()
            for statement in group:
                result = connection.execute(statement.statement, statement.own_parameters(connection, parameters))
        return result
    rendered = [[statement._prepared_on(connection) for statement in group] for group in transactions]
    key = tuple(tuple(r.name for r in names) for names in rendered)
    combined = _combined.get(key)
    if combined is None:
        parameters_by_name: dict[str, Any] = {}
        for parameter in (p for names in rendered for r in names for p in r.parameters):
            same = parameters_by_name.setdefault(parameter.key, parameter)
            if same.value != parameter.value or type(same.type) is not type(parameter.type):
                raise TypeError(f"{key}: parameter {parameter.key} means different things in different statements")
        sent: list[str] = []
        for index, names in enumerate(rendered):
            last = index == len(rendered) - 1
            sent += ([] if last else ["BEGIN"]) + [PLAN_ONCE_SQL]
            sent += [r.execute_sql for r in names] + ([] if last else ["COMMIT"])
        combined = _combined.setdefault(key, (
            text("; ".join(sent))
            .bindparams(*parameters_by_name.values())
            .columns(*rendered[-1][-1].columns)
        ))
    if len(transactions) == 1:
        return connection.execute(combined, parameters)
    try:
        return connection.execute(combined, parameters)
    except sa_exc.DBAPIError:
        _end_failed_block(connection)
        raise


def _end_failed_block(connection: Connection) -> None:
    """Roll back a BEGIN block an error left open: the query stopped before its COMMIT.

    The driver's own rollback sends nothing on an autocommit connection, and the
    session would refuse every later statement.
    """
    if connection.invalidated:
        return
    # A psycopg2 connection: only those run several transactions in one query.
    driver_connection: Any = connection.connection.dbapi_connection
    if driver_connection is None or driver_connection.closed or driver_connection.get_transaction_status() not in _OPEN_BLOCK:
        return
    try:
        with driver_connection.cursor() as cursor:
            cursor.execute("ROLLBACK")
    except psycopg2.Error:
        # Broken meanwhile: the caller's error stands, and the connection is replaced when next used.
        connection.invalidate()
