"""Batch commands: ``batches list | show``."""

from __future__ import annotations

import argparse
import json
from uuid import UUID

import runledger_sync as rl
from runledger_sync.cli._core import EXIT_OK, PROG, command, command_group, open_engine
from runledger_sync.cli._output import add_json_option, print_json, print_table, printable, when

command_group("batches", help="list batches and show one with its progress and members")

BATCH_TABLE_COLUMNS = ("id", "status", "total", "pending", "succeeded", "failed", "canceled", "created", "finished")
MEMBER_TABLE_COLUMNS = ("job", "type", "status", "finished")
RUN_TABLE_COLUMNS = ("run", "workflow", "status", "finished")
#: Members printed by ``batches show`` (the first added); ``--members`` changes it.
DEFAULT_MEMBERS_SHOWN = 20


def parse_batch_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        error = rl.InvalidArgument("BATCH_ID", text, "a batch id (a UUID such as 0190c6c2-5f1e-7000-8000-000000000000)")
        error.hint = f"copy the id from `{PROG} batches list`"  # type: ignore[attr-defined]
        raise error from None


def _list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--status", type=str.upper, choices=[status.value for status in rl.BatchStatus])
    parser.add_argument("--limit", type=int, default=100, metavar="N", help="most rows to print (default 100)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per batch (JSON lines)")


@command("batches list", help="list batches, newest first, with their counts", arguments=_list_arguments)
def _batches_list(args: argparse.Namespace) -> int:
    with open_engine(args) as engine:
        batches = rl.list_batches(engine, status=args.status, limit=args.limit)
    if args.json:
        for batch in batches:
            print_json(batch)
        return EXIT_OK
    print_table(BATCH_TABLE_COLUMNS, [
        (batch.id, batch.status.value, batch.total, batch.pending, batch.succeeded, batch.failed, batch.canceled,
         when(batch.created_at), when(batch.finished_at)) for batch in batches])
    return EXIT_OK


def _show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("batch_id", metavar="BATCH_ID", help="the batch's id (a UUID)")
    parser.add_argument("--members", type=int, default=DEFAULT_MEMBERS_SHOWN, metavar="N",
                        help=f"members to list, the first added (default {DEFAULT_MEMBERS_SHOWN})")
    add_json_option(parser, "the batch")


def progress(batch: rl.BatchRecord) -> str:
    """``7/10 ended (70%)``: the members that ended, of all added."""
    share = f" ({batch.ended * 100 // batch.total}%)" if batch.total else ""
    return f"{batch.ended}/{batch.total} ended{share}"


@command("batches show", help="print one batch: its status, counts, callbacks and first members",
         arguments=_show_arguments)
def _batches_show(args: argparse.Namespace) -> int:
    batch_id = parse_batch_id(args.batch_id)
    with open_engine(args) as engine:
        batch = rl.get_batch(engine, batch_id)
        if batch is None:
            raise rl.BatchNotFound(f"batch {batch_id} was not found", batch_id=str(batch_id))
        members = rl.list_batch_members(engine, batch_id, limit=args.members) if args.members > 0 else []
        runs = rl.list_batch_runs(engine, batch_id, limit=args.members) if args.members > 0 and batch.runs else []
    if args.json:
        print_json(batch)
        return EXIT_OK
    for label, value in (
        ("id", batch.id), ("status", batch.status.value), ("progress", progress(batch)),
        ("counts", f"pending {batch.pending}, succeeded {batch.succeeded}, failed {batch.failed}, "
                   f"canceled {batch.canceled}"),
        ("runs", f"{batch.runs} of the members are workflow runs" if batch.runs else None),
        ("on_success", _callback(batch.on_success, batch.on_success_job_id)),
        ("on_complete", _callback(batch.on_complete, batch.on_complete_job_id)),
        ("reason", batch.status_reason), ("created", when(batch.created_at)), ("closed", when(batch.closed_at)),
        ("finished", when(batch.finished_at)), ("meta", json.dumps(dict(batch.meta), sort_keys=True) if batch.meta else None),
    ):
        print(f"{label + ':':<13} {printable(value)}")
    if members:
        print(f"\nmembers (first {len(members)} of {batch.total - batch.runs}):")
        print_table(MEMBER_TABLE_COLUMNS, [(job.id, job.job_type, job.status.value, when(job.finished_at))
                                           for job in members])
    if runs:
        print(f"\nmember runs (first {len(runs)} of {batch.runs}):")
        print_table(RUN_TABLE_COLUMNS, [(run.id, run.name, run.status.value, when(run.finished_at)) for run in runs])
    return EXIT_OK


def _callback(callback: rl.BatchCallback | None, job_id: UUID | None) -> str | None:
    if callback is None:
        return None
    return callback.job_type + ("" if job_id is None else f" (job {job_id})")
