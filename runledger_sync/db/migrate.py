"""Apply and check the bundled Alembic migrations.

The history keeps its own version table, ``runledger_alembic_version``, so it
never collides with a host application's Alembic history in the same database.
An application may instead include our versions in its own history; then
:func:`current_revision` finds our revision through the host's version table.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import alembic.context
import alembic.op
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import MetaData, inspect
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from runledger_sync.core.errors import InvalidArgument, RunledgerError
from runledger_sync.core.store_errors import (
    MigrationFailed,
    OfflineMigrationUnsupported,
    SchemaManagedByHost,
    SchemaMismatch,
)
from runledger_sync.db import schema_operations, schema_queues, schema_rollup, schema_schedules, schema_workflows  # noqa: F401  its tables join metadata, which the drift check compares whole
from runledger_sync.db import schema_replays  # noqa: F401  its table joins metadata too
from runledger_sync.db import schema_batches  # noqa: F401  its table joins metadata too
from runledger_sync.db.engine import schema_of
from runledger_sync.db.errors import is_transient, translate
from runledger_sync.db.schema import metadata

VERSION_TABLE = "runledger_alembic_version"
#: The host application's version table, read when ours is absent (option 2 of
#: docs/guides/alembic.md, one history); ``version_table=`` or this variable overrides it.
HOST_VERSION_TABLE = "alembic_version"
HOST_VERSION_TABLE_ENV = "RUNLEDGER_ALEMBIC_VERSION_TABLE"
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
# Alembic's ``context`` and ``op`` proxies are process-wide, so two threads may
# not run commands at once; the advisory lock in env.py only orders processes.
_ALEMBIC_LOCK = threading.Lock()


def migrations_directory() -> Path:
    """Return the Alembic script directory, ``runledger_sync/_alembic``.

    The wheel holds a copy of the repository's ``alembic/`` there (setup.cfg's
    ``package_dir``); a clone, and so an editable install, holds a symlink to it.
    One path in both means the package resource ``runledger_sync:_alembic/versions``
    that a host's ``version_locations`` lists resolves in both.
    """
    # Resolved, so the scripts' paths are the same however the package was reached.
    return (_PACKAGE_DIR / "_alembic").resolve()


def alembic_config(connection: Optional[Connection] = None, *, output_buffer: Optional[io.StringIO] = None) -> Config:
    """Return an Alembic Config for the bundled history, bound to ``connection`` if given."""
    config = Config(output_buffer=output_buffer)
    config.set_main_option("script_location", str(migrations_directory()))
    config.set_main_option("version_table", VERSION_TABLE)
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def _run(bind: Engine | Connection, action: str, revision: str) -> None:
    # First: offline, your env.py's connection is Alembic's stand-in that writes SQL, no bind.
    _refuse_inside_offline_alembic(action)
    _check_bind(bind)
    try:
        if isinstance(bind, Connection):
            _run_on(bind, action, revision)
            return
        with bind.begin() as connection:
            _run_on(connection, action, revision)
    except RunledgerError:
        raise
    except sa_exc.DBAPIError as exc:
        if is_transient(exc):
            raise translate(exc, getattr(bind, "url", None) or bind.engine.url) from exc
        raise MigrationFailed(f"{action} to {revision} failed: {translate(exc)}") from exc
    except Exception as exc:  # Alembic raises many types of its own; keep the cause
        raise MigrationFailed(f"{action} to {revision} failed: {exc}") from exc


def _run_on(connection: Connection, action: str, revision: str) -> None:
    config = alembic_config(connection)
    with _ALEMBIC_LOCK, _keeping_the_callers_alembic_proxies():
        if action == "upgrade":
            if _upgraded_elsewhere(connection, config, revision):
                return
            command.upgrade(config, revision)
        else:
            command.downgrade(config, revision)


def _refuse_inside_offline_alembic(action: str) -> None:
    """Raise when called from an Alembic command that writes SQL instead of running it.

    A host's ``alembic upgrade --sql`` runs its env.py, which calls
    :func:`migrate`; going ahead would change the database the user only meant
    to script, and the script would lack the queue's DDL.
    """
    # The EnvironmentContext of the Alembic command running now, if any (see _keeping_the_callers_alembic_proxies).
    outer = vars(alembic.context).get("_proxy")
    if outer is not None and outer.is_offline_mode():
        raise OfflineMigrationUnsupported(
            f"rl.{'migrate' if action == 'upgrade' else 'downgrade'}() runs online only, and this Alembic command "
            "is writing SQL (--sql, offline mode): the script would lack the queue's DDL. Run it without --sql, "
            "and write the queue's part with `runledger-sync migrate --sql` (rl.migration_sql()), or include "
            "runledger's versions in your own history, whose `upgrade --sql` writes them"
        )


@contextlib.contextmanager
def _keeping_the_callers_alembic_proxies() -> Iterator[None]:
    """Leave ``alembic.context`` and ``alembic.op`` as the caller's own Alembic run had them.

    Alembic binds these module-level proxies when a command starts and deletes
    them when it ends. Called from a host application's env.py (option 1 of
    docs/guides/alembic.md), our command runs inside the host's: its end
    would delete the host's proxies, and the host's own end then fails with
    ``KeyError: 'script'``. Restoring both namespaces makes the nesting safe.
    """
    saved = [(namespace, dict(namespace)) for namespace in (vars(alembic.context), vars(alembic.op))]
    try:
        yield
    finally:
        for namespace, before in saved:
            for name in set(namespace) - set(before):
                del namespace[name]
            namespace.update(before)


def _upgraded_elsewhere(connection: Connection, config: Config, revision: str) -> bool:
    """True when another Alembic history has our tables at ``revision`` already.

    Our version table is empty but our tables exist: an application's history
    created them (option 2 of docs/guides/alembic.md) and records them in its own version
    table. Upgrading through ours would create them again, so either there is
    nothing to do, or only the application's ``alembic upgrade`` may move them.

    Raises:
        SchemaManagedByHost: the tables exist and are not at ``revision``.
    """
    schema = schema_of(connection)
    # Tables first, then the version: both are committed in one transaction, so
    # a migration finishing between the two reads cannot make ours look absent.
    ours = {table.name for table in metadata.tables.values()}
    if not ours & set(inspect(connection).get_table_names(schema=schema)):
        return False
    if _own_revision(connection) is not None:
        return False
    target = ScriptDirectory.from_config(config).as_revision_number(revision)
    found = _locate(connection, None)
    if found.revision is not None and found.revision == target:
        return True
    if found.host_table:
        where = f"{found.host_table} holds {', '.join(found.host_heads)}"
        if found.revision is not None:
            where += f", runledger's schema is at {found.revision}"
        raise SchemaManagedByHost(
            f"runledger's tables are managed by your application's Alembic history ({where}); "
            f"run `alembic upgrade head` in your application to bring them to {target}"
        )
    raise SchemaManagedByHost(
        f"runledger's tables exist but neither {VERSION_TABLE} nor {_host_table(None)} records their revision; "
        "if your application's Alembic history created them, run `alembic upgrade head` there "
        f"(set {HOST_VERSION_TABLE_ENV} when its version table has another name)"
    )


def _check_bind(bind: Any) -> None:
    if not isinstance(bind, (Engine, Connection)):
        # Only the type is shown: a URL string given here would carry its password.
        raise InvalidArgument("bind", type(bind).__name__,
                              "a SQLAlchemy Engine or Connection (rl.create_engine(url) makes one)")


def migrate(bind: Engine | Connection, revision: str = "head") -> None:
    """Upgrade the queue schema to ``revision`` (default: the newest).

    Safe to run from several processes at once: the migration takes an advisory
    lock, so the others wait and then find nothing to do. Safe to call from your
    own Alembic ``env.py`` too: your command's ``alembic.context`` survives it.

    When your application's Alembic history includes ours (its version table
    records our tables, ours is empty), nothing is created: at ``revision``
    already, this returns; otherwise it raises :class:`SchemaManagedByHost`.

    Raises:
        MigrationFailed: a migration step failed; nothing of that step is kept.
        SchemaManagedByHost: your application's history manages the tables and
            they are not at ``revision``; run ``alembic upgrade head`` there.
    """
    _run(bind, "upgrade", revision)


def migration_sql(revision: str = "head", *, schema: Optional[str] = None) -> str:
    """Return the SQL script :func:`migrate` would run, written without a database.

    Alembic's offline mode: for a DBA to review and apply, or for a host
    application whose own ``alembic upgrade --sql`` cannot include ours.

    Args:
        revision: ``"head"`` (or another revision) scripts the way from an empty
            database; ``"FROM:TO"`` (``"0003:head"``) from a database at ``FROM``.
        schema: the schema the queue tables go in (it must exist); None for the search path.

    Raises:
        MigrationFailed: the revision names none of the bundled history's.
    """
    buffer = io.StringIO()
    config = alembic_config(output_buffer=buffer)
    config.attributes["schema"] = schema
    try:
        with _ALEMBIC_LOCK, _keeping_the_callers_alembic_proxies():
            command.upgrade(config, revision, sql=True)
    except Exception as exc:  # Alembic raises CommandError and its revision errors; keep the cause
        raise MigrationFailed(f"scripting upgrade to {revision} failed: {exc}") from exc
    return buffer.getvalue()


def downgrade(bind: Engine | Connection, revision: str = "base") -> None:
    """Downgrade the queue schema to ``revision`` (default: drop everything)."""
    _run(bind, "downgrade", revision)


def head_revision() -> str:
    """Return the newest revision of the bundled history."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    # Not an assert: under `python -O` it would vanish and None would pass for a revision.
    if head is None:
        raise MigrationFailed("the bundled migration history is empty")
    return head


def _host_table(version_table: Optional[str]) -> str:
    return version_table or os.environ.get(HOST_VERSION_TABLE_ENV) or HOST_VERSION_TABLE


@dataclass(frozen=True)
class _Found:
    """Where the queue schema's revision was found, and what the host table held."""

    revision: Optional[str]
    host_table: Optional[str] = None
    host_heads: tuple[str, ...] = ()
    drift: tuple[Any, ...] = ()


def _heads(connection: Connection, table: str) -> tuple[str, ...]:
    context = MigrationContext.configure(
        connection, opts={"version_table": table, "version_table_schema": schema_of(connection)}
    )
    return tuple(context.get_current_heads())


def _schema_drift(connection: Connection) -> tuple[Any, ...]:
    """Differences between runledger's tables in the database and this version's metadata.

    Only the tables of :data:`runledger_sync.db.schema.metadata` are compared, so
    the host application's own tables never count.
    """
    target, schema = metadata, schema_of(connection)
    if schema is not None:  # the tables are addressed through schema_translate_map
        target = MetaData()
        for table in metadata.tables.values():
            table.to_metadata(target, schema=schema)
    ours = {table.name for table in target.tables.values()}

    def include_name(name: Any, type_: str, parent_names: Any) -> bool:
        if type_ == "schema":
            return name == schema
        return type_ != "table" or name in ours

    context = MigrationContext.configure(
        connection,
        opts={"compare_type": True, "include_name": include_name, "include_schemas": schema is not None},
    )
    return tuple(compare_metadata(context, target))


def _own_revision(connection: Connection) -> Optional[str]:
    return MigrationContext.configure(
        connection, opts={"version_table": VERSION_TABLE, "version_table_schema": schema_of(connection)}
    ).get_current_revision()


def _locate(connection: Connection, version_table: Optional[str]) -> _Found:
    own = _own_revision(connection)
    table = _host_table(version_table)
    if own is not None or table == VERSION_TABLE:
        return _Found(own)
    heads = _heads(connection, table)
    if not heads:
        return _Found(None)
    ours = [rev for rev in _known_revisions() if rev in heads]  # newest first
    if ours:
        return _Found(ours[0], table, heads)
    drift = _schema_drift(connection)
    return _Found(None if drift else head_revision(), table, heads, drift)


def _known_revisions() -> list[str]:
    """The bundled history's revision ids, newest first."""
    return [rev.revision for rev in ScriptDirectory.from_config(alembic_config()).walk_revisions()]


def _find(bind: Engine | Connection, version_table: Optional[str]) -> _Found:
    _check_bind(bind)
    try:
        if isinstance(bind, Engine):
            with bind.connect() as connection:
                return _locate(connection, version_table)
        return _locate(bind, version_table)
    except sa_exc.DBAPIError as exc:
        raise translate(exc, bind.engine.url if isinstance(bind, Connection) else bind.url) from exc


def current_revision(bind: Engine | Connection, *, version_table: Optional[str] = None) -> Optional[str]:
    """Return the database's revision of the queue schema, or None when never migrated.

    The revision is looked up in this order:

    1. ``runledger_alembic_version``, the table :func:`migrate` writes. If it
       holds a revision, that is the answer.
    2. Otherwise the host application's version table, for an application
       whose own Alembic history includes ours (our versions directory in its
       ``version_locations``, see ``examples/alembic_host``). Its name is
       ``version_table``, else ``$RUNLEDGER_ALEMBIC_VERSION_TABLE``, else
       ``alembic_version``. An empty or missing table means None.
    3. If a head stored there is one of our revision ids (the host upgraded
       to one of ours, or our newer revision is not merged into its history
       yet), the newest such id is the answer.
    4. Otherwise only host revisions are stored, and ours are among their
       ancestors. Which of ours that implies cannot be read without
       the host's scripts, so the tables decide: if runledger's tables match
       this version's :data:`~runledger_sync.db.schema.metadata` exactly (an
       empty ``alembic.autogenerate.compare_metadata`` diff, host tables
       ignored), the answer is this version's head; if not, None.

    Rule 4 is why a host's history should build on our head (and merge our
    newer revisions in with ``alembic merge heads``): then ``alembic upgrade
    head`` brings our schema to head and the comparison passes.
    """
    return _find(bind, version_table).revision


def check_schema(bind: Engine | Connection, *, version_table: Optional[str] = None) -> None:
    """Raise unless the database is at exactly the revision this library ships.

    The revision is found as :func:`current_revision` describes, so a host
    application's ``alembic_version`` (or ``version_table``) counts too.

    Raises:
        SchemaMismatch: the database is behind (run ``runledger-sync migrate``,
            or the host's ``alembic upgrade head``) or ahead (upgrade the library).
    """
    expected = head_revision()
    found = _find(bind, version_table)
    current = found.revision
    if current == expected:
        return
    known = set(_known_revisions())
    upgrade = "`alembic upgrade head` in your application" if found.host_table else "`runledger-sync migrate`"
    if found.drift:
        state = (
            f"records only your application's revisions in {found.host_table} ({', '.join(found.host_heads)}), "
            f"and runledger's tables differ from this version's schema ({len(found.drift)} difference(s), "
            f"first: {found.drift[0]}); run {upgrade} (after `alembic merge heads` if it shows two), "
            "or upgrade the library if the database is newer"
        )
    elif current is None:
        state = "has no runledger schema; run `runledger-sync migrate`"
    elif current in known:
        state = f"is at {current}, behind {expected}; run {upgrade}"
    else:
        state = f"is at {current}, which this version of runledger-sync does not know (newer?); upgrade the library"
    raise SchemaMismatch(f"the database {state}", current=current, expected=expected)
