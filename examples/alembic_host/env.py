"""Alembic environment of an application that includes runledger-sync's history.

The application's revisions live in ``versions/``; runledger's are found with
``runledger_sync.db.migrate.migrations_directory() / "versions"`` and added to
the version locations here, because alembic.ini cannot compute a path inside
an installed package. One ``alembic_version`` table then tracks both
histories: ``alembic upgrade heads`` runs ours first wherever your revision
``depends_on`` it.
"""

from __future__ import annotations

import os
from logging.config import fileConfig
from pathlib import Path

from alembic import context
from sqlalchemy import engine_from_config, pool

from runledger_sync.db.migrate import migrations_directory

config = context.config
#: Your models' MetaData, for autogenerate; this example writes its migration by hand.
target_metadata = None

RUNLEDGER_VERSIONS = migrations_directory() / "versions"


def include_runledger_history() -> None:
    """Add runledger's versions directory to this run's version locations.

    Alembic read the locations from alembic.ini before it ran this file, so
    setting the config option alone would come too late for this command:
    extend the script directory's list too. Nothing has read the revision map
    yet at this point; it is loaded when the migrations run.
    """
    script = context.script
    locations = list(script.version_locations) or [str(Path(script.dir, "versions"))]
    if str(RUNLEDGER_VERSIONS) not in locations:
        locations.append(str(RUNLEDGER_VERSIONS))
    script.version_locations = locations
    config.set_main_option("version_locations", os.pathsep.join(locations))


def database_url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("APP_DATABASE_URL") or os.environ.get(
        "RUNLEDGER_DATABASE_URL")
    if not url:
        raise SystemExit("set APP_DATABASE_URL (or sqlalchemy.url in the Config) to migrate the example app")
    return url


def run_migrations_online() -> None:
    connectable = engine_from_config({"sqlalchemy.url": database_url()}, prefix="sqlalchemy.", poolclass=pool.NullPool)
    with connectable.connect() as connection:
        # Your own connection has no schema_translate_map, so runledger's
        # migrations create the queue tables in the search path (public).
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
    connectable.dispose()


if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)
include_runledger_history()
if context.is_offline_mode():
    raise SystemExit("this example migrates online only")
run_migrations_online()
