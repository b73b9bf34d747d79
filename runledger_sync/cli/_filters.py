"""The filter options of the bulk job commands (``jobs cancel|retry|delete|update``), and how a result is printed.

The options build one :class:`runledger_sync.JobFilter`; a bad value is refused
by it, with its code, before anything is counted or changed.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from typing import Any, Callable, Optional

import runledger_sync as rl
from runledger_sync.cli._core import EXIT_OK, open_engine
from runledger_sync.cli._output import print_json

#: The options that choose jobs; any of them given makes ``jobs cancel`` and ``jobs retry`` act on many.
FILTER_OPTIONS = ("job_types", "statuses", "queues", "meta", "organization_id", "error_code", "error_type",
                  "created_after", "created_before")


def add_filter_options(parser: argparse.ArgumentParser, *, bulk_only: bool = True) -> None:
    """The filter options, and ``--reason``, ``--actor``, ``--dry-run`` and ``--json`` of a bulk action."""
    chosen = parser.add_argument_group("which jobs (every option given must hold; repeat one for any of its values)")
    chosen.add_argument("--type", dest="job_types", action="append", metavar="TYPE", help="jobs of this type")
    chosen.add_argument("--status", dest="statuses", action="append", metavar="STATUS", type=str.upper,
                        help="jobs in this status (default: every status the action applies to)")
    chosen.add_argument("--queue", dest="queues", action="append", metavar="NAME", help="jobs in this queue")
    chosen.add_argument("--meta", action="append", metavar="KEY=VALUE",
                        help="jobs whose metadata has this key with this value")
    chosen.add_argument("--org", dest="organization_id", metavar="ORG", help="jobs of this organization")
    chosen.add_argument("--error-code", metavar="CODE", help="jobs whose last failure had this code")
    chosen.add_argument("--error-type", metavar="TYPE", help="jobs whose current attempt raised this exception type")
    chosen.add_argument("--created-after", metavar="ISO8601", help="jobs created at or after this time (UTC if no offset)")
    chosen.add_argument("--created-before", metavar="ISO8601", help="jobs created before this time (UTC if no offset)")
    reason_help = "why: kept on the operation (and on each job it cancels or retries)"
    parser.add_argument("--reason", required=bulk_only, help=reason_help if bulk_only else
                        f"{reason_help}; required with a filter")
    parser.add_argument("--actor", help="who: kept on the operation (default: your OS user and host, user@host)")
    parser.add_argument("--dry-run", action="store_true", help="count the jobs it would take; change nothing")
    parser.add_argument("--json", action="store_true", help="print the result (or the one job) as one JSON object")


def parse_moment(option: str, text: Optional[str]) -> Optional[datetime]:
    """An ISO 8601 time; one without an offset is taken as UTC."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise rl.InvalidJobFilter(option, text, "an ISO 8601 time such as 2026-12-01T09:00:00Z") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def parse_meta(pairs: Optional[list[str]]) -> Optional[dict[str, str]]:
    """``--meta KEY=VALUE`` repeated, as one mapping."""
    if not pairs:
        return None
    meta: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals:
            raise rl.InvalidMeta("--meta", None, "KEY=VALUE", got="an argument without '='")
        if key in meta:
            raise rl.InvalidMeta("--meta", None, "each key once", got=f"{key!r} twice")
        meta[key] = value
    return meta


def has_filter(args: argparse.Namespace) -> bool:
    return any(getattr(args, name, None) for name in FILTER_OPTIONS)


def job_filter(args: argparse.Namespace) -> rl.JobFilter:
    return rl.JobFilter(
        job_types=args.job_types, statuses=args.statuses, queues=args.queues, meta=parse_meta(args.meta),
        organization_id=args.organization_id, error_code=args.error_code, error_type=args.error_type,
        created_after=parse_moment("--created-after", args.created_after),
        created_before=parse_moment("--created-before", args.created_before))


def run_bulk(args: argparse.Namespace, action: Callable[..., rl.BulkResult], **changes: Any) -> int:
    """Build the filter, run ``action`` on it and print what it matched and changed."""
    chosen = job_filter(args)
    with open_engine(args) as engine:
        result = action(engine, chosen, reason=args.reason, actor=args.actor, dry_run=args.dry_run, **changes)
    if args.json:
        print_json(result)
        return EXIT_OK
    skipped = "".join(f", {count} left out ({code})" for code, count in sorted(result.skipped.items()))
    if result.dry_run:
        print(f"dry run: {result.action} would take {result.matched} job(s){skipped}; nothing changed")
    else:
        print(f"{result.action}: {result.matched} matched, {result.changed} changed{skipped} "
              f"(operation {result.operation_id})")
    return EXIT_OK
