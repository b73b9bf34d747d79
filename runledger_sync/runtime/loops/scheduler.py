"""The scheduler loop: turn due cron schedules into jobs (spec section 8), the Supervisor's third loop.

Each tick fires every due schedule, in batches of ``claim_batch_size``, each
batch one transaction. Between ticks the loop sleeps until the soonest schedule
is due, but never longer than ``schedule_poll_interval_seconds``. It also
LISTENs on the schedules channel: a schedule written or resumed anywhere (which
notifies it, see :mod:`runledger_sync.store.notify`) wakes it at once, so a
resumed schedule fires at its next instant. Where it cannot listen (transaction
pooling, or the LISTEN is lost) the poll interval bounds how late such a write
is noticed. Any number of processes may run it: the schedule rows are the lock.
"""

from __future__ import annotations

import threading
import time
from typing import Optional

from runledger_sync.config import JobsConfig
from runledger_sync.core.encryption_errors import EncryptionKeyMissing
from runledger_sync.core.records import ScheduleTick
from runledger_sync.core.types import RuntimeLoopExit
from runledger_sync.logging import get_logger
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.health import TICK, LoopMarks
from runledger_sync.runtime.worker.listener import JobListener
from runledger_sync.runtime.loops.periodic import run_periodically
from runledger_sync.store.driver import SCHEDULES_CHANNEL, Driver

log = get_logger(__name__)

#: The shortest sleep between ticks: a schedule due now but locked by another
#: process's tick is waited for, not spun on.
MIN_WAIT_SECONDS = 0.05
#: How often a waiting loop checks for shutdown while it listens.
SHUTDOWN_CHECK_SECONDS = 0.05


def tick_once(driver: Driver, config: JobsConfig) -> ScheduleTick:
    """Fire every due schedule, batch after batch; return the totals and when the next one is due."""
    fired = 0
    failed: list = []
    finished: list[str] = []
    while True:
        tick = driver.fire_due_schedules(limit=config.claim_batch_size, event_log=config.event_log)
        fired += tick.fired
        for name in tick.finished:
            log.info("schedule fired its last instant; now inactive", extra={"schedule_name": name})
        finished.extend(tick.finished)
        for failure in tick.failed:
            if failure.code == EncryptionKeyMissing.code:
                # Not this process's to fire: one holding the key takes it when it is due again.
                log.warning("schedule's payload template is sealed under a key this process lacks; "
                            "not fired here, due again in 30 s",
                            extra={"schedule_name": failure.name, "error_code": failure.code, "error": failure.message})
                continue
            log.error("schedule could not fire; trying again in 30 s",
                      extra={"schedule_name": failure.name, "error_code": failure.code, "error": failure.message})
        failed.extend(tick.failed)
        if not tick.full:
            break
    if fired:
        log.info("schedules fired", extra={"fired": fired, "failed": len(failed)})
    return ScheduleTick(fired, tuple(failed), False, tick.next_due_in_seconds, tuple(finished))


def run_scheduler_loop(
    driver: Driver, registry: JobRegistry, config: JobsConfig, shutdown_event: threading.Event,
    *, marks: Optional[LoopMarks] = None,
) -> RuntimeLoopExit:
    """Fire due schedules until shutdown.

    Args:
        driver: the supervisor's; each tick runs on it, and where it listens, the loop does too.
        marks: where each tick that did not fail is marked (the Supervisor's health).

    Returns:
        ``SHUTDOWN``, or ``INVALID_CONFIG`` at once when the scheduler's settings are invalid.
    """
    def tick() -> float:
        next_due = tick_once(driver, config).next_due_in_seconds
        wait = config.schedule_poll_interval_seconds
        return wait if next_due is None else min(wait, max(MIN_WAIT_SECONDS, next_due))

    listener = _schedule_listener(driver, config)
    try:
        return run_periodically(
            "scheduler", config.validate_scheduler, tick, config.schedule_poll_interval_seconds, shutdown_event,
            on_success=None if marks is None else lambda: marks.mark(TICK),
            pause=None if listener is None else lambda seconds: _pause(listener, shutdown_event, seconds),
            on_turn=None if marks is None else lambda: marks.turned("scheduler"),
        )
    finally:
        if listener is not None:
            listener.close()


def _schedule_listener(driver: Driver, config: JobsConfig) -> Optional[JobListener]:
    if not driver.listens:
        return None
    return JobListener(driver, None, worker_id=config.worker_id, channel=SCHEDULES_CHANNEL,
                       name="schedule listener", probe_interval_seconds=config.schedule_poll_interval_seconds)


def _pause(listener: JobListener, shutdown_event: threading.Event, seconds: float) -> None:
    """Wait ``seconds``, or less when a schedule is written or resumed, or shutdown is asked for."""
    deadline = time.monotonic() + seconds
    listener.probe()
    while not shutdown_event.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        if listener.connect_if_due():
            return  # a new LISTEN missed what was written before it: tick once more
        step = min(remaining, SHUTDOWN_CHECK_SECONDS)
        if listener.connected:
            if listener.wait(step):
                return
        else:
            shutdown_event.wait(step)
