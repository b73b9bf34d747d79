"""Run the store's hottest statements as server-side prepared statements.

psycopg2 sends every statement as text, so PostgreSQL parses and plans the
enqueue and lifecycle statements (several kilobytes of CTEs each) on every
call; on a small batch that costs more than running them. On the store's own
psycopg2 connections (an Engine's or a HeldConnection's, never a caller's) a
:class:`PreparedStatement` is PREPAREd once per database connection and then
run with ``EXECUTE``, which skips the parsing, and the planning too where
PostgreSQL keeps one generic plan: its own choice after five runs, or forced for
statements marked ``index_plan``, whose shape makes one plan right at any size.
Values are still bound parameters. (psycopg 3 binds values on the server and
prepares frequent statements itself.)

A caller's connection gets the plain statement: its session is not ours to
leave prepared statements in. An engine whose connections go through a
transaction-pooling proxy (PgBouncer in transaction mode), where a session's
prepared statements do not follow it, turns them off with the execution option
``runledger_prepared_statements=False``. When the server has lost them anyway
(``DISCARD ALL``, ``DEALLOCATE``), the transaction fails with
:class:`PreparedStatementsLost` and is run again, prepared afresh.
"""

from __future__ import annotations

import hashlib
import re
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator, Mapping, Optional, Sequence

from sqlalchemy import bindparam, column, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, CursorResult
from sqlalchemy.sql.sqltypes import NullType

#: Engine or connection execution option; False keeps every statement plain.
OPTION = "runledger_prepared_statements"
#: Where a database connection's info dict keeps the names it has prepared.
_INFO_KEY = "runledger_prepared"
#: invalid_sql_statement_name (the statement is gone) and feature_not_supported
#: ("cached plan must not change result type", after a migration).
_LOST_SQLSTATES = ("26000", "0A000")
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")

_owned: ContextVar[Optional[Connection]] = ContextVar("runledger_owned_connection", default=None)


class PreparedStatementsLost(Exception):
    """The server no longer holds this connection's prepared statements; the transaction is worth running again."""


@contextmanager
def owned(connection: Connection) -> Iterator[Connection]:
    """Mark ``connection`` as the store's own for the duration, so prepared statements may be left on it."""
    token = _owned.set(connection)
    try:
        yield connection
    finally:
        _owned.reset(token)


def forget_if_lost(connection: Connection, error: sa_exc.DBAPIError) -> bool:
    """True when ``error`` says the prepared statements are gone; they are then prepared again on next use."""
    orig = error.orig
    if getattr(orig, "pgcode", None) not in _LOST_SQLSTATES or _INFO_KEY not in connection.info:
        return False
    connection.info.pop(_INFO_KEY, None)
    return True


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
        # A value the statement carries itself (a literal SQLAlchemy bound) gets a name
        # of this statement's own: two statements sent together may each have a
        # "status_1" that means different things.
        sent_names = [name if b.required else f"{label}__{name}" for name, b in zip(names, binds, strict=True)]
        self.execute_sql = f"EXECUTE {self.name} ({', '.join(f':{name}' for name in sent_names)})"
        self.parameters = [
            bindparam(name, b.value, type_=b.type, required=b.required) for name, b in zip(sent_names, binds, strict=True)
        ]
        self.columns = [column(c.key, c.type) for c in statement.exported_columns]


#: Sent ahead of statements planned once (SET LOCAL: gone when our transaction ends).
#: A plan kept for a connection's life must not depend on the statistics of the
#: moment it was made: on a near-empty table PostgreSQL would read the table whole
#: rather than look rows up, and keep doing so as the table grows. Without
#: sequential scans, and with every table reached by an indexed key, the plan costs
#: the rows it touches at any size. A disabled plan node counts as a huge cost,
#: which would make the statement look worth compiling with JIT: JIT is off.
_INDEX_PLAN_SQL = (
    "SELECT set_config('plan_cache_mode', 'force_generic_plan', true), "
    "set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)"
)


class PreparedStatement:
    """A Core statement that runs prepared on the store's own connections and as itself elsewhere.

    Its result rows are those of the statement itself, typed by its columns.

    Args:
        index_plan: plan it once per connection, without sequential scans. For
            statements that reach every table they read through an indexed key
            (``id = ANY(...)``, no condition any other index could serve), whose
            best plan then depends neither on their values nor on the tables' size,
            and which PostgreSQL's own choice can leave planning afresh on every call.
    """

    def __init__(self, label: str, statement: Any, *, index_plan: bool = False) -> None:
        self.label = label
        self.statement = statement
        self.index_plan = index_plan
        #: By schema translation: only psycopg2 connections get here, so nothing else varies.
        self._rendered: dict[tuple[Any, ...], _Rendered] = {}
        self._lock = threading.Lock()

    def execute(self, connection: Connection, parameters: Mapping[str, Any]) -> CursorResult[Any]:
        return execute_in_turn(connection, (self,), parameters)

    def _prepared_on(self, connection: Connection) -> _Rendered:
        translate = connection.get_execution_options().get("schema_translate_map")
        key = tuple(sorted((translate or {}).items(), key=repr))
        rendered = self._rendered.get(key)
        if rendered is None:
            with self._lock:
                rendered = self._rendered.get(key)
                if rendered is None:
                    rendered = self._rendered[key] = _Rendered(self.label, self.statement, connection, translate)
        prepared: set[str] = connection.info.setdefault(_INFO_KEY, set())
        if rendered.name not in prepared:
            # no_parameters: psycopg2 then sends the text as it is, not as a format string.
            connection.exec_driver_sql(rendered.prepare_sql, execution_options={"no_parameters": True})
            prepared.add(rendered.name)
        return rendered


_combined: dict[tuple[Any, ...], Any] = {}


def _may_prepare(connection: Connection) -> bool:
    # Only psycopg2 sends statements as text with the values inlined; psycopg 3
    # binds them on the server (where EXECUTE takes no parameters) and prepares
    # statements it sees often by itself.
    return (
        _owned.get() is connection
        and connection.dialect.driver == "psycopg2"
        and connection.get_execution_options().get(OPTION, True)
    )


def execute_in_turn(
    connection: Connection, statements: Sequence[PreparedStatement], parameters: Mapping[str, Any]
) -> CursorResult[Any]:
    """Run ``statements`` one after the other with the same parameters; return the last one's result.

    Prepared, they travel in one round trip (psycopg2 sends them as one query
    and keeps the last result); otherwise each is sent on its own. Where two
    statements name the same parameter it means the same value.
    """
    if not _may_prepare(connection):
        for statement in statements[:-1]:
            connection.execute(statement.statement, parameters)
        return connection.execute(statements[-1].statement, parameters)
    rendered = [statement._prepared_on(connection) for statement in statements]
    index_plan = any(statement.index_plan for statement in statements)
    key = (index_plan, *(r.name for r in rendered))
    combined = _combined.get(key)
    if combined is None:
        parameters_by_name: dict[str, Any] = {}
        for parameter in (p for r in rendered for p in r.parameters):
            same = parameters_by_name.setdefault(parameter.key, parameter)
            if same.value != parameter.value or type(same.type) is not type(parameter.type):
                raise TypeError(f"{key}: parameter {parameter.key} means different things in different statements")
        sent = ([_INDEX_PLAN_SQL] if index_plan else []) + [r.execute_sql for r in rendered]
        combined = _combined.setdefault(key, (
            text("; ".join(sent))
            .bindparams(*parameters_by_name.values())
            .columns(*rendered[-1].columns)
        ))
    return connection.execute(combined, parameters)
