"""``top``: a live terminal view of the queue (needs the ``tui`` extra, rich).

Each frame reads :func:`runledger_sync.queue_stats` (counts by status and type,
finished jobs included, through the listing indexes) and
:func:`runledger_sync.queue_gauges` (due jobs, the oldest due job per type,
recent dead letters, late schedules) and :func:`runledger_sync.queue_loads`
(each queue's pause, limits and waiting jobs). Rates are the change in finished jobs
between two frames, so the first frame (and ``--once``) shows none.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from types import ModuleType
from typing import Any, Optional

import runledger_sync as rl
from runledger_sync.cli._core import EXIT_OK, command, open_engine
from runledger_sync.cli._output import printable
from runledger_sync.cli._queue_view import queue_row

DEFAULT_INTERVAL_SECONDS = 2.0
#: The width of a frame printed where stdout is not a terminal (a pipe, a file, a test).
PIPE_WIDTH = 160
FINISHED = tuple(status.value for status in rl.JobStatus if status.is_terminal)
STATUSES = tuple(status.value for status in rl.JobStatus)


def _top_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_SECONDS, metavar="SECONDS",
                        help=f"seconds between frames (default {DEFAULT_INTERVAL_SECONDS:g})")
    parser.add_argument("--once", action="store_true", help="print one frame and exit (no terminal needed)")


@dataclass(frozen=True)
class Snapshot:
    """One frame's reads, and when they were taken (monotonic clock, for the rates)."""

    stats: Any
    gauges: Any
    taken: float
    #: Each queue with its settings and what waits in it.
    loads: tuple[Any, ...] = ()


def _rich() -> ModuleType:
    try:
        import rich.console
        import rich.live
        import rich.table
        import rich.text
    except ImportError:
        raise rl.MissingExtra("tui", "rich") from None
    return rich


@command("top", help="a live view of the queue: counts by status and type, finish rates, the oldest due job "
                     "per type, the queues with their limits and waiting jobs (needs the tui extra)",
         arguments=_top_arguments)
def _top(args: argparse.Namespace) -> int:
    rich = _rich()
    if not args.interval > 0:
        raise rl.ConfigError([f"--interval must be a number of seconds above 0, got {args.interval}"])
    console = rich.console.Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)
    with open_engine(args) as engine:
        if args.once:
            console.print(_frame(rich, _read(engine), None, 0))
            return EXIT_OK
        previous: Optional[Snapshot] = None
        try:
            with rich.live.Live(console=console, auto_refresh=False, screen=False) as live:
                while True:
                    snapshot = _read(engine)
                    live.update(_frame(rich, snapshot, previous, args.interval), refresh=True)
                    previous = snapshot
                    time.sleep(args.interval)
        except KeyboardInterrupt:  # Ctrl-C is how a live view ends
            return EXIT_OK


def _read(engine: Any) -> Snapshot:
    return Snapshot(rl.queue_stats(engine), rl.queue_gauges(engine), time.monotonic(), tuple(rl.queue_loads(engine)))


def _frame(rich: ModuleType, now: Snapshot, before: Optional[Snapshot], interval: float) -> Any:
    """One frame; ``interval`` 0 means a single frame (``--once``)."""
    text, table = rich.text.Text, rich.table.Table
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    refresh = "one frame" if interval == 0 else f"every {interval:g} s  (Ctrl-C quits)"
    title = text(f"runledger-sync top  {stamp}  {refresh}", style="bold")
    statuses = table(title="jobs by status", title_justify="left")
    for status in STATUSES:
        statuses.add_column(status, justify="right")
    statuses.add_row(*(text(str(now.stats.by_status.get(status, 0))) for status in STATUSES))
    types = table(title="by job type", title_justify="left")
    types.add_column("job type")
    for heading in (*STATUSES, "due", "oldest due", "finished/s", "dead letters 1h"):
        types.add_column(heading, justify="right")
    for job_type in _job_types(now):
        counts = [now.stats.by_type_and_status.get((job_type, status), 0) for status in STATUSES]
        age = now.gauges.oldest_due_age_seconds.get(job_type)
        types.add_row(text(printable(job_type)), *(text(str(count)) for count in counts),
                      text(str(now.gauges.due.get(job_type, 0))), text("-" if age is None else f"{age:.1f} s"),
                      text(_rate(now, before, job_type)), text(str(now.gauges.dead_lettered_recently.get(job_type, 0))))
    queues = table(title="queues", title_justify="left")
    queues.add_column("queue")
    for heading in ("state", "global limit", "key limit", "rate limit", "ready", "held by key", "scheduled", "leased"):
        queues.add_column(heading, justify="right")
    for load in now.loads:
        name, paused, *cells = queue_row(load)
        queues.add_row(text(printable(name)), text("paused" if paused == "yes" else "active",
                                                   style="bold yellow" if paused == "yes" else ""),
                       *(text(printable(cell)) for cell in cells))
    footer = text(f"expired leases: {now.stats.expired_leases}   late schedules: {now.gauges.late_schedules}   "
                  f"scheduled for later: {now.stats.scheduled_for_later}")
    return rich.console.Group(title, statuses, types, queues, footer)


def _job_types(now: Snapshot) -> list[str]:
    return sorted(set(now.gauges.job_types) | {job_type for job_type, _ in now.stats.by_type_and_status})


def _finished(snapshot: Snapshot, job_type: str) -> int:
    return sum(snapshot.stats.by_type_and_status.get((job_type, status), 0) for status in FINISHED)


def _rate(now: Snapshot, before: Optional[Snapshot], job_type: str) -> str:
    if before is None or now.taken <= before.taken:
        return "-"
    # A requeue moves finished jobs back to PENDING: the count may fall.
    return f"{max(0, _finished(now, job_type) - _finished(before, job_type)) / (now.taken - before.taken):.1f}"
