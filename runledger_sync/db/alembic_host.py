"""Filters for your application's own Alembic ``env.py`` when runledger's tables share its database.

Autogenerate compares your ``target_metadata`` with every table it reflects.
Runledger's tables and its version table are not in your metadata, so without
a filter ``alembic revision --autogenerate`` proposes dropping them and
``alembic check`` fails. Pass one of these to ``context.configure()``::

    from runledger_sync.db.alembic_host import include_object

    context.configure(connection=connection, target_metadata=target_metadata,
                      include_object=include_object)

Both hide the same tables. :func:`include_object` also hides copies of our
tables in your own metadata (you may copy ``job_queue`` there so a foreign key
of yours has a target); :func:`include_name` skips reflecting them at all. To
combine one with a filter of your own, call both: ``include_object(...) and
mine(...)``.

When your ``version_locations`` list runledger's versions too (one history),
pass :func:`process_revision_directives` as well: Alembic writes a new revision
next to the head it builds on, and your first revision builds on ours, so
without it ``alembic revision`` writes your migration into the installed
runledger-sync package::

    context.configure(connection=connection, target_metadata=target_metadata,
                      include_object=include_object,
                      process_revision_directives=process_revision_directives)

Alembic runs env.py, and so the hook, for ``revision --autogenerate``; set
``revision_environment = true`` in alembic.ini for a plain ``revision`` too.

Two calls go inside ``context.begin_transaction()``, after ``context.run_migrations()``,
so a refusal rolls your command back with ours:

- :func:`check_runledger` (one history): Alembic finds nothing wrong in a history that
  lacks runledger's versions (``alembic upgrade head`` then only creates
  ``alembic_version``); this raises instead.
- :func:`migrate_runledger` (runledger's own version table): ``rl.migrate`` when your
  command moves the database, and nothing while you autogenerate.

Both log a warning when ``revision --autogenerate`` or ``check`` runs without a filter
that hides runledger's tables, since the revision would then drop them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from alembic.autogenerate.api import AutogenContext
from alembic.script.revision import ResolutionError, RevisionError
from alembic.util import coerce_resource_to_filename
from sqlalchemy import MetaData, Table

from runledger_sync.core.errors import ConfigError
from runledger_sync.db import schema_operations, schema_queues, schema_rollup, schema_schedules, schema_workflows  # noqa: F401  its tables join metadata, read whole below
from runledger_sync.db import schema_replays  # noqa: F401  its table joins metadata too
from runledger_sync.db import schema_batches  # noqa: F401  its table joins metadata too
from runledger_sync.db.migrate import VERSION_TABLE, check_schema, current_revision, head_revision, migrate, migrations_directory
from runledger_sync.db.schema import metadata

#: The tables runledger-sync's history creates, plus its own version table.
RUNLEDGER_TABLES = frozenset({table.name for table in metadata.tables.values()} | {VERSION_TABLE})
#: The resource naming runledger's versions, for ``version_locations`` (one history).
VERSIONS_RESOURCE = "runledger_sync:_alembic/versions"

_log = logging.getLogger(__name__)


def include_name(name: Any, type_: str, parent_names: Any) -> bool:
    """Return False for runledger's tables, so autogenerate never reflects them.

    Args:
        name: the reflected object's name.
        type_: ``"schema"``, ``"table"``, ``"column"``, ``"index"``, ...
        parent_names: Alembic's dict of the enclosing schema and table names.

    Returns:
        True for everything but a table named in :data:`RUNLEDGER_TABLES`; the
        columns, indexes and constraints of a skipped table are never compared.
    """
    return type_ != "table" or name not in RUNLEDGER_TABLES


def include_object(object_: Any, name: Any, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Return False for runledger's tables, found in the database or in your metadata.

    Args:
        object_: the SQLAlchemy object (Table, Column, Index, ...).
        name: its name.
        type_: ``"table"``, ``"column"``, ``"index"``, ``"unique_constraint"``, ...
        reflected: True when it came from the database.
        compare_to: its counterpart on the other side, or None.

    Returns:
        True for everything but a table named in :data:`RUNLEDGER_TABLES`.
    """
    return type_ != "table" or name not in RUNLEDGER_TABLES


def process_revision_directives(context: Any, revision: Any, directives: list[Any]) -> None:
    """Send a new revision to your own versions directory when Alembic would put it in ours.

    Alembic writes a revision into the directory of the head it builds on. While
    runledger's head is the only one (your first revision) or the one chosen,
    that is the installed package's directory; this hook names your first
    version location instead (the first listed that is not runledger's). A
    ``--version-path`` you give, or a head of your own, is left as Alembic has it.

    Args:
        context: Alembic's MigrationContext (``context.script`` is the project's
            ScriptDirectory).
        revision: the revision range the command was given (unused).
        directives: the MigrationScript directives about to be written; changed in place.
    """
    script = getattr(context, "script", None)
    if script is None:
        return
    ours = (migrations_directory() / "versions").resolve()
    locations = [Path(coerce_resource_to_filename(location)).resolve() for location in script.version_locations]
    yours = [location for location in locations if location != ours]
    if not yours or len(yours) == len(locations):  # our versions are not part of this history
        return
    for directive in directives:
        if directive.version_path is None and _builds_on_ours(script, directive.head, ours):
            directive.version_path = str(yours[0])


def _builds_on_ours(script: Any, head: Any, ours: Path) -> bool:
    """True when Alembic would write a revision on ``head`` next to one of our scripts, or has no directory."""
    try:
        parents = [rev for rev in script.revision_map.get_revisions(head or "head") if rev is not None]
    except RevisionError:
        return False  # several heads, or an unknown one: Alembic refuses with its own message
    # Alembic takes the first parent's directory; with none (a new base) it refuses to guess.
    return not parents or Path(parents[0].path).resolve().parent == ours


def check_runledger(context: Any) -> None:
    """Raise unless your Alembic history holds runledger's, and runledger's tables are at its head.

    For one history (runledger's versions in your ``version_locations``). Call it in
    env.py inside ``context.begin_transaction()``, after ``context.run_migrations()``,
    online and offline::

        with context.begin_transaction():
            context.run_migrations()
            check_runledger(context)

    Runledger's tables are compared with this version's only when your database
    is at your history's head (after ``alembic upgrade head``, say): below it
    (after a ``downgrade``) they may rightly be behind or absent.

    Args:
        context: ``alembic.context``, configured.

    Raises:
        ConfigError: ``config.invalid`` when your history lacks runledger's
            revisions (``version_locations`` does not list them); nothing is kept.
        SchemaMismatch: ``db.schema_mismatch`` when your database is at your head
            and runledger's tables are not at this version's; nothing is kept.
    """
    _warn_if_autogenerate_keeps_ours(context)
    script = context.script
    ours = head_revision()
    try:
        found = script.revision_map.get_revision(ours)
    except ResolutionError:
        found = None
    if found is None:
        raise ConfigError([
            f"your Alembic history does not hold runledger-sync's migrations (revision {ours} is in none of "
            f"version_locations: {', '.join(map(str, script.version_locations))}), so `alembic upgrade` would "
            f"never create its tables; list {VERSIONS_RESOURCE} in version_locations (with path_separator = newline)"
        ])
    migration_context = context.get_context()
    if context.is_offline_mode():
        return
    if set(migration_context.get_current_heads()) != set(script.get_heads()):
        return
    check_schema(migration_context.connection, version_table=migration_context.version_table)


def migrate_runledger(context: Any) -> None:
    """Upgrade runledger's tables, in their own version table, when your Alembic command moves the database.

    For runledger's own version table (its history apart from yours). Call it in
    env.py inside ``context.begin_transaction()``, after ``context.run_migrations()``::

        with context.begin_transaction():
            context.run_migrations()
            migrate_runledger(context)

    ``upgrade``, ``downgrade`` and ``stamp`` run :func:`rl.migrate
    <runledger_sync.db.migrate.migrate>` on your connection, in your transaction
    (your downgrade leaves our tables at head). Any other command, ``revision
    --autogenerate`` and ``check`` above all, creates nothing: if our tables are
    not at head it logs a warning that ``alembic upgrade head`` will migrate them.

    Args:
        context: ``alembic.context``, configured with a connection.

    Raises:
        OfflineMigrationUnsupported: ``alembic upgrade --sql``: the script
            would lack the queue's DDL (``runledger-sync migrate --sql`` writes it).
        MigrationFailed: a migration step failed (as ``rl.migrate``).
    """
    _warn_if_autogenerate_keeps_ours(context)
    migration_context = context.get_context()
    if "destination_rev" in migration_context.opts:  # set by upgrade, downgrade and stamp only
        migrate(migration_context.connection)
        return
    if context.is_offline_mode():
        return
    revision, head = current_revision(migration_context.connection, version_table=VERSION_TABLE), head_revision()
    if revision != head:
        _log.warning(
            "runledger's tables are %s; this command leaves them alone, and `alembic upgrade head` migrates them",
            "absent" if revision is None else f"at {revision}, not at this version's {head}",
            extra={"action": "alembic.runledger_not_at_head", "revision": revision},
        )


def _warn_if_autogenerate_keeps_ours(context: Any) -> None:
    """Log a warning when autogenerate compares runledger's tables: the revision would drop them.

    The configured filters are asked about each of our tables, as Alembic asks
    them, so a filter of your own that calls :func:`include_object` counts.
    """
    migration_context = context.get_context()
    revision_context = migration_context.opts.get("revision_context")
    if revision_context is None or not revision_context.command_args.get("autogenerate"):
        return
    filters = AutogenContext(migration_context, autogenerate=False)
    kept = sorted(
        name for name in RUNLEDGER_TABLES
        if filters.run_name_filters(name, "table", {"schema_name": None})
        and filters.run_object_filters(Table(name, MetaData()), name, "table", True, None)
    )
    if kept:
        _log.warning(
            "autogenerate compares runledger's tables (%d of them: %s) with your metadata, which lacks them, "
            "so the revision drops every one that exists; pass include_object=include_object "
            "(from runledger_sync.db.alembic_host import include_object) to context.configure() in env.py",
            len(kept), ", ".join(kept),
            extra={"action": "alembic.runledger_tables_not_excluded", "tables": kept},
        )
