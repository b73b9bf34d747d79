"""``prune``: delete finished jobs and workflow runs past their retention, or count them with ``--dry-run``."""

from __future__ import annotations

import argparse
from typing import Any, Optional

import runledger_sync as rl
from runledger_sync.cli._core import EXIT_OK, command, open_engine
from runledger_sync.cli._output import print_json, print_table
from runledger_sync.core.retention import parse_duration

#: ``--status`` words -> the Retention field each sets.
KINDS = {"succeeded": "succeeded", "canceled": "canceled", "dead_lettered": "dead_lettered",
         "workflow_runs": "workflow_runs", "dashboard_rollup": "dashboard_rollup", "job_batches": "job_batches"}


def _prune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--older-than", metavar="AGE",
                        help="prune what finished longer ago than this (90s, 30m, 12h, 7d, 2w) instead of the "
                             "retention's ages")
    parser.add_argument("--status", action="append", metavar="KIND",
                        help=f"only this kind, repeatable: {', '.join(KINDS)} (default: every kind)")
    parser.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete nothing")
    parser.add_argument("--batch-size", type=str, default="1000", metavar="N",
                        help="most rows per batch, each its own short transaction (default 1000)")
    parser.add_argument("--json", action="store_true", help="print the counts as one JSON object")


def _retention(args: argparse.Namespace) -> Optional[rl.Retention]:
    """The ages to prune by: $RUNLEDGER_RETENTION's (the workers'), narrowed and changed by the options."""
    kinds = args.status or list(KINDS)
    unknown = [kind for kind in kinds if kind.strip().lower() not in KINDS]
    if unknown:
        raise rl.InvalidArgument("--status", unknown[0], f"one of {', '.join(KINDS)}")
    chosen = {KINDS[kind.strip().lower()] for kind in kinds}
    base = rl.JobsConfig.from_env().retention
    if args.older_than is not None:
        age = parse_duration("--older-than", args.older_than)
        return rl.Retention(**{field: age if field in chosen else None for field in KINDS.values()})
    if base is None:
        return None  # retention is off for the workers: nothing is past it
    return rl.Retention(**{field: getattr(base, field) if field in chosen else None for field in KINDS.values()})


def _batch_size(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        raise rl.InvalidArgument("--batch-size", text, "a whole number from 1 to 100000") from None


@command("prune", help="delete finished jobs (with their attempts, events and dead letters) and finished workflow "
                       "runs older than the retention, in short batches", arguments=_prune_arguments)
def _prune(args: argparse.Namespace) -> int:
    retention = _retention(args)
    batch_size = _batch_size(args.batch_size)
    if retention is None:
        result = rl.PruneResult(dry_run=args.dry_run)
    else:
        with open_engine(args) as engine:
            result = rl.prune(engine, retention, batch_size=batch_size, dry_run=args.dry_run)
    if args.json:
        print_json({**vars(result), "jobs": dict(result.jobs), "total_jobs": result.total_jobs,
                    "retention": None if retention is None else retention.describe()})
        return EXIT_OK
    verb = "would delete" if result.dry_run else "deleted"
    print(f"retention: {'off (RUNLEDGER_RETENTION)' if retention is None else retention.describe()}")
    print_table(("kind", verb), [
        *((f"jobs {status}", result.jobs.get(status, 0)) for status in ("SUCCEEDED", "CANCELED", "DEAD_LETTERED")),
        ("attempts", result.attempts), ("events", result.events), ("dead letters", result.dead_letters),
        ("workflow runs", result.workflow_runs), ("workflow steps", result.workflow_steps),
        ("dashboard rollup rows", result.rollup_minutes), ("job batches", result.job_batches),
    ])
    print(f"{result.batches} batches in {result.elapsed_seconds:.2f}s")
    return EXIT_OK
