"""Dead-letter commands: ``dead-letters list`` and ``dead-letters replay``."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from typing import Any, Optional

import runledger_sync as rl
from runledger_sync.cli._core import EXIT_OK, command, command_group, first_line, open_engine
from runledger_sync.cli._output import plain, print_json, print_table, when

command_group("dead-letters", help="list and replay dead-lettered jobs")

#: The most dead letters ``dead-letters replay --dry-run`` lists (the store's list limit).
REPLAY_LIMIT = 100_000


def _parse_since(text: Optional[str]) -> Optional[datetime]:
    """An ISO 8601 time; one without an offset is taken as UTC."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise rl.InvalidArgument("--since", text, "an ISO 8601 time such as 2026-12-01T09:00:00Z") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def _dead_letter_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--type", dest="job_type", metavar="TYPE", help="only this job type")
    parser.add_argument("--org", dest="organization_id", metavar="ORG", help="only this organization's jobs")
    parser.add_argument("--code", dest="error_code", metavar="CODE", help="only this error code (e.g. http.timeout)")
    parser.add_argument("--error-type", metavar="TYPE",
                        help="only failures that raised this exception type, as error_type shows it "
                             "(TimeoutError, myapp.errors.Declined)")
    parser.add_argument("--since", metavar="ISO8601", help="only jobs that failed at or after this time (UTC if no offset)")


def _still_dead(engine: Any, letter: Any) -> bool:
    # A dead-letter row outlives a requeue, so the job's own status tells whether
    # it is still dead (DEAD_LETTERED is left only by a requeue).
    job = rl.get_job(engine, letter.job_id)
    return job is not None and job.status is rl.JobStatus.DEAD_LETTERED


def _dead_letters_list_arguments(parser: argparse.ArgumentParser) -> None:
    _dead_letter_filters(parser)
    parser.add_argument("--limit", type=int, default=100, metavar="N", help="most rows to print (default 100)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per dead letter (JSON lines)")


@command("dead-letters list", help="list dead letters, most recent failure first", arguments=_dead_letters_list_arguments)
def _dead_letters_list(args: argparse.Namespace) -> int:
    since = _parse_since(args.since)
    with open_engine(args) as engine:
        letters = rl.list_dead_letters(engine, **_filters(args, since), limit=args.limit)
        dead = {letter.job_id for letter in letters if _still_dead(engine, letter)}
    if args.json:
        for letter in letters:
            print_json({**plain(letter), "replayed": letter.job_id not in dead})
        return EXIT_OK
    print_table(("job_id", "type", "failed_at", "attempt", "error_code", "error_type", "state", "error_message"),
                 [(d.job_id, d.job_type, when(d.failed_at), d.attempt, d.error_code, d.error_type,
                   "dead" if d.job_id in dead else "replayed", first_line(d.error_message or "")[:60])
                  for d in letters])
    return EXIT_OK


def _dead_letters_replay_arguments(parser: argparse.ArgumentParser) -> None:
    _dead_letter_filters(parser)
    parser.add_argument("--dry-run", action="store_true", help="print what would be requeued; change nothing")


@command("dead-letters replay", help="requeue every dead-lettered job that matches",
         arguments=_dead_letters_replay_arguments)
def _dead_letters_replay(args: argparse.Namespace) -> int:
    since = _parse_since(args.since)
    with open_engine(args) as engine:
        if args.dry_run:
            letters = rl.list_dead_letters(engine, **_filters(args, since), limit=REPLAY_LIMIT)
            targets = [letter.job_id for letter in letters if _still_dead(engine, letter)]
            for job_id in targets:
                print(f"would requeue {job_id}")
            print(f"{len(targets)} dead-lettered job(s) would be requeued (dry run)")
            return EXIT_OK
        # A batch per transaction: a replay of thousands holds no lock for long.
        replayed = rl.replay_dead_letters(engine, **_filters(args, since))
    print(f"requeued {replayed} dead-lettered job(s)")
    return EXIT_OK


def _filters(args: argparse.Namespace, since: Optional[datetime]) -> dict[str, Any]:
    return {"job_type": args.job_type, "organization_id": args.organization_id, "error_code": args.error_code,
            "error_type": args.error_type, "since": since}
