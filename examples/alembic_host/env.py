"""Alembic environment of an application whose history includes runledger-sync's.

alembic.ini lists runledger's versions directory beside the application's own,
so one ``alembic_version`` table tracks both histories, and the application's
first revision builds on runledger's head: ``alembic upgrade head`` runs ours
first, then the application's. ``process_revision_directives`` writes every new
revision into this project's versions directory (Alembic would put the first
one next to runledger's head, inside the installed package). ``check_runledger``
refuses a history that lacks runledger's versions rather than upgrade quietly
without them. ``upgrade --sql`` writes runledger's DDL too.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

import sqlalchemy as sa
from alembic import context
from sqlalchemy import engine_from_config, pool

from runledger_sync.db.alembic_host import check_runledger, include_object, process_revision_directives

config = context.config

#: Your models' MetaData, for autogenerate. ``job_queue`` is a stub of
#: runledger's table, only so the foreign key below has a target;
#: ``include_object`` keeps it and every other runledger table out of the
#: comparison, so autogenerate neither creates nor drops them.
target_metadata = sa.MetaData()
sa.Table("job_queue", target_metadata, sa.Column("id", sa.UUID(), primary_key=True))
sa.Table(
    "app_orders",
    target_metadata,
    sa.Column("id", sa.BigInteger(), sa.Identity(always=False), primary_key=True),
    sa.Column("reference", sa.Text(), nullable=False, unique=True),
    sa.Column("fulfilment_job_id", sa.UUID(), sa.ForeignKey("job_queue.id", ondelete="SET NULL"), nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
)


def database_url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("APP_DATABASE_URL") or os.environ.get(
        "RUNLEDGER_DATABASE_URL")
    if not url:
        raise SystemExit("set APP_DATABASE_URL (or sqlalchemy.url in the Config) to migrate the example app")
    return url


def run_migrations_offline() -> None:
    # `alembic upgrade --sql` needs only the dialect: no connection, no URL. The named
    # paramstyle keeps a '%' in the scripts' SQL single, as psql must read it.
    context.configure(dialect_name="postgresql", dialect_opts={"paramstyle": "named"}, literal_binds=True,
                      target_metadata=target_metadata, include_object=include_object,
                      process_revision_directives=process_revision_directives)
    with context.begin_transaction():
        context.run_migrations()
        check_runledger(context)  # refuses a history without runledger's (rolled back)


def run_migrations_online() -> None:
    connectable = engine_from_config({"sqlalchemy.url": database_url()}, prefix="sqlalchemy.", poolclass=pool.NullPool)
    with connectable.connect() as connection:
        # Your own connection has no schema_translate_map, so runledger's
        # migrations create the queue tables in the search path (public).
        context.configure(connection=connection, target_metadata=target_metadata, include_object=include_object,
                          process_revision_directives=process_revision_directives)
        with context.begin_transaction():
            context.run_migrations()
            check_runledger(context)  # refuses a history without runledger's (rolled back)
    connectable.dispose()


if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)
if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
