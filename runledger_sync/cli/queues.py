"""Queue commands: ``queues list | show | pause | resume | set``.

A queue's settings live in the database (``job_queues``), so a pause or a new
limit given here holds from the next claim of every worker. The counts come from
:func:`runledger_sync.queue_loads`: ready (due and free to claim), held by a busy
concurrency key, scheduled for later, and leased (running).
"""

from __future__ import annotations

import argparse
import re
from typing import Any

import runledger_sync as rl
from runledger_sync.cli._core import EXIT_OK, PROG, command, command_group, open_engine
from runledger_sync.cli._output import add_json_option, print_json, print_table, printable, when
from runledger_sync.cli._queue_view import QUEUE_COLUMNS, limit_text, queue_data, queue_row, rate_text
from runledger_sync.core.flow import LIMIT_RANGE

command_group("queues", help="list, show, pause, resume and set the limits of queues")

#: ``100/60s``, ``20/1s``, ``100/1m``: a count per a window of seconds (or ms, minutes, hours).
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
NONE_WORD = "none"


def _name_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the queue's name")


def _load(engine: Any, name: str) -> Any:
    """The queue's load; QueueNotFound (or InvalidQueueName) when there is no such queue."""
    rl.get_queue(engine, name)  # checks the name and that the queue exists
    found = [load for load in rl.queue_loads(engine) if load.queue.name == name]
    if not found:  # deleted between the two reads
        raise rl.QueueNotFound(f"no queue is named {name!r}", queue=name)
    return found[0]


def _list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object per queue (JSON lines)")


@command("queues list", help="list every queue: paused or not, its limits, and its ready, held-by-key, scheduled "
                             "and leased jobs", arguments=_list_arguments)
def _queues_list(args: argparse.Namespace) -> int:
    with open_engine(args) as engine:
        loads = rl.queue_loads(engine)
    if args.json:
        for load in loads:
            print_json(queue_data(load))
        return EXIT_OK
    print_table(QUEUE_COLUMNS, [queue_row(load) for load in loads])
    return EXIT_OK


def _show_arguments(parser: argparse.ArgumentParser) -> None:
    _name_argument(parser)
    add_json_option(parser, "the queue")


@command("queues show", help="print one queue: its settings, its waiting and running jobs, and its rate budget used",
         arguments=_show_arguments)
def _queues_show(args: argparse.Namespace) -> int:
    with open_engine(args) as engine:
        load = _load(engine, args.name)
    if args.json:
        print_json(queue_data(load))
        return EXIT_OK
    queue = load.queue
    rate = queue.rate_limit
    lines = [
        ("name", queue.name),
        ("paused", f"yes, since {when(queue.paused_at)}" if queue.paused else "no"),
        ("global_limit", limit_text(queue.global_limit)),
        ("key_limit", limit_text(queue.key_limit)),
        ("rate_limit", rate_text(rate)),
        ("rate_used", "-" if rate is None else
         f"{load.rate_used} of {rate.count} in the last {rate.per_seconds:g} s" + (" (all keys)" if rate.per_key else "")),
        ("ready", load.ready),
        ("held_by_key", load.blocked_by_key),
        ("scheduled", load.scheduled),
        ("leased", load.leased),
        ("updated_at", when(queue.updated_at)),
    ]
    for label, value in lines:
        print(f"{label + ':':<20} {printable(value)}")
    return EXIT_OK


def _paused(args: argparse.Namespace) -> int:
    with open_engine(args) as engine:
        queue = rl.pause_queue(engine, args.name)
    print(f"{printable(queue.name)} paused: no worker claims its jobs until `{PROG} queues resume "
          f"{printable(queue.name)}`; running jobs finish and enqueue still works")
    return EXIT_OK


def _resumed(args: argparse.Namespace) -> int:
    with open_engine(args) as engine:
        queue = rl.resume_queue(engine, args.name)
    print(f"{printable(queue.name)} resumed: workers claim its jobs again")
    return EXIT_OK


command("queues pause", help="stop every worker claiming the queue's jobs (running ones finish; enqueue still works)",
        arguments=_name_argument)(_paused)
command("queues resume", help="let workers claim the queue's jobs again", arguments=_name_argument)(_resumed)


def _set_arguments(parser: argparse.ArgumentParser) -> None:
    _name_argument(parser)
    parser.add_argument("--global-limit", metavar="N|none",
                        help="at most N of the queue's jobs running at once across every worker; none: no limit")
    parser.add_argument("--key-limit", metavar="N|none",
                        help="at most N running (or next in line) per concurrency key; none: no limit")
    parser.add_argument("--rate", metavar="COUNT/WINDOW|none",
                        help="at most COUNT claims in any window, e.g. 100/60s, 100/1m, 20/1s (ms, s, m, h); "
                             "none: no rate limit")
    parser.add_argument("--per-key", action="store_true", help="with --rate: each concurrency key has its own budget")
    parser.add_argument("--create", action="store_true",
                        help="create the queue if it does not exist (otherwise an unknown name is refused)")


def _limit(option: str, text: str) -> Any:
    if text.strip().lower() == NONE_WORD:
        return None
    expected = f"a whole number from {LIMIT_RANGE[0]} to {LIMIT_RANGE[1]:,}, or none"
    try:
        value = int(text.strip())
    except ValueError:
        raise rl.InvalidQueueSetting(option, text, expected) from None
    if not LIMIT_RANGE[0] <= value <= LIMIT_RANGE[1]:
        raise rl.InvalidQueueSetting(option, text, expected)
    return value


def _rate(text: str, per_key: bool) -> Any:
    if text.strip().lower() == NONE_WORD:
        return None
    expected = (f"COUNT/WINDOW such as 100/60s, 100/1m or 20/1s (COUNT from {LIMIT_RANGE[0]} to {LIMIT_RANGE[1]:,}, "
                "WINDOW from 1 ms to a year), or none")
    match = _RATE.match(text)
    if match is None:
        raise rl.InvalidQueueSetting("--rate", text, expected)
    count, seconds, unit = match.groups()
    try:
        return rl.RateLimit(int(count), float(seconds) * _UNIT_SECONDS[unit], per_key=per_key)
    except rl.InvalidQueueSetting:
        raise rl.InvalidQueueSetting("--rate", text, expected) from None


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given, checked before the database is touched; those left out keep their value."""
    if args.per_key and args.rate is None:
        raise rl.ConfigError(["--per-key goes with --rate: it says how that rate is counted"])
    settings: dict[str, Any] = {}
    if args.global_limit is not None:
        settings["global_limit"] = _limit("--global-limit", args.global_limit)
    if args.key_limit is not None:
        settings["key_limit"] = _limit("--key-limit", args.key_limit)
    if args.rate is not None:
        settings["rate_limit"] = _rate(args.rate, args.per_key)
    if not settings and not args.create:
        raise rl.ConfigError(["queues set needs at least one of --global-limit, --key-limit or --rate "
                              "(or --create, to create the queue with no limit but key_limit 1)"])
    return settings


@command("queues set", help="change a queue's limits (left out: kept); every worker applies them from its next claim",
         arguments=_set_arguments)
def _queues_set(args: argparse.Namespace) -> int:
    settings = _settings(args)
    with open_engine(args) as engine:
        if not args.create:
            rl.get_queue(engine, args.name)  # a misspelt name must not create a queue
        queue = rl.configure_queue(engine, args.name, **settings)
    print(f"{printable(queue.name)}: global_limit {limit_text(queue.global_limit)}, key_limit "
          f"{limit_text(queue.key_limit)}, rate_limit {printable(rate_text(queue.rate_limit))}"
          + (", paused" if queue.paused else ""))
    return EXIT_OK
