"""Schema commands: ``migrate`` and ``check-schema``."""

from __future__ import annotations

import argparse

import runledger_sync as rl
from runledger_sync.cli._core import EXIT_OK, command, open_engine


def _migrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--revision", default="head", help="the revision to upgrade to (default: head)")


@command("migrate", help="upgrade the queue schema to the newest revision", arguments=_migrate_arguments)
def _migrate(args: argparse.Namespace) -> int:
    with open_engine(args) as engine:
        before = rl.current_revision(engine)
        rl.migrate(engine, args.revision)
        after = rl.current_revision(engine)
    if before == after:
        print(f"schema at {after} (already up to date)")
    else:
        print(f"schema at {after} (migrated from {before or 'an empty database'})")
    return EXIT_OK


@command("check-schema", help="exit 1 unless the queue schema is at the revision this version expects")
def _check_schema(args: argparse.Namespace) -> int:
    with open_engine(args) as engine:
        rl.check_schema(engine)
        revision = rl.current_revision(engine)
    print(f"schema at {revision} (up to date)")
    return EXIT_OK
