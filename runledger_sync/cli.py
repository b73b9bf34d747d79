"""The ``runledger-sync`` console script.

Each subcommand is one function registered with :func:`command`; adding one is
writing a function that takes the parsed arguments and returns an exit code::

    @command("stats", help="print queue counts")
    def _stats(args: argparse.Namespace) -> int:
        with _engine(args) as engine:
            print(rl.queue_stats(engine))
        return EXIT_OK

Exit codes: 0 success, 1 the operation failed, 2 bad usage. A failure prints
``error: <code>: <message>`` and a ``hint:`` line to stderr; the traceback only
with ``--debug``. Passwords in database URLs are never printed.

The script uses only the public ``runledger_sync`` API.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence, TextIO
from urllib.parse import unquote, urlsplit

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


def command(
    name: str, *, help: str, arguments: Optional[Callable[[argparse.ArgumentParser], None]] = None
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Register the decorated function as subcommand ``name``."""

    def register(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        if name in COMMANDS:
            raise ValueError(f"command {name!r} is registered twice")
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
    for entry in COMMANDS.values():
        sub = subcommands.add_parser(entry.name, help=entry.help, description=entry.help)
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
