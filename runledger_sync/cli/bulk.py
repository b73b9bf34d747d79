"""Bulk job commands and their audit trail: ``jobs delete``, ``jobs update`` and ``operations list``.

``jobs cancel`` and ``jobs retry`` act on many jobs too, given filter options
instead of an id (:mod:`runledger_sync.cli.jobs`); all four share the options of
:mod:`runledger_sync.cli._filters`.
"""

from __future__ import annotations

import argparse
import json

import runledger_sync as rl
from runledger_sync.cli._core import EXIT_OK, command, command_group, open_engine
from runledger_sync.cli._filters import add_filter_options, parse_moment, run_bulk
from runledger_sync.cli._output import print_json, print_table, when


@command("jobs delete", help="delete the finished jobs that match, with their attempts, events and dead letters",
         arguments=add_filter_options)
def _jobs_delete(args: argparse.Namespace) -> int:
    return run_bulk(args, rl.delete_jobs)


def _jobs_update_arguments(parser: argparse.ArgumentParser) -> None:
    add_filter_options(parser)
    parser.add_argument("--priority", type=int, help="the new priority (higher runs first)")
    parser.add_argument("--run-at", metavar="ISO8601", help="the new time to run (UTC if no offset; now makes them due)")


@command("jobs update", help="set the priority or time to run of the PENDING jobs that match",
         arguments=_jobs_update_arguments)
def _jobs_update(args: argparse.Namespace) -> int:
    run_at = parse_moment("--run-at", args.run_at)
    return run_bulk(args, rl.update_jobs, priority=args.priority, run_at=run_at)


command_group("operations", help="list the bulk actions taken on jobs: who, what, the filter, the counts")


def _operations_list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=100, metavar="N", help="most rows to print (default 100)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per operation (JSON lines)")


@command("operations list", help="list bulk actions, newest first (a RUNNING one whose process stopped shows its "
                                 "cursor)", arguments=_operations_list_arguments)
def _operations_list(args: argparse.Namespace) -> int:
    with open_engine(args) as engine:
        operations = rl.list_operations(engine, limit=args.limit)
    if args.json:
        for operation in operations:
            print_json(operation)
        return EXIT_OK
    print_table(("id", "started_at", "action", "actor", "status", "matched", "changed", "filter", "reason"),
                [(o.id, when(o.started_at), o.action, o.actor, o.status, o.matched, o.changed,
                  json.dumps(o.filter, sort_keys=True), o.reason) for o in operations])
    return EXIT_OK
