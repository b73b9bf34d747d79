"""Schedule commands: ``schedules list | show | pause | resume | trigger | delete``."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone
from typing import Any, Optional
from zoneinfo import ZoneInfo

import runledger_sync as rl
from runledger_sync.cli._core import EXIT_OK, command, command_group, open_engine
from runledger_sync.cli._output import add_json_option, plain, print_json, print_table, printable, when
from runledger_sync.core.cron import parse_cron

command_group("schedules", help="list, show, pause, resume, trigger and delete cron schedules")


def _in_zone(moment: Optional[datetime], zone: str) -> str:
    """The time in the schedule's own zone, as its cron reads it (``-`` for none)."""
    if moment is None:
        return "-"
    return moment.astimezone(ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M:%S %Z")


def _state(schedule: Any) -> str:
    """``active``, ``paused``, or ``finished``: inactive, and its cron names no instant after now."""
    if schedule.is_active:
        return "active"
    try:
        done = parse_cron(schedule.cron_expr, schedule.timezone).next_fire(datetime.now(timezone.utc)) is None
    except rl.ValidationError:
        done = False  # a cron edited into something invalid: shown as stored, its error says the rest
    return "finished" if done else "paused"


def _name_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the schedule's name")


def _list_arguments(parser: argparse.ArgumentParser) -> None:
    state = parser.add_mutually_exclusive_group()
    state.add_argument("--active", dest="active", action="store_const", const=True, help="only active schedules")
    state.add_argument("--paused", dest="active", action="store_const", const=False, help="only paused schedules")
    parser.add_argument("--json", action="store_true", help="print one JSON object per schedule (JSON lines)")


@command("schedules list", help="list schedules by name, with their next fire", arguments=_list_arguments)
def _schedules_list(args: argparse.Namespace) -> int:
    with open_engine(args) as engine:
        found = rl.list_schedules(engine, active=args.active)
    if args.json:
        for schedule in found:
            print_json(schedule)
        return EXIT_OK
    print_table(("name", "cron", "zone", "type", "state", "next_fire (UTC)", "last_fired", "last_error"),
                [(s.name, s.cron_expr, s.timezone, s.job_type, _state(s), when(s.next_fire_at), when(s.last_fired_at),
                  s.last_error_code or "-") for s in found])
    return EXIT_OK


def _show_arguments(parser: argparse.ArgumentParser) -> None:
    _name_argument(parser)
    add_json_option(parser, "the schedule")


@command("schedules show", help="print one schedule: next and last fire, in UTC and its zone, and its last error",
         arguments=_show_arguments)
def _schedules_show(args: argparse.Namespace) -> int:
    with open_engine(args) as engine:
        schedule = rl.get_schedule(engine, args.name)
    if schedule is None:
        raise rl.ScheduleNotFound(f"no schedule is named {args.name!r}")
    if args.json:
        print_json(schedule)
        return EXIT_OK
    lines = [
        ("name", schedule.name), ("state", _state(schedule)), ("cron", schedule.cron_expr),
        ("timezone", schedule.timezone), ("job_type", schedule.job_type),
        ("organization_id", schedule.organization_id or "-"),
        ("payload_template", json.dumps(plain(schedule.payload_template), sort_keys=True)),
        ("max_jitter_seconds", schedule.max_jitter_seconds), ("source", schedule.source),
        ("next_fire", f"{when(schedule.next_fire_at)}  ({_in_zone(schedule.next_fire_at, schedule.timezone)})"),
        ("last_fired", f"{when(schedule.last_fired_at)}  ({_in_zone(schedule.last_fired_at, schedule.timezone)})"),
        ("last_error", "-" if schedule.last_error_code is None else
         f"{schedule.last_error_code}: {schedule.last_error_message} (at {when(schedule.last_error_at)})"),
    ]
    for label, value in lines:
        print(f"{label + ':':<20} {printable(value)}")
    return EXIT_OK


def _change(action: Any, done: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        with open_engine(args) as engine:
            schedule = action(engine, args.name)
        # A paused row keeps its next_fire_at, but a pause means no fire: do not print one.
        after = f"next fire {when(schedule.next_fire_at)}" if schedule.is_active else "it fires no more until resumed"
        print(f"{printable(schedule.name)} {done}; {after}")
        return EXIT_OK

    return run


command("schedules pause", help="stop a schedule firing until it is resumed", arguments=_name_argument)(
    _change(rl.pause_schedule, "paused"))
command("schedules resume", help="let a paused schedule fire again, from its next instant (missed ones are skipped)",
        arguments=_name_argument)(_change(rl.resume_schedule, "resumed"))


@command("schedules trigger", help="enqueue one extra fire now and print the job's id", arguments=_name_argument)
def _schedules_trigger(args: argparse.Namespace) -> int:
    with open_engine(args) as engine:
        job = rl.trigger_schedule(engine, args.name)
    print(job.id)
    return EXIT_OK


def _delete_arguments(parser: argparse.ArgumentParser) -> None:
    _name_argument(parser)
    parser.add_argument("--force", action="store_true",
                        help="delete a schedule declared in code too (remove it from the code first, or "
                             "the next worker start writes it again)")


@command("schedules delete", help="delete a schedule (the jobs it enqueued stay)", arguments=_delete_arguments)
def _schedules_delete(args: argparse.Namespace) -> int:
    with open_engine(args) as engine:
        schedule = rl.delete_schedule(engine, args.name, force=args.force)
    print(f"{printable(schedule.name)} deleted")
    return EXIT_OK
