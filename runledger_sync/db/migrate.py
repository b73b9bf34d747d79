"""Apply and check the bundled Alembic migrations.

The history keeps its own version table, ``runledger_alembic_version``, so it
never collides with a host application's Alembic history in the same database.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Optional

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from runledger_sync.core.errors import MigrationFailed, RunledgerError, SchemaMismatch
from runledger_sync.db.engine import schema_of
from runledger_sync.db.errors import is_transient, translate

VERSION_TABLE = "runledger_alembic_version"
BRANCH_LABEL = "runledger"
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
# Alembic's ``context`` and ``op`` proxies are process-wide, so two threads may
# not run commands at once; the advisory lock in env.py only orders processes.
_ALEMBIC_LOCK = threading.Lock()


def migrations_directory() -> Path:
    """Return the Alembic script directory: bundled in the wheel, or the source tree's."""
    bundled = _PACKAGE_DIR / "_alembic"
    if (bundled / "env.py").is_file():
        return bundled
    return _PACKAGE_DIR.parent / "alembic"


def alembic_config(connection: Optional[Connection] = None) -> Config:
    """Return an Alembic Config for the bundled history, bound to ``connection`` if given."""
    config = Config()
    config.set_main_option("script_location", str(migrations_directory()))
    config.set_main_option("version_table", VERSION_TABLE)
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def _run(bind: Engine | Connection, action: str, revision: str) -> None:
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
    with _ALEMBIC_LOCK:
        if action == "upgrade":
            command.upgrade(config, revision)
        else:
            command.downgrade(config, revision)


def migrate(bind: Engine | Connection, revision: str = "head") -> None:
    """Upgrade the queue schema to ``revision`` (default: the newest).

    Safe to run from several processes at once: the migration takes an advisory
    lock, so the others wait and then find nothing to do.

    Raises:
        MigrationFailed: a migration step failed; nothing of that step is kept.
    """
    _run(bind, "upgrade", revision)


def downgrade(bind: Engine | Connection, revision: str = "base") -> None:
    """Downgrade the queue schema to ``revision`` (default: drop everything)."""
    _run(bind, "downgrade", revision)


def head_revision() -> str:
    """Return the newest revision of the bundled history."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "the bundled migration history is empty"
    return head


def current_revision(bind: Engine | Connection) -> Optional[str]:
    """Return the database's revision of the queue schema, or None when never migrated."""
    try:
        if isinstance(bind, Engine):
            with bind.connect() as connection:
                return current_revision(connection)
        context = MigrationContext.configure(
            bind, opts={"version_table": VERSION_TABLE, "version_table_schema": schema_of(bind)}
        )
        return context.get_current_revision()
    except sa_exc.DBAPIError as exc:
        raise translate(exc, bind.engine.url if isinstance(bind, Connection) else bind.url) from exc


def check_schema(bind: Engine | Connection) -> None:
    """Raise unless the database is at exactly the revision this library ships.

    Raises:
        SchemaMismatch: the database is behind (run ``runledger-sync migrate``)
            or ahead (upgrade the library).
    """
    expected = head_revision()
    current = current_revision(bind)
    if current == expected:
        return
    script = ScriptDirectory.from_config(alembic_config())
    known = {rev.revision for rev in script.walk_revisions()}
    if current is None:
        state = "has no runledger schema; run `runledger-sync migrate`"
    elif current in known:
        state = f"is at {current}, behind {expected}; run `runledger-sync migrate`"
    else:
        state = f"is at {current}, which this version of runledger-sync does not know (newer?); upgrade the library"
    raise SchemaMismatch(f"the database {state}", current=current, expected=expected)
