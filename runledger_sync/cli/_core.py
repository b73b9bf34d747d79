"""The console script's core: the command registry, the parser, and error reporting.

Command modules register themselves with :func:`command` and
:func:`command_group`; :func:`main` parses the arguments, runs the chosen
command and turns a failure into ``error: <code>: <message>`` plus a ``hint:``
line (see the package docstring for the exit codes).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence, TextIO

import runledger_sync as rl
from runledger_sync.cli._output import printable

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
#: What a shell reports for a process killed by SIGPIPE (128 + 13): the reader went away.
EXIT_BROKEN_PIPE = 141

PROG = "runledger-sync"

#: One line telling the user how to fix a failure, by error code.
HINTS: dict[str, str] = {
    "config.invalid": (
        f"see `{PROG} COMMAND --help` and the documentation's configuration page "
        "(docs/reference/configuration.md) for the values allowed"
    ),
    "config.missing_extra": "install the extra the message names into the environment that runs runledger-sync",
    "encryption.invalid_key": (
        "set RUNLEDGER_ENCRYPTION_KEYS to id:base64 entries of 32-byte keys, separated by commas, and "
        "RUNLEDGER_ENCRYPTION_CURRENT to one of the ids"
    ),
    "encryption.key_missing": (
        "add the key the message names to RUNLEDGER_ENCRYPTION_KEYS (keep old keys until "
        f"`{PROG} encryption rotate` has moved every row off them)"
    ),
    "db.connection_failed": (
        "check that PostgreSQL is running and that the URL's host, port, database, user and password are right"
    ),
    "db.schema_mismatch": (
        f"run `{PROG} migrate` when the database is behind; upgrade runledger-sync when it is ahead"
    ),
    "db.migration_failed": (
        "run again with --debug to see the cause; on 'permission denied', the database role must be allowed "
        "to CREATE in the target schema (see --schema)"
    ),
    "db.schema_managed_by_host": (
        "your application's Alembic history includes runledger's; migrate with `alembic upgrade head` there"
    ),
    "db.permission_denied": "grant the database role the privileges this command needs, or use another role",
    "job.invalid_payload": (
        """pass the payload as one JSON argument quoted for your shell, e.g. '{"to": "a@b.c"}', """
        "or from a file with --payload-file PATH (- for standard input)"
    ),
    "job.output_too_large": (
        "keep large results elsewhere (a file, a table) and store a reference, or raise RUNLEDGER_MAX_OUTPUT_BYTES "
        "(1048576 by default) for this command and every worker"
    ),
    "job.invalid_argument": f"see `{PROG} COMMAND --help` for the values each option accepts",
    "job.invalid_job_type": "a job type is non-blank text of at most 255 characters, e.g. email.send",
    "job.not_found": f"list job ids with `{PROG} jobs list` (and check --org if you gave one)",
    "registry.async_handler": "write the handler as a plain def; run async code inside it with asyncio.run(...)",
    "registry.handler_signature": "a handler takes two positional arguments: def handler(ctx, payload)",
    "registry.duplicate_job_type": "register each job type once: rename one of the two, or register it in one place",
    "registry.undeclared_queue": (
        "fix the queue's name in @registry.job(..., queue=...), declare the queue next to the handlers with "
        f"registry.queue(NAME), or create it with `{PROG} queues set NAME --create`"
    ),
    "job.wait_timeout": (
        f"the job is still queued or running: wait longer with --timeout, or see why with `{PROG} jobs show ID`"
    ),
    "job.invalid_state_transition": (
        "`jobs retry` takes SUCCEEDED, DEAD_LETTERED or CANCELED jobs; `jobs cancel` takes PENDING or LEASED jobs"
    ),
    "job.definition_not_found_or_disabled": (
        f"write the definitions with `{PROG} migrate --app module:registry` (a worker started with --app "
        "writes them too), or enable the type"
    ),
    "job.idempotency_conflict": "repeat the original request exactly, or pass a new --idempotency-key",
    "job.definition_not_found": (
        "register a handler for the job type in the app (registry.job), or remove what names the type"
    ),
    "schedule.not_found": f"list schedule names with `{PROG} schedules list`",
    "queue.not_found": (
        f"list queues with `{PROG} queues list`; a queue exists once an app's registry declares or uses it and is "
        f"synced (`{PROG} migrate --app module:registry`), or once `{PROG} queues set NAME --create` creates it"
    ),
    "queue.invalid_name": "a queue name is non-blank text of at most 128 characters, e.g. mail",
    "queue.invalid_setting": f"see `{PROG} queues set --help`: limits are whole numbers of at least 1, or none",
    "schedule.declared_in_code": (
        f"pause it with `{PROG} schedules pause NAME`, or remove it from the code and then run "
        f"`{PROG} schedules delete NAME --force`"
    ),
    "batch.not_found": f"list batch ids with `{PROG} batches list`",
    "batch.closed": f"a batch takes members only while OPEN; see its status with `{PROG} batches show BATCH_ID`",
    "workflow.run_not_found": f"list run ids with `{PROG} workflows list`",
    "workflow.run_finished": "a run that has finished keeps its outcome; there is nothing left to cancel",
    "workflow.external_step_not_found": f"`{PROG} workflows show RUN_ID` lists the run's steps and their kinds",
    "workflow.external_step_not_external": "a JOB step ends with its job; only EXTERNAL steps take an answer",
    "workflow.external_step_not_waiting": (
        f"a step takes its answer once its prerequisites have ended; see its status with `{PROG} workflows show`"
    ),
    "workflow.external_step_conflicting_completion_retry": "the step was answered otherwise before; its answer stays",
    "workflow.external_step_conflicting_output_retry": "the step was answered with another output; its answer stays",
    "workflow.external_step_output_invalid_status": "give --output only with --succeeded",
    "workflow.release_conflict": "the run is being cancelled right now; run the command again once the cancel is done",
}
DEFAULT_HINT = "run again with --debug for the full traceback"
POOL_MODE_VARIABLE = "RUNLEDGER_POOL_MODE"
POOL_MODE_HINT = "set RUNLEDGER_POOL_MODE (or --pool-mode) to session, or to transaction behind a transaction pooler"
DATABASE_URL_HINT = "pass --database-url postgresql://USER:PASSWORD@HOST:5432/DBNAME or set RUNLEDGER_DATABASE_URL"
APP_HINT = ("--app takes module:attribute naming a JobRegistry (or a callable returning one) importable "
            "from the current directory, e.g. --app myapp.jobs:registry")


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
        "--pool-mode",
        choices=[mode.value for mode in rl.PoolMode],
        default=default,
        help="session (default) or transaction: use transaction behind PgBouncer in transaction pooling mode "
             "(no prepared statements, no LISTEN: idle workers poll) (default: $RUNLEDGER_POOL_MODE, then session)",
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
        epilog="exit codes: 0 ok, 1 operation failed, 2 bad usage or configuration, 141 stdout closed early",
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
        return _flushed(_exit_code(exc.code))
    if args.debug:
        rl.configure_logging(level="DEBUG", json=False)
    try:
        _keys_from_env()
        return _flushed(int(args.run(args)))
    except BrokenPipeError:
        return _reader_went_away()
    except (rl.ValidationError, rl.ConfigError) as exc:  # refused before any work was done: bad usage
        hint = getattr(exc, "hint", None) or HINTS.get(exc.code, HINTS["job.invalid_argument"])
        _report(exc.code, exc.message, hint, args)
        return EXIT_USAGE
    except rl.RunledgerError as exc:
        _report(exc.code, exc.message, getattr(exc, "hint", None) or HINTS.get(exc.code, DEFAULT_HINT), args)
        return int(getattr(exc, "exit_code", EXIT_FAILED))
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # the console's boundary: report, never a bare traceback
        _report("internal", f"{type(exc).__name__}: {exc}", DEFAULT_HINT, args)
        return EXIT_FAILED


def _keys_from_env() -> None:
    """Every command seals and opens with $RUNLEDGER_ENCRYPTION_KEYS, as the workers do."""
    if (os.environ.get("RUNLEDGER_ENCRYPTION_KEYS") or "").strip():
        rl.configure_encryption(rl.Encryption.from_env())


def _flushed(code: int) -> int:
    # Flushed here, not at interpreter exit, so a reader that went away is handled
    # like any other closed pipe instead of being reported by Python on the way out.
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return _reader_went_away()
    return code


def _reader_went_away() -> int:
    """Exit quietly when stdout's reader closed it (``runledger-sync stats | head -4``), as Unix tools do."""
    # Whatever is still buffered cannot be written; point stdout at /dev/null so
    # the interpreter's final flush does not raise again on the way out.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a real file (an embedding caller captured it)
        pass
    return EXIT_BROKEN_PIPE


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
    # The message may repeat stored or upstream text: no escape sequence reaches the terminal.
    print(f"error: {code}: {printable(redact(first_line(message), args.database_url))}", file=stream)
    print(f"hint: {hint}", file=stream)


def refused_input(error: rl.RunledgerError, hint: str) -> rl.RunledgerError:
    """``error`` marked as a refusal of what the command was given: exit 2 (bad usage), with ``hint``.

    For an error whose class is not a validation error but that, here, means the
    input was wrong (a worker's ``--queues`` naming no queue, say).
    """
    error.hint = hint  # type: ignore[attr-defined]
    error.exit_code = EXIT_USAGE  # type: ignore[attr-defined]
    return error


def first_line(text: str) -> str:
    # Driver errors carry the SQL and a background link on further lines.
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


def redact(text: str, url: Optional[str]) -> str:
    """Mask the password of every URL in ``text``, the one given on the command line first.

    Only URLs change: a password is never searched for in the rest of the text,
    where it may be an ordinary word (``postgres``) or a single letter.
    """
    # The URL as given is replaced whole, even one too malformed to be read as a URL.
    if url and "://" in url and "@" in url:
        text = text.replace(url, rl.mask_url(url))
    return rl.mask_urls_in(text)


def pool_mode_of(args: argparse.Namespace) -> Optional[Any]:
    """The --pool-mode given, else RUNLEDGER_POOL_MODE, else None (session).

    Raises:
        ConfigError: RUNLEDGER_POOL_MODE names no pool mode (argparse checks the option).
    """
    text = getattr(args, "pool_mode", None) or os.environ.get(POOL_MODE_VARIABLE, "").strip()
    if not text:
        return None
    try:
        return rl.PoolMode(text.lower())
    except ValueError:
        allowed = ", ".join(mode.value for mode in rl.PoolMode)
        error = rl.ConfigError([f"{POOL_MODE_VARIABLE} must be one of {allowed}, got {text!r}"])
        error.hint = POOL_MODE_HINT  # type: ignore[attr-defined]
        raise error from None


def load_app_registry(spec: str) -> Any:
    """The JobRegistry ``--app module:attribute`` names, imported as the app itself would import it.

    Raises:
        ConfigError: the spec is malformed, does not import, or names no JobRegistry (with :data:`APP_HINT`).
    """
    # Commands run from the app's directory: its modules import as in the app.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return rl.load_registry(spec, option="--app")
    except rl.ConfigError as error:
        refused = rl.ConfigError(error.problems)
        refused.hint = APP_HINT  # type: ignore[attr-defined]
        raise refused from error


@contextlib.contextmanager
def open_engine(args: argparse.Namespace) -> Iterator[Any]:
    """An engine for the URL and schema given (or found in the environment), disposed afterwards."""
    pool_mode = pool_mode_of(args)
    try:
        engine = rl.create_engine(args.database_url, schema=args.schema, pool_mode=pool_mode)
    except rl.ConfigError as exc:  # only the URL is left to check here, so say how to give one
        exc.hint = DATABASE_URL_HINT  # type: ignore[attr-defined]
        raise
    try:
        yield engine
    finally:
        engine.dispose()
