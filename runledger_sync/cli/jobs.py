"""Job commands: ``enqueue``, ``jobs list|show|retry|replay|cancel|wait`` and ``stats`` (``jobs retry|cancel`` by filter too)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from datetime import datetime
from typing import Any, Optional
from uuid import UUID

import runledger_sync as rl
from runledger_sync.cli._core import EXIT_OK, PROG, command, command_group, open_engine
from runledger_sync.cli._filters import add_filter_options, has_filter, parse_meta, run_bulk
from runledger_sync.cli._output import add_json_option, clipped, plain, print_json, print_table, printable, when
from runledger_sync.cli._queue_view import QUEUE_COLUMNS, queue_data, queue_row

command_group("jobs", help="list, show, retry, replay, cancel and wait for jobs; cancel, retry, delete and update many by filter")

JOB_TABLE_COLUMNS = ("id", "type", "status", "attempt", "stage", "next_run_at", "last_error_code")


#: What ``JSON`` or ``--payload-file`` names to read the payload from standard input.
STDIN = "-"


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of repeated keys; the rest would be lost silently.
    value = dict(pairs)
    if len(value) != len(pairs):
        raise _DuplicateKey()
    return value


def parse_json_argument(text: str, source: str = "the JSON argument") -> Any:
    """The JSON value ``text`` holds; ``source`` names where it came from in the error."""
    # The text is the payload: errors say how long it is, never what it says.
    got = f"{len(text)} characters of text"
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey:
        raise rl.InvalidPayload(source, text, "JSON whose objects name each key once", got=got) from None
    except json.JSONDecodeError as exc:
        detail = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
        raise rl.InvalidPayload(source, text, f"valid JSON ({detail})", got=got) from None
    except RecursionError:
        raise rl.InvalidPayload(source, text, "JSON nested less deeply (arrays and objects within each other)",
                                got=got) from None
    except ValueError:
        # Python reads no int longer than its digit limit (sys.get_int_max_str_digits).
        raise rl.InvalidPayload(source, text, "JSON whose integers have at most 4300 digits", got=got) from None


def _payload_text(args: argparse.Namespace) -> tuple[str, str]:
    """The payload's JSON text and how to name its source: the argument, a file, or standard input."""
    path = args.payload_file
    if path is None and args.payload != STDIN:
        return args.payload, "the JSON argument"
    if path is None or path == STDIN:
        stream = getattr(sys.stdin, "buffer", None)
        data = stream.read() if stream is not None else sys.stdin.read().encode("utf-8", "surrogateescape")
        source = "standard input"
    else:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            raise rl.InvalidArgument("--payload-file", path,
                                     f"a readable file ({exc.strerror or type(exc).__name__})") from None
        source = "--payload-file"
    try:
        # utf-8-sig: a byte-order mark, as some editors write one, is not part of the JSON.
        return data.decode("utf-8-sig"), source
    except UnicodeDecodeError as exc:
        raise rl.InvalidPayload(source, None, "UTF-8 text",
                                got=f"a byte that is not UTF-8 at offset {exc.start}") from None


def _parse_job_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        error = rl.InvalidArgument("ID", text, "a job id (a UUID such as 0190c6c2-5f1e-7000-8000-000000000000)")
        error.hint = f"copy the id from `{PROG} jobs list`"  # type: ignore[attr-defined]
        raise error from None


def _job_row(job: Any) -> tuple[Any, ...]:
    return (job.id, job.job_type, job.status.value, f"{job.attempt}/{job.max_attempts}", job.stage_shown.value,
            when(job.next_run_at), job.last_error_code)


def _job_data(job: rl.JobRecord) -> dict[str, Any]:
    """The job as ``--json`` prints it: its fields, and the stage a finished job shows (``stage_shown``)."""
    return {**plain(job), "stage_shown": job.stage_shown.value}


def _add_job_id(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="ID", help="the job's id (a UUID)")


def _enqueue_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_type", metavar="TYPE", help="a registered job type, e.g. email.send")
    # One source or the other: the OS limits one argument to about 128 KiB, a file has no such limit.
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("payload", metavar="JSON", nargs="?",
                        help="the payload as one JSON value, e.g. '{\"to\": \"a@b.c\"}'; - reads standard input")
    source.add_argument("--payload-file", metavar="PATH",
                        help="read the payload's JSON from this file (- for standard input)")
    parser.add_argument("--priority", type=int, help="higher runs first (default: the type's default)")
    parser.add_argument("--delay-seconds", type=float, metavar="S", help="start no sooner than S seconds from now")
    parser.add_argument("--org", dest="organization_id", metavar="ORG", help="the organization the job belongs to")
    parser.add_argument("--idempotency-key", metavar="KEY",
                        help="repeating the same request with this key returns the existing job")
    parser.add_argument("--max-attempts", type=int, metavar="N", help="attempts before dead-lettering")
    parser.add_argument("--queue", metavar="NAME",
                        help="the queue to join instead of the type's own; it must exist (see `queues list`)")
    parser.add_argument("--concurrency-key", metavar="KEY",
                        help="jobs of one key run at most their queue's key_limit at a time, e.g. customer:42")
    parser.add_argument("--meta", action="append", metavar="KEY=VALUE", default=[],
                        help="metadata kept with the job (ctx.meta in the handler); repeat for more keys")
    parser.add_argument("--unique", action="store_true",
                        help="while a job of the type, org and payload (or --unique-key) is live, print its id instead")
    parser.add_argument("--unique-key", metavar="KEY", help="what makes two jobs the same instead of the payload")
    parser.add_argument("--unique-period", type=float, metavar="S", help="one job per key every S seconds")
    parser.add_argument("--debounce", metavar="KEY",
                        help="a waiting job of this key takes this payload and starts --debounce-delay from now")
    parser.add_argument("--debounce-delay", type=float, metavar="S", help="seconds to wait for the next enqueue")
    parser.add_argument("--debounce-max-delay", type=float, metavar="S",
                        help="the longest the first enqueue waits (default: --debounce-delay)")
    parser.add_argument("--batch", metavar="BATCH_ID", help="join this OPEN batch (see `batches list`)")


def _unique(args: argparse.Namespace) -> Optional[rl.Unique]:
    if not (args.unique or args.unique_key is not None or args.unique_period is not None):
        return None
    return rl.Unique(key=args.unique_key, period=args.unique_period)


def _debounce(args: argparse.Namespace) -> Optional[rl.Debounce]:
    if args.debounce is None:
        return None
    delay = args.debounce_delay
    if delay is None:
        raise rl.InvalidDebounce("--debounce-delay", None, "given with --debounce")
    return rl.Debounce(args.debounce, delay, delay if args.debounce_max_delay is None else args.debounce_max_delay)


@command("enqueue", help="add one job to the queue and print its id", arguments=_enqueue_arguments)
def _enqueue(args: argparse.Namespace) -> int:
    payload = parse_json_argument(*_payload_text(args))
    # The same size limit and event log level a worker's process has (RUNLEDGER_MAX_PAYLOAD_BYTES,
    # RUNLEDGER_EVENT_LOG), not the bare defaults.
    config = rl.JobsConfig.from_env()
    with open_engine(args) as engine:
        job = rl.enqueue(engine, args.job_type, payload, priority=args.priority, delay_seconds=args.delay_seconds,
                         organization_id=args.organization_id, idempotency_key=args.idempotency_key,
                         max_attempts=args.max_attempts, queue=args.queue, concurrency_key=args.concurrency_key,
                         max_payload_bytes=config.max_payload_bytes, event_log=config.event_log,
                         meta=parse_meta(args.meta), unique=_unique(args), debounce=_debounce(args),
                         batch=args.batch)
    print(job.id)
    return EXIT_OK


def _jobs_list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--status", type=str.upper, choices=[status.value for status in rl.JobStatus])
    parser.add_argument("--type", dest="job_type", metavar="TYPE", help="only this job type")
    parser.add_argument("--org", dest="organization_id", metavar="ORG", help="only this organization's jobs")
    parser.add_argument("--meta", action="append", metavar="KEY=VALUE",
                        help="only jobs whose metadata has this key with this value; repeat for more keys")
    parser.add_argument("--limit", type=int, default=100, metavar="N", help="most rows to print (default 100)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per job (JSON lines)")


@command("jobs list", help="list jobs, newest first", arguments=_jobs_list_arguments)
def _jobs_list(args: argparse.Namespace) -> int:
    with open_engine(args) as engine:
        jobs = rl.list_jobs(engine, status=args.status, job_type=args.job_type,
                            organization_id=args.organization_id, limit=args.limit, meta=parse_meta(args.meta))
    if args.json:
        for job in jobs:
            print_json(_job_data(job))
    else:
        print_table(JOB_TABLE_COLUMNS, [_job_row(job) for job in jobs])
    return EXIT_OK


def _jobs_show_arguments(parser: argparse.ArgumentParser) -> None:
    _add_job_id(parser)
    add_json_option(parser, "the job, its attempts and its events")



@command("jobs show", help="print one job with its attempts and events, and why it waits if it is PENDING",
         arguments=_jobs_show_arguments)
def _jobs_show(args: argparse.Namespace) -> int:
    job_id = _parse_job_id(args.job_id)
    with open_engine(args) as engine:
        job = rl.get_job(engine, job_id)
        if job is None:
            raise rl.JobNotFound(f"job {job_id} was not found", job_id=str(job_id))
        attempts, events = rl.list_attempts(engine, job_id), rl.list_events(engine, job_id)
        replays = rl.list_replays(engine, job_id)
        # Read after the job: one that has started meanwhile has no wait (None).
        wait = rl.explain_wait(engine, job_id) if job.status is rl.JobStatus.PENDING else None
    retries = rl.retry_summary(job, attempts, events)
    if args.json:
        print_json({"job": _job_data(job), "attempts": attempts, "events": events, "wait": wait,
                    "retries": plain(retries) | {"summary": str(retries)}, "replays": replays})
        return EXIT_OK
    for field in dataclasses.fields(job):
        if field.name == "disposition":
            continue  # an enqueue's answer, not the job's
        # The column keeps where a finished job stopped; --json prints both.
        value = job.stage_shown if field.name == "stage" else getattr(job, field.name)
        shown = when(value) if isinstance(value, datetime) else plain(value)
        if isinstance(shown, (dict, list)):
            shown = json.dumps(shown, sort_keys=True)
        if isinstance(shown, str):
            shown = clipped(shown)
        print(f"{field.name + ':':<20} {printable(shown)}")
        if field.name == "status" and wait is not None:
            print(f"{'waits:':<20} {wait.reason.value}: {printable(wait.message)}")
        if field.name == "max_attempts":
            print(f"{'retries:':<20} {printable(str(retries))}")
    print(f"\nattempts ({len(attempts)}):")
    print_table(("run", "attempt", "worker", "started_at", "finished_at", "outcome", "error_code", "error_type"),
                 [(a.run_number, a.attempt, a.worker_id, when(a.started_at), when(a.finished_at), _outcome(a),
                   a.error_code, a.error_type) for a in attempts])
    _print_tracebacks(attempts)
    print(f"\nevents ({len(events)}):")
    print_table(("occurred_at", "run", "attempt", "event", "stage", "payload"),
                 [(when(e.occurred_at), e.run_number, e.attempt, e.event_type, e.stage,
                   json.dumps(plain(e.payload), sort_keys=True)) for e in events])
    if replays:  # most jobs were never replayed: no empty section for them
        print(f"\nreplays ({len(replays)}):")
        print_table(REPLAY_COLUMNS, [_replay_row(replay) for replay in replays])
    return EXIT_OK


REPLAY_COLUMNS = ("created_at", "run", "actor", "key", "expected", "reason")


def _replay_row(replay: rl.JobReplay) -> tuple[Any, ...]:
    expected = " ".join(str(part) for part in (replay.expected_status, replay.expected_run_number) if part is not None)
    return (when(replay.created_at), replay.run_number, replay.actor or "-", clipped(replay.replay_key),
            expected or "-", clipped(replay.reason))


def _print_tracebacks(attempts: list[Any]) -> None:
    # Whole, line by line: a stored traceback is already cut to 8192 characters.
    for attempt in attempts:
        if attempt.traceback:
            print(f"\ntraceback of run {attempt.run_number} attempt {attempt.attempt} ({printable(attempt.error_type)}):")
            for line in attempt.traceback.splitlines():
                print(f"  {printable(line)}")


def _outcome(attempt: Any) -> str:
    # The store leaves outcome NULL for a success (spec: finished + NULL outcome);
    # only an unfinished attempt has no outcome yet.
    if attempt.finished_at is None:
        return "running"
    return attempt.outcome or "SUCCEEDED"


def _add_one_or_many(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="ID", nargs="?", help="the job's id (a UUID); or filter options instead")
    add_filter_options(parser, bulk_only=False)


def _one_or_many(args: argparse.Namespace, verb: str, *one_job_options: str) -> bool:
    """Whether the command acts on many jobs (filter options, no id); refuses a mix, or neither."""
    if args.job_id is not None:
        if has_filter(args) or args.dry_run or args.actor is not None:
            raise rl.InvalidJobFilter("ID", args.job_id, "given alone, or replaced by filter options (not both)")
        return False
    if not has_filter(args):
        error = rl.EmptyJobFilter("ID", None, "a job id, or filter options (--type, --status, --meta, ...)")
        usage = f"usage: {PROG} jobs {verb} ID, or {PROG} jobs {verb} --type TYPE --meta KEY=VALUE ... --reason WHY"
        error.hint = usage  # type: ignore[attr-defined]
        raise error
    given = [option for option in one_job_options if getattr(args, option.lstrip("-").replace("-", "_")) is not None]
    if given or args.reason is None:
        raise rl.InvalidJobFilter(given[0] if given else "--reason", None,
                                  "given with a job id only" if given else "given with filter options")
    return True


def _jobs_retry_arguments(parser: argparse.ArgumentParser) -> None:
    _add_one_or_many(parser)
    parser.add_argument("--expect-status", metavar="STATUS",
                        help="requeue only if the job is still in this status (else job.requeue_expectation_failed)")
    parser.add_argument("--expect-run", metavar="N", type=int,
                        help="requeue only if the job is still in this run (its run_number)")


@command("jobs retry", help="run a finished job again (a new run from attempt 0), or every finished job that matches",
         arguments=_jobs_retry_arguments)
def _jobs_retry(args: argparse.Namespace) -> int:
    if _one_or_many(args, "retry", "--expect-status", "--expect-run"):
        return run_bulk(args, rl.retry_jobs)
    job_id = _parse_job_id(args.job_id)
    expected_status = None if args.expect_status is None else args.expect_status.strip().upper()
    with open_engine(args) as engine:
        job = rl.requeue_job(engine, job_id, reason=args.reason, expected_status=expected_status,
                             expected_run_number=args.expect_run)
    if args.json:
        print_json(_job_data(job))
    else:
        print(f"job {job.id} requeued: {job.status.value}, run {job.run_number}")
    return EXIT_OK


def _jobs_replay_arguments(parser: argparse.ArgumentParser) -> None:
    _add_job_id(parser)
    parser.add_argument("--key", required=True, metavar="KEY",
                        help="names the replay: run again with the same key and request, it requeues nothing more")
    parser.add_argument("--reason", required=True, help="why the job runs again (recorded with the replay)")
    parser.add_argument("--actor", metavar="NAME", help="who asks (recorded with the replay)")
    parser.add_argument("--expect-status", metavar="STATUS",
                        help="replay only if the job is still in this status (else job.requeue_expectation_failed)")
    parser.add_argument("--expect-run", metavar="N", type=int,
                        help="replay only if the job is still in this run (its run_number)")
    parser.add_argument("--json", action="store_true", help="print the replay as one JSON object")


@command("jobs replay", help="run a finished job again and record who did it and why; a repeated --key replays once",
         arguments=_jobs_replay_arguments)
def _jobs_replay(args: argparse.Namespace) -> int:
    job_id = _parse_job_id(args.job_id)
    expected_status = None if args.expect_status is None else args.expect_status.strip().upper()
    with open_engine(args) as engine:
        replay = rl.replay_job(engine, job_id, replay_key=args.key, reason=args.reason, actor=args.actor,
                               expected_status=expected_status, expected_run_number=args.expect_run)
    if args.json:
        print_json(replay)
    elif replay.disposition == "existing":
        print(f"job {replay.job_id} was already replayed with this key: run {replay.run_number}, nothing requeued")
    else:
        print(f"job {replay.job_id} replayed: run {replay.run_number}")
    return EXIT_OK


@command("jobs cancel", help="cancel a PENDING or LEASED job, or every one that matches", arguments=_add_one_or_many)
def _jobs_cancel(args: argparse.Namespace) -> int:
    if _one_or_many(args, "cancel"):
        return run_bulk(args, rl.cancel_jobs)
    job_id = _parse_job_id(args.job_id)
    with open_engine(args) as engine:
        job = rl.cancel_job(engine, job_id, reason=args.reason)
    if args.json:
        print_json(_job_data(job))
    else:
        print(f"job {job.id} canceled: {printable(job.status_reason)}")
    return EXIT_OK


#: ``jobs wait``'s exit codes besides 0 (SUCCEEDED): one per way a job ends otherwise, and
#: coreutils ``timeout``'s code for a wait that ran out.
EXIT_DEAD_LETTERED = 3
EXIT_CANCELED = 4
EXIT_WAIT_TIMEOUT = 124
_EXIT_OF_END = {rl.JobStatus.SUCCEEDED: EXIT_OK, rl.JobStatus.DEAD_LETTERED: EXIT_DEAD_LETTERED,
                rl.JobStatus.CANCELED: EXIT_CANCELED}


def _jobs_wait_arguments(parser: argparse.ArgumentParser) -> None:
    _add_job_id(parser)
    parser.add_argument("--timeout", type=float, default=30.0, metavar="S",
                        help="give up after S seconds (default 30; 0 looks once)")
    add_json_option(parser, "the ended job")


@command("jobs wait", help=f"wait until a job ends and print it; exit {EXIT_OK} succeeded, {EXIT_DEAD_LETTERED} "
                           f"dead-lettered, {EXIT_CANCELED} canceled, {EXIT_WAIT_TIMEOUT} still not ended at the "
                           "timeout", arguments=_jobs_wait_arguments)
def _jobs_wait(args: argparse.Namespace) -> int:
    job_id = _parse_job_id(args.job_id)
    with open_engine(args) as engine:
        try:
            job = rl.wait_for_job(engine, job_id, timeout=args.timeout)
        except rl.JobWaitTimeout as error:
            error.exit_code = EXIT_WAIT_TIMEOUT  # type: ignore[attr-defined]
            raise
    if args.json:
        print_json(_job_data(job))
    else:
        why = f", {printable(job.last_error_code)}: {printable(clipped(job.last_error_message or ''))}" \
            if job.status is rl.JobStatus.DEAD_LETTERED else ""
        print(f"job {job.id} {job.status.value} (attempt {job.attempt}, finished {when(job.finished_at)}){why}")
    return _EXIT_OF_END[job.status]


def _stats_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--org", dest="organization_id", metavar="ORG", help="only this organization's jobs")
    parser.add_argument("--json", action="store_true", help="print the numbers as one JSON object")


@command("stats", help="print counts by status and type, the queues with their limits and waiting jobs, due and "
                       "scheduled pending jobs, and expired leases", arguments=_stats_arguments)
def _stats(args: argparse.Namespace) -> int:
    with open_engine(args) as engine:
        stats = rl.queue_stats(engine, organization_id=args.organization_id)
        loads = rl.queue_loads(engine)
    statuses = [status.value for status in rl.JobStatus]
    by_type: dict[str, dict[str, int]] = {}
    for (job_type, status), count in sorted(stats.by_type_and_status.items()):
        by_type.setdefault(job_type, dict.fromkeys(statuses, 0))[status] = count
    if args.json:
        print_json({"by_status": stats.by_status, "by_type": by_type, "due_now": stats.due_now,
                    "oldest_due_age_seconds": stats.oldest_due_age_seconds,
                    "scheduled_for_later": stats.scheduled_for_later, "next_scheduled_at": stats.next_scheduled_at,
                    # Kept for scripts written before due and scheduled jobs were told apart.
                    "oldest_pending_age_seconds": stats.oldest_due_age_seconds,
                    "expired_leases": stats.expired_leases,
                    # Every organization's: a queue's limits and counts are shared by all of them.
                    "queues": [queue_data(load) for load in loads]})
        return EXIT_OK
    print_table(("status", "count"), [(status, stats.by_status.get(status, 0)) for status in statuses])
    print()
    print_table(("type",) + tuple(statuses), [(job_type,) + tuple(counts[s] for s in statuses)
                                                for job_type, counts in by_type.items()])
    print()
    if args.organization_id is not None:
        print("queues (every organization's jobs):")
    print_table(QUEUE_COLUMNS, [queue_row(load) for load in loads])
    print()
    print(_pending_line("due now", stats.due_now, stats.oldest_due_age_seconds,
                        lambda age: f"oldest due: {age:.1f} s ago"))
    print(_pending_line("scheduled for later", stats.scheduled_for_later, stats.next_scheduled_at,
                        lambda moment: f"next at {when(moment)}"))
    print(f"expired leases: {stats.expired_leases}")
    return EXIT_OK


def _pending_line(label: str, count: int, detail: Any, words: Any) -> str:
    return f"{label}: {count}" if detail is None else f"{label}: {count}, {words(detail)}"
