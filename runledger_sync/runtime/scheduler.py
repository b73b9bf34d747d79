"""The scheduler loop: turn due cron schedules into jobs (spec section 8), the Supervisor's third loop.

Each tick fires every due schedule, in batches of ``claim_batch_size``, each
batch one transaction. Between ticks the loop sleeps until the soonest schedule
is due, but never longer than ``schedule_poll_interval_seconds``, which bounds
how late a schedule written or resumed by another process is noticed. Any
number of processes may run it: the schedule rows are the lock.
"""

from __future__ import annotations

import threading
from typing import Optional

from sqlalchemy.engine import Engine

from runledger_sync.config import JobsConfig
from runledger_sync.core.records import ScheduleTick
from runledger_sync.core.types import RuntimeLoopExit
from runledger_sync.logging import get_logger
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.health import TICK, LoopMarks
from runledger_sync.runtime.periodic import run_periodically
from runledger_sync.store import schedules

log = get_logger(__name__)

#: The shortest sleep between ticks: a schedule due now but locked by another
#: process's tick is waited for, not spun on.
MIN_WAIT_SECONDS = 0.05


def tick_once(engine: Engine, config: JobsConfig) -> ScheduleTick:
    """Fire every due schedule, batch after batch; return the totals and when the next one is due."""
    fired = 0
    failed: list = []
    while True:
        tick = schedules.fire_due_schedules(engine, limit=config.claim_batch_size)
        fired += tick.fired
        for failure in tick.failed:
            log.error("schedule could not fire; trying again in 30 s",
                      extra={"schedule_name": failure.name, "error_code": failure.code, "error": failure.message})
        failed.extend(tick.failed)
        if not tick.full:
            break
    if fired:
        log.info("schedules fired", extra={"fired": fired, "failed": len(failed)})
    return ScheduleTick(fired, tuple(failed), False, tick.next_due_in_seconds)


def run_scheduler_loop(
    engine: Engine, registry: JobRegistry, config: JobsConfig, shutdown_event: threading.Event,
    *, marks: Optional[LoopMarks] = None,
) -> RuntimeLoopExit:
    """Fire due schedules until shutdown.

    Args:
        marks: where each tick that did not fail is marked (the Supervisor's health).

    Returns:
        ``SHUTDOWN``, or ``INVALID_CONFIG`` at once when the scheduler's settings are invalid.
    """
    def tick() -> float:
        next_due = tick_once(engine, config).next_due_in_seconds
        wait = config.schedule_poll_interval_seconds
        return wait if next_due is None else min(wait, max(MIN_WAIT_SECONDS, next_due))

    return run_periodically("scheduler", config.validate_scheduler, tick, config.schedule_poll_interval_seconds,
                            shutdown_event, on_success=None if marks is None else lambda: marks.mark(TICK),
                            on_turn=None if marks is None else lambda: marks.turned("scheduler"))
