"""Schema commands: ``migrate`` and ``check-schema``."""

from __future__ import annotations

import argparse
import os

import runledger_sync as rl
from runledger_sync.cli._core import EXIT_OK, command, load_app_registry, open_engine


def _migrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--revision", default="head", help="the revision to upgrade to (default: head)")
    parser.add_argument("--app", metavar="MODULE:NAME",
                        help="also write this JobRegistry's job definitions and declared schedules, "
                             "as registry.sync_definitions(engine) does, e.g. myapp.jobs:registry")
    parser.add_argument("--sql", action="store_true",
                        help="print the SQL script instead of running it; no database is needed (--revision FROM:TO "
                             "scripts the way from a database at FROM)")


@command("migrate", help="upgrade the queue schema to the newest revision (with --app, write the registry's "
                         "job definitions and schedules too)", arguments=_migrate_arguments)
def _migrate(args: argparse.Namespace) -> int:
    if args.sql:
        if args.app:
            refused = rl.ConfigError(["--sql writes a script and touches no database, so it cannot write --app's rows"])
            refused.hint = (  # type: ignore[attr-defined]
                "apply the script, then run `runledger-sync migrate --app module:registry` against the database")
            raise refused
        schema = args.schema or os.environ.get("RUNLEDGER_SCHEMA") or None  # as open_engine would take it
        print(rl.migration_sql(args.revision, schema=schema), end="")
        return EXIT_OK
    # Loaded before the database is touched, so a bad --app changes nothing.
    registry = load_app_registry(args.app) if args.app else None
    with open_engine(args) as engine:
        before = rl.current_revision(engine)
        rl.migrate(engine, args.revision)
        after = rl.current_revision(engine)
        definitions = registry.sync_definitions(engine) if registry is not None else None
    moved = "already up to date" if before == after else f"migrated from {before or 'an empty database'}"
    written = ""
    if registry is not None and definitions is not None:
        written = f"; {len(definitions)} job definition(s) and {len(registry.schedules)} schedule(s) written"
    print(f"schema at {after} ({moved}){written}")
    return EXIT_OK


@command("check-schema", help="exit 1 unless the queue schema is at the revision this version expects")
def _check_schema(args: argparse.Namespace) -> int:
    with open_engine(args) as engine:
        rl.check_schema(engine)
        revision = rl.current_revision(engine)
    print(f"schema at {revision} (up to date)")
    return EXIT_OK
