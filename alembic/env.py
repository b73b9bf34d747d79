"""Alembic environment for runledger-sync's schema history.

rl.migrate() hands in a connection through ``config.attributes``; the alembic
command line builds one from RUNLEDGER_DATABASE_URL. Offline (``upgrade --sql``,
rl.migration_sql()) the script is written for the schema in
``config.attributes["schema"]``, else the search path, and needs no database.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import text
from sqlalchemy.dialects import postgresql

from runledger_sync.db import schema, schema_operations, schema_queues, schema_rollup, schema_schedules, schema_workflows  # noqa: F401  its tables join schema.metadata
from runledger_sync.db import schema_replays  # noqa: F401  its table joins metadata too
from runledger_sync.db import schema_batches  # noqa: F401  its table joins metadata too
from runledger_sync.db.engine import create_engine, schema_of

# A fixed key for pg_advisory_xact_lock so concurrent migrators queue up.
MIGRATION_LOCK_KEY = 0x52554E4C  # "RUNL"

config = context.config
target_metadata = schema.metadata
version_table = config.get_main_option("version_table") or "runledger_alembic_version"


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=version_table,
        version_table_schema=schema_of(connection),
        transaction_per_migration=False,
    )
    with context.begin_transaction():
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        context.run_migrations()


def run_migrations_offline() -> None:
    schema_name = config.attributes.get("schema")
    # The named paramstyle keeps a '%' in the functions' SQL single, as psql reads it.
    context.configure(
        dialect_name="postgresql",
        dialect_opts={"paramstyle": "named"},
        literal_binds=True,
        target_metadata=target_metadata,
        version_table=version_table,
        version_table_schema=schema_name,
        transaction_per_migration=False,
    )
    with context.begin_transaction():
        context.execute(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
        if schema_name:
            # The migrations name tables unqualified offline: the search path places them.
            context.execute(f"SET LOCAL search_path TO {postgresql.dialect().identifier_preparer.quote(schema_name)}")
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine()
    try:
        with engine.connect() as connection:
            _run(connection)
            connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
