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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic.script.revision import RevisionError
from alembic.util import coerce_resource_to_filename

from runledger_sync.core.errors import ConfigError
from runledger_sync.db import schema_queues, schema_rollup, schema_schedules, schema_workflows  # noqa: F401  its tables join metadata, read whole below
from runledger_sync.db.migrate import VERSION_TABLE, migrations_directory
from runledger_sync.db.schema import metadata

#: The tables runledger-sync's history creates, plus its own version table.
RUNLEDGER_TABLES = frozenset({table.name for table in metadata.tables.values()} | {VERSION_TABLE})


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

    Raises:
        ConfigError: ``config.invalid`` when ``version_locations`` names a
            ``runledger_sync`` resource that is no directory here (an editable
            install), saying which directory to list instead.
    """
    script = getattr(context, "script", None)
    if script is None:
        return
    ours = (migrations_directory() / "versions").resolve()
    for location in script.version_locations:
        if not _names_our_package_but_no_directory(location):
            continue
        # Alembic would go on as if our history were not listed: a new base, or
        # "Multiple version locations present", neither naming the cause.
        raise ConfigError([f"version_locations lists {location!r}, which names no directory in this install "
                           "of runledger-sync (an editable install, as from a clone, has no such resource); "
                           f"list {str(ours)!r} there instead"])
    locations = [Path(coerce_resource_to_filename(location)).resolve() for location in script.version_locations]
    yours = [location for location in locations if location != ours]
    if not yours or len(yours) == len(locations):  # our versions are not part of this history
        return
    for directive in directives:
        if directive.version_path is None and _builds_on_ours(script, directive.head, ours):
            directive.version_path = str(yours[0])


def _names_our_package_but_no_directory(location: str) -> bool:
    """True for a ``runledger_sync...:path`` resource that does not resolve to a directory."""
    package, colon, _ = str(location).partition(":")
    if not colon or package.split(".")[0] != "runledger_sync":
        return False
    try:
        return not Path(coerce_resource_to_filename(location)).is_dir()
    except ImportError:  # runledger_sync._alembic is not importable from an editable install
        return True


def _builds_on_ours(script: Any, head: Any, ours: Path) -> bool:
    """True when Alembic would write a revision on ``head`` next to one of our scripts, or has no directory."""
    try:
        parents = [rev for rev in script.revision_map.get_revisions(head or "head") if rev is not None]
    except RevisionError:
        return False  # several heads, or an unknown one: Alembic refuses with its own message
    # Alembic takes the first parent's directory; with none (a new base) it refuses to guess.
    return not parents or Path(parents[0].path).resolve().parent == ours
