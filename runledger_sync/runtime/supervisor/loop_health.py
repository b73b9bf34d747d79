"""How each loop of a Supervisor is doing, read from its threads (or its worker processes) and their marks."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterable, Mapping

from runledger_sync.config import JobsConfig
from runledger_sync.runtime.health import CLAIM, REAP, TICK, LoopHealth, LoopMarks
from runledger_sync.runtime.supervisor.processes import ProcessGroup

#: The step each loop marks when it succeeds, shown as its last_success_at.
LOOP_STEPS = {"worker": CLAIM, "reaper": REAP, "scheduler": TICK}


def thread_health(
    names: Iterable[str], threads: Mapping[str, threading.Thread], exits: Mapping[str, Any], marks: LoopMarks,
    config: JobsConfig, stall_allowance_seconds: float,
) -> dict[str, LoopHealth]:
    """Each loop run as a thread of this process: alive, stalled (no turn for its interval and the allowance), its last success."""
    intervals = {"worker": config.poll_interval_ms / 1000.0, "reaper": config.reaper_interval_seconds,
                 "scheduler": config.schedule_poll_interval_seconds}
    now = time.time()
    loops = {}
    for name in names:
        thread = threads.get(name)
        ended = exits.get(name)
        alive = thread is not None and thread.is_alive()
        turned = marks.last_turn(name)
        stalled = alive and turned is not None and now - turned.timestamp() > intervals[name] + stall_allowance_seconds
        loops[name] = LoopHealth(
            name, alive=alive, last_success_at=marks.last(LOOP_STEPS[name]),
            exit=None if ended is None else repr(ended), last_turn_at=turned, stalled=stalled,
        )
    listener = marks.listener
    if listener is not None:
        loops["listener"] = LoopHealth("listener", alive=listener.connected)
    return loops


def process_health(group: ProcessGroup) -> dict[str, LoopHealth]:
    """Each worker process of a group: alive or not, and how it last exited."""
    health = {}
    for slot in group.slots:
        name = slot.worker_id or f"p{slot.index}"
        health[name] = LoopHealth(name, alive=slot.process is not None and slot.process.is_alive(),
                                  exit=None if slot.last_exit is None else str(slot.last_exit))
    return health
