"""The ``runledger-sync`` console script.

Each subcommand is one function registered with :func:`command`; adding one is
writing a function that takes the parsed arguments and returns an exit code
(a name with a space, ``"jobs list"``, nests under a :func:`command_group`)::

    @command("stats", help="print queue counts")
    def _stats(args: argparse.Namespace) -> int:
        with _engine(args) as engine:
            print(rl.queue_stats(engine))
        return EXIT_OK

Exit codes: 0 success, 1 the operation failed, 2 bad usage (argparse errors and
values the library rejects before touching the database: bad JSON, a bad UUID,
an out-of-range number). A failure prints
``error: <code>: <message>`` and a ``hint:`` line to stderr; the traceback only
with ``--debug``. Passwords in database URLs are never printed.

The script uses only the public ``runledger_sync`` API.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import sys
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from enum import Enum
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, TextIO
from urllib.parse import unquote, urlsplit
from uuid import UUID

import runledger_sync as rl
from runledger_sync.demo import run_demo

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

PROG = "runledger-sync"

#: One line telling the user how to fix a failure, by error code.
HINTS: dict[str, str] = {
    "config.invalid": (
        "pass --database-url postgresql://USER:PASSWORD@HOST:5432/DBNAME or set RUNLEDGER_DATABASE_URL"
    ),
    "db.connection_failed": (
        "check that PostgreSQL is running and that the URL's host, port, database, user and password are right"
    ),
    "db.schema_mismatch": (
        f"run `{PROG} migrate` when the database is behind; upgrade runledger-sync when it is ahead"
    ),
    "db.migration_failed": (
        "the database role must be allowed to CREATE in the target schema (see --schema); "
        "run again with --debug to see the cause"
    ),
    "db.permission_denied": "grant the database role the privileges this command needs, or use another role",
    "job.invalid_payload": """pass the payload as one JSON argument quoted for your shell, e.g. '{"to": "a@b.c"}'""",
    "job.invalid_argument": f"see `{PROG} COMMAND --help` for the values each option accepts",
    "job.invalid_job_type": "a job type is non-blank text of at most 255 characters, e.g. email.send",
    "job.not_found": f"list job ids with `{PROG} jobs list` (and check --org if you gave one)",
    "job.invalid_state_transition": (
        "`jobs retry` takes SUCCEEDED, DEAD_LETTERED or CANCELED jobs; `jobs cancel` takes PENDING or LEASED jobs"
    ),
    "job.definition_not_found_or_disabled": (
        "start a worker that registers this job type (it syncs the definitions), or enable the type"
    ),
    "job.idempotency_conflict": "repeat the original request exactly, or pass a new --idempotency-key",
}
DEFAULT_HINT = "run again with --debug for the full traceback"


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, its help line, its own arguments and the function that runs it."""

    name: str
    help: str
    run: Callable[[argparse.Namespace], int]
    arguments: Optional[Callable[[argparse.ArgumentParser], None]] = None


COMMANDS: dict[str, Command] = {}
#: Help lines of the command groups (``jobs``, ``dead-letters``) that nest subcommands.
GROUPS: dict[str, str] = {}


def command_group(name: str, *, help: str) -> None:
    """Declare ``name`` as a group, so commands named ``"<name> <sub>"`` nest under it."""
    GROUPS[name] = help


def command(
    name: str, *, help: str, arguments: Optional[Callable[[argparse.ArgumentParser], None]] = None
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Register the decorated function as subcommand ``name``."""

    def register(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        if name in COMMANDS:
            raise ValueError(f"command {name!r} is registered twice")
        if " " in name and name.split(" ", 1)[0] not in GROUPS:
            raise ValueError(f"command {name!r} needs command_group({name.split(' ', 1)[0]!r}) first")
        COMMANDS[name] = Command(name, help, run, arguments)
        return run

    return register


# -- the parser ------------------------------------------------------------------


def _add_global_options(parser: argparse.ArgumentParser, *, suppress_defaults: bool) -> None:
    # The same options are accepted before and after the subcommand. On the
    # subcommand's parser the defaults are suppressed, so an option given before
    # the subcommand is not reset by the subparser's default.
    default: Any = argparse.SUPPRESS if suppress_defaults else None
    parser.add_argument(
        "--database-url",
        metavar="URL",
        default=default,
        help="PostgreSQL URL (default: $RUNLEDGER_DATABASE_URL, then $DATABASE_URL)",
    )
    parser.add_argument(
        "--schema",
        metavar="NAME",
        default=default,
        help="schema holding the queue tables (default: $RUNLEDGER_SCHEMA, then the search path)",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS if suppress_defaults else False,
        help="print tracebacks and debug logs",
    )


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Durable background jobs in PostgreSQL: schema and queue administration.",
        epilog="exit codes: 0 ok, 1 operation failed, 2 bad usage",
    )
    _add_global_options(parser, suppress_defaults=False)
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    subcommands.required = True
    groups: dict[str, Any] = {}
    for entry in COMMANDS.values():
        group, _, leaf = entry.name.rpartition(" ")
        target = subcommands
        if group:
            if group not in groups:
                group_parser = subcommands.add_parser(group, help=GROUPS[group], description=GROUPS[group])
                _add_global_options(group_parser, suppress_defaults=True)
                groups[group] = group_parser.add_subparsers(
                    dest=f"{group}_command", metavar="SUBCOMMAND", title="subcommands", required=True
                )
            target = groups[group]
        sub = target.add_parser(leaf, help=entry.help, description=entry.help)
        _add_global_options(sub, suppress_defaults=True)
        if entry.arguments is not None:
            entry.arguments(sub)
        sub.set_defaults(run=entry.run)
    return parser


# -- running -----------------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the console script and return its exit code (the entry point calls sys.exit on it)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 0 for --help and 2 for bad usage
        return _exit_code(exc.code)
    if args.debug:
        rl.configure_logging(level="DEBUG", json=False)
    try:
        return int(args.run(args))
    except rl.ValidationError as exc:  # rejected before the database was touched: bad usage
        hint = getattr(exc, "hint", None) or HINTS.get(exc.code, HINTS["job.invalid_argument"])
        _report(exc.code, exc.message, hint, args)
        return EXIT_USAGE
    except rl.RunledgerError as exc:
        _report(exc.code, exc.message, HINTS.get(exc.code, DEFAULT_HINT), args)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # the console's boundary: report, never a bare traceback
        _report("internal", f"{type(exc).__name__}: {exc}", DEFAULT_HINT, args)
        return EXIT_FAILED


def _exit_code(code: Any) -> int:
    if code is None:
        return EXIT_OK
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return EXIT_USAGE


def _report(code: str, message: str, hint: str, args: argparse.Namespace, stream: Optional[TextIO] = None) -> None:
    stream = stream if stream is not None else sys.stderr
    if args.debug:
        traceback.print_exc(file=stream)
    print(f"error: {code}: {_redact(_first_line(message), args.database_url)}", file=stream)
    print(f"hint: {hint}", file=stream)


def _first_line(text: str) -> str:
    # Driver errors carry the SQL and a background link on further lines.
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


def _redact(text: str, url: Optional[str]) -> str:
    """Replace a URL given on the command line, and its password, with masked forms."""
    if not url:
        return text
    text = text.replace(url, rl.mask_url(url))
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    for secret in {password, unquote(password or "")} - {None, ""}:
        text = text.replace(secret, "***")
    return text


@contextlib.contextmanager
def _engine(args: argparse.Namespace) -> Iterator[Any]:
    """An engine for the URL and schema given (or found in the environment), disposed afterwards."""
    engine = rl.create_engine(args.database_url, schema=args.schema)
    try:
        yield engine
    finally:
        engine.dispose()


# -- commands -----------------------------------------------------------------------


def _migrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--revision", default="head", help="the revision to upgrade to (default: head)")


@command("migrate", help="upgrade the queue schema to the newest revision", arguments=_migrate_arguments)
def _migrate(args: argparse.Namespace) -> int:
    with _engine(args) as engine:
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
    with _engine(args) as engine:
        rl.check_schema(engine)
        revision = rl.current_revision(engine)
    print(f"schema at {revision} (up to date)")
    return EXIT_OK


def _worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--app", required=True, metavar="MODULE:NAME",
                        help="where your JobRegistry lives, e.g. myapp.jobs:registry (a callable returning one works too)")
    parser.add_argument("--concurrency", type=int, dest="max_global_concurrency", default=argparse.SUPPRESS,
                        help="most jobs running at once (max_global_concurrency)")
    parser.add_argument("--types", dest="job_types", default=argparse.SUPPRESS, metavar="A,B",
                        help="only run these registered job types")
    parser.add_argument("--drain-timeout", type=float, default=30.0,
                        help="seconds in-flight jobs get to finish after SIGINT/SIGTERM (default 30)")
    for field in dataclasses.fields(rl.JobsConfig):
        if field.name in ("max_global_concurrency", "job_types"):
            continue
        parser.add_argument(f"--{field.name.replace('_', '-')}", dest=field.name, default=argparse.SUPPRESS,
                            metavar="VALUE", help=f"JobsConfig.{field.name} (default: $RUNLEDGER_{field.name.upper()})")


def _load_registry(spec: str) -> Any:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise rl.ConfigError([f"--app must look like module:registry, got {spec!r}"])
    sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise rl.ConfigError([f"--app module {module_name!r} could not be imported: {exc}"]) from exc
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise rl.ConfigError([f"--app {spec!r}: {module_name!r} has no attribute {attribute!r}"])
        target = getattr(target, part)
    if callable(target) and not isinstance(target, rl.JobRegistry):
        target = target()
    if not isinstance(target, rl.JobRegistry):
        raise rl.ConfigError([f"--app {spec!r} must name a JobRegistry, got {type(target).__name__}"])
    return target


def _worker_config(args: argparse.Namespace) -> Any:
    """JobsConfig from the environment, overridden by the options given; validated, never clamped.

    The environment is clamped as the spec says, but a value typed on the
    command line is taken as meant, so a bad one is reported rather than bent.
    """
    overrides = {
        field.name: _coerce(field, getattr(args, field.name))
        for field in dataclasses.fields(rl.JobsConfig)
        if hasattr(args, field.name)
    }
    return rl.JobsConfig.from_env().with_overrides(**overrides).validate()


def _coerce(field: dataclasses.Field, raw: Any) -> Any:
    kind = str(field.type)
    option = f"--{field.name.replace('_', '-')}"
    text = str(raw).strip()
    try:
        if "bool" in kind:
            if text.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError(text)
            return text.lower() in ("1", "true", "yes", "on")
        if "tuple" in kind:
            return tuple(part.strip() for part in text.split(","))
        if kind == "int":
            return int(text)
        if "float" in kind:
            return float(text)
    except ValueError:
        raise rl.ConfigError([f"{option} must be a {kind.replace('Optional[', '').rstrip(']')}, got {text!r}"]) from None
    return text


@command("worker", help="run a worker and reaper until SIGINT/SIGTERM", arguments=_worker_arguments)
def _worker(args: argparse.Namespace) -> int:
    registry = _load_registry(args.app)
    config = _worker_config(args)
    if not args.debug:
        rl.configure_logging(level="INFO")
    with _engine(args) as engine:
        rl.check_schema(engine)
        registry.sync_definitions(engine)
        return rl.Supervisor(engine, registry, config).run_until_shutdown(drain_timeout=args.drain_timeout)


@command("demo", help="run the demo: an embedded PostgreSQL (unless a URL is given) and a real worker")
def _demo(args: argparse.Namespace) -> int:
    return run_demo(args.database_url or os.environ.get("RUNLEDGER_DATABASE_URL") or None)


# -- operator commands: enqueue, jobs, dead letters, stats -----------------------------

command_group("jobs", help="list, show, retry and cancel jobs")
command_group("dead-letters", help="list and replay dead-lettered jobs")

JOB_TABLE_COLUMNS = ("id", "type", "status", "attempt", "stage", "next_run_at", "last_error_code")
#: The most dead letters one ``dead-letters replay`` reads (the store's list limit).
REPLAY_LIMIT = 100_000


def _parse_payload(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        detail = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
        raise rl.InvalidPayload("the JSON argument", text, f"valid JSON ({detail})") from None


def _parse_job_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        error = rl.InvalidArgument("ID", text, "a job id (a UUID such as 0190c6c2-5f1e-7000-8000-000000000000)")
        error.hint = f"copy the id from `{PROG} jobs list`"  # type: ignore[attr-defined]
        raise error from None


def _parse_since(text: Optional[str]) -> Optional[datetime]:
    """An ISO 8601 time; one without an offset is taken as UTC."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise rl.InvalidArgument("--since", text, "an ISO 8601 time such as 2026-12-01T09:00:00Z") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def _plain(value: Any) -> Any:
    """``value`` as JSON-ready data: records become dicts, UUIDs and times become text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _print_json(value: Any) -> None:
    print(json.dumps(_plain(value), sort_keys=True))


def _when(moment: Optional[datetime]) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ") if moment is not None else "-"


def _print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    cells = [[("-" if value is None else str(value)) for value in row] for row in rows]
    widths = [max([len(header)] + [len(row[index]) for row in cells]) for index, header in enumerate(headers)]
    for row in [list(headers)] + cells:
        print("  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip())


def _job_row(job: Any) -> tuple[Any, ...]:
    return (job.id, job.job_type, job.status.value, f"{job.attempt}/{job.max_attempts}", job.stage.value,
            _when(job.next_run_at), job.last_error_code)


def _add_json_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON instead of a table")


def _add_job_id(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="ID", help="the job's id (a UUID)")


def _enqueue_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_type", metavar="TYPE", help="a registered job type, e.g. email.send")
    parser.add_argument("payload", metavar="JSON", help="the payload as one JSON value, e.g. '{\"to\": \"a@b.c\"}'")
    parser.add_argument("--priority", type=int, help="higher runs first (default: the type's default)")
    parser.add_argument("--delay-seconds", type=float, metavar="S", help="start no sooner than S seconds from now")
    parser.add_argument("--org", dest="organization_id", metavar="ORG", help="the organization the job belongs to")
    parser.add_argument("--idempotency-key", metavar="KEY",
                        help="repeating the same request with this key returns the existing job")
    parser.add_argument("--max-attempts", type=int, metavar="N", help="attempts before dead-lettering")


@command("enqueue", help="add one job to the queue and print its id", arguments=_enqueue_arguments)
def _enqueue(args: argparse.Namespace) -> int:
    payload = _parse_payload(args.payload)
    with _engine(args) as engine:
        job = rl.enqueue(engine, args.job_type, payload, priority=args.priority, delay_seconds=args.delay_seconds,
                         organization_id=args.organization_id, idempotency_key=args.idempotency_key,
                         max_attempts=args.max_attempts)
    print(job.id)
    return EXIT_OK


def _jobs_list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--status", type=str.upper, choices=[status.value for status in rl.JobStatus])
    parser.add_argument("--type", dest="job_type", metavar="TYPE", help="only this job type")
    parser.add_argument("--org", dest="organization_id", metavar="ORG", help="only this organization's jobs")
    parser.add_argument("--limit", type=int, default=100, metavar="N", help="most rows to print (default 100)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per job (JSON lines)")


@command("jobs list", help="list jobs, newest first", arguments=_jobs_list_arguments)
def _jobs_list(args: argparse.Namespace) -> int:
    with _engine(args) as engine:
        jobs = rl.list_jobs(engine, status=args.status, job_type=args.job_type,
                            organization_id=args.organization_id, limit=args.limit)
    if args.json:
        for job in jobs:
            _print_json(job)
    else:
        _print_table(JOB_TABLE_COLUMNS, [_job_row(job) for job in jobs])
    return EXIT_OK


def _jobs_show_arguments(parser: argparse.ArgumentParser) -> None:
    _add_job_id(parser)
    _add_json_option(parser, "the job, its attempts and its events")


@command("jobs show", help="print one job with its attempts and events", arguments=_jobs_show_arguments)
def _jobs_show(args: argparse.Namespace) -> int:
    job_id = _parse_job_id(args.job_id)
    with _engine(args) as engine:
        job = rl.get_job(engine, job_id)
        if job is None:
            raise rl.JobNotFound(f"job {job_id} was not found", job_id=str(job_id))
        attempts, events = rl.list_attempts(engine, job_id), rl.list_events(engine, job_id)
    if args.json:
        _print_json({"job": job, "attempts": attempts, "events": events})
        return EXIT_OK
    for field in dataclasses.fields(job):
        value = getattr(job, field.name)
        shown = _when(value) if isinstance(value, datetime) else _plain(value)
        if isinstance(shown, (dict, list)):
            shown = json.dumps(shown, sort_keys=True)
        print(f"{field.name + ':':<20} {'-' if shown is None else shown}")
    print(f"\nattempts ({len(attempts)}):")
    _print_table(("run", "attempt", "worker", "started_at", "finished_at", "outcome", "error_code"),
                 [(a.run_number, a.attempt, a.worker_id, _when(a.started_at), _when(a.finished_at), a.outcome,
                   a.error_code) for a in attempts])
    print(f"\nevents ({len(events)}):")
    _print_table(("occurred_at", "run", "attempt", "event", "stage", "payload"),
                 [(_when(e.occurred_at), e.run_number, e.attempt, e.event_type, e.stage,
                   json.dumps(_plain(e.payload), sort_keys=True)) for e in events])
    return EXIT_OK


def _jobs_retry_arguments(parser: argparse.ArgumentParser) -> None:
    _add_job_id(parser)
    parser.add_argument("--reason", help="recorded on the job and its REQUEUED event (default REQUEUED)")


@command("jobs retry", help="run a finished job again (a new run from attempt 0)", arguments=_jobs_retry_arguments)
def _jobs_retry(args: argparse.Namespace) -> int:
    job_id = _parse_job_id(args.job_id)
    with _engine(args) as engine:
        job = rl.requeue_job(engine, job_id, reason=args.reason)
    print(f"job {job.id} requeued: {job.status.value}, run {job.run_number}")
    return EXIT_OK


def _jobs_cancel_arguments(parser: argparse.ArgumentParser) -> None:
    _add_job_id(parser)
    parser.add_argument("--reason", help="recorded on the job and its CANCELED event (default CANCELED)")


@command("jobs cancel", help="cancel a PENDING or LEASED job", arguments=_jobs_cancel_arguments)
def _jobs_cancel(args: argparse.Namespace) -> int:
    job_id = _parse_job_id(args.job_id)
    with _engine(args) as engine:
        job = rl.cancel_job(engine, job_id, reason=args.reason)
    print(f"job {job.id} canceled: {job.status_reason}")
    return EXIT_OK


def _dead_letter_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--type", dest="job_type", metavar="TYPE", help="only this job type")
    parser.add_argument("--org", dest="organization_id", metavar="ORG", help="only this organization's jobs")
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
    with _engine(args) as engine:
        letters = rl.list_dead_letters(engine, job_type=args.job_type, organization_id=args.organization_id,
                                       since=since, limit=args.limit)
        dead = {letter.job_id for letter in letters if _still_dead(engine, letter)}
    if args.json:
        for letter in letters:
            _print_json({**_plain(letter), "replayed": letter.job_id not in dead})
        return EXIT_OK
    _print_table(("job_id", "type", "failed_at", "attempt", "error_code", "state", "error_message"),
                 [(d.job_id, d.job_type, _when(d.failed_at), d.attempt, d.error_code,
                   "dead" if d.job_id in dead else "replayed", _first_line(d.error_message or "")[:60])
                  for d in letters])
    return EXIT_OK


def _dead_letters_replay_arguments(parser: argparse.ArgumentParser) -> None:
    _dead_letter_filters(parser)
    parser.add_argument("--dry-run", action="store_true", help="print what would be requeued; change nothing")


@command("dead-letters replay", help="requeue every dead-lettered job that matches",
         arguments=_dead_letters_replay_arguments)
def _dead_letters_replay(args: argparse.Namespace) -> int:
    since = _parse_since(args.since)
    with _engine(args) as engine:
        letters = rl.list_dead_letters(engine, job_type=args.job_type, organization_id=args.organization_id,
                                       since=since, limit=REPLAY_LIMIT)
        targets = [letter.job_id for letter in letters if _still_dead(engine, letter)]
        replayed = 0
        for job_id in targets:
            if args.dry_run:
                print(f"would requeue {job_id}")
                continue
            try:
                rl.requeue_job(engine, job_id, reason="DEAD_LETTER_REPLAY")
            except (rl.InvalidStateTransition, rl.JobNotFound):
                continue  # requeued or deleted by someone else meanwhile
            replayed += 1
    if args.dry_run:
        print(f"{len(targets)} dead-lettered job(s) would be requeued (dry run)")
    else:
        print(f"requeued {replayed} dead-lettered job(s)")
    return EXIT_OK


def _stats_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--org", dest="organization_id", metavar="ORG", help="only this organization's jobs")
    parser.add_argument("--json", action="store_true", help="print the numbers as one JSON object")


@command("stats", help="print counts by status and type, the oldest pending age and expired leases",
         arguments=_stats_arguments)
def _stats(args: argparse.Namespace) -> int:
    with _engine(args) as engine:
        stats = rl.queue_stats(engine, organization_id=args.organization_id)
    statuses = [status.value for status in rl.JobStatus]
    by_type: dict[str, dict[str, int]] = {}
    for (job_type, status), count in sorted(stats.by_type_and_status.items()):
        by_type.setdefault(job_type, dict.fromkeys(statuses, 0))[status] = count
    if args.json:
        _print_json({"by_status": stats.by_status, "by_type": by_type,
                     "oldest_pending_age_seconds": stats.oldest_pending_age_seconds,
                     "expired_leases": stats.expired_leases})
        return EXIT_OK
    _print_table(("status", "count"), [(status, stats.by_status.get(status, 0)) for status in statuses])
    print()
    _print_table(("type",) + tuple(statuses), [(job_type,) + tuple(counts[s] for s in statuses)
                                                for job_type, counts in by_type.items()])
    age = stats.oldest_pending_age_seconds
    print(f"\noldest pending: {'none' if age is None else f'{age:.1f} s'}")
    print(f"expired leases: {stats.expired_leases}")
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
