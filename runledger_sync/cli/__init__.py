"""The ``runledger-sync`` console script.

Each subcommand is one function registered with :func:`command`; adding one is
writing a function that takes the parsed arguments and returns an exit code
(a name with a space, ``"jobs list"``, nests under a :func:`command_group`)::

    @command("stats", help="print queue counts")
    def _stats(args: argparse.Namespace) -> int:
        with open_engine(args) as engine:
            print(rl.queue_stats(engine))
        return EXIT_OK

Exit codes: 0 success, 1 the operation failed, 2 bad usage or configuration
(argparse errors, ``config.invalid``, and values the library rejects before
touching the database: bad JSON, a bad UUID, an out-of-range number), ``jobs wait``'s
3 (the job was dead-lettered), 4 (canceled) and 124 (it had not ended at the timeout), 141 when
the reader of stdout closed it early (``stats | head``; nothing is printed). A
failure prints
``error: <code>: <message>`` and a ``hint:`` line to stderr; the traceback only
with ``--debug``. Passwords in database URLs are never printed.

The modules: ``_core`` (registry, parser, error reporting), ``_output``
(tables and JSON), and one module per purpose that registers its commands on
import: ``schema`` (migrate, check-schema), ``worker`` (worker, demo), ``jobs``
(enqueue, jobs, stats), ``bulk`` (jobs delete, jobs update, operations), ``queues``,
``dead_letters``, ``retention`` (prune), ``schedules``, ``workflows``, ``batches``, ``dashboard``, ``encryption``
(encryption rotate), ``health`` and ``top``. The script uses only the public
``runledger_sync`` API.
"""

from __future__ import annotations

# Importing a command module registers its commands; the order is the order of `--help`.
from runledger_sync.cli import schema, worker, jobs, bulk, queues, dead_letters, retention, schedules, workflows, dashboard, health, top  # noqa: F401  isort: skip
from runledger_sync.cli import encryption  # noqa: F401,E402  isort: skip
from runledger_sync.cli import batches  # noqa: F401,E402  isort: skip
from runledger_sync.cli._core import (
    COMMANDS,
    DEFAULT_HINT,
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    GROUPS,
    HINTS,
    PROG,
    Command,
    build_parser,
    command,
    command_group,
    main,
    open_engine,
    redact,
)
from runledger_sync.cli._output import plain

# The names the single-module script had, kept for callers and tests.
_redact = redact
_plain = plain

__all__ = [
    "COMMANDS",
    "Command",
    "DEFAULT_HINT",
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "GROUPS",
    "HINTS",
    "PROG",
    "build_parser",
    "command",
    "command_group",
    "main",
    "open_engine",
]
