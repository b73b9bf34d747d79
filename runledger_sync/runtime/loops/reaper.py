"""The reaper loop: bring back jobs whose worker died or lost its lease (spec section 7).

An expired claim that never persisted RUNNING is released without spending
its attempt; a started one has spent it and is retried at the fixed reaper
delay, or dead-lettered when it was the last, after which the handler's
``on_dead_letter`` hook is told (worker id ``reaper``).

Back from an outage (a sweep that could not reach the database), the reaper
waits one heartbeat interval after the database answers again before it
sweeps: every worker was cut off too, and a lease that ran out meanwhile may
belong to a live worker with a decided outcome to land or a lease to renew.
Reclaiming first would run the job again, or dead-letter it on its last attempt.
"""

from __future__ import annotations

import threading
import time
from typing import Optional, Sequence

from runledger_sync.config import JobsConfig
from runledger_sync.core.records import ReapedDeadLetter, ReapResult
from runledger_sync.core.types import JobContext, JobDeadLetterInfo, JobDeadLetterReason, RuntimeLoopExit
from runledger_sync.core.outcomes import lease_expired_failure
from runledger_sync.logging import get_logger, job_log_fields
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.health import REAP, LoopMarks
from runledger_sync.runtime.hooks import run_dead_letter_hook
from runledger_sync.runtime.loops.periodic import run_periodically
from runledger_sync.store.driver import Driver

log = get_logger(__name__)

REAPER_WORKER_ID = "reaper"
MAX_CONCURRENT_HOOKS = 8
#: How long hooks still running at shutdown are waited for.
SHUTDOWN_HOOK_WAIT_SECONDS = 0.25
#: How often a wait for hooks re-checks the shutdown event.
SHUTDOWN_CHECK_SECONDS = 0.05


def reap_once(driver: Driver, registry: JobRegistry, config: JobsConfig, shutdown: threading.Event) -> ReapResult:
    """Run one reaper batch and tell the handlers of the jobs it dead-lettered."""
    result = driver.reap_expired_leases(
        limit=config.claim_batch_size, default_retry_delay_ms=config.reaper_retry_delay_ms
    )
    if result.processed:
        log.info(
            "reaper recovered expired leases",
            extra={"processed": result.processed, "released_unstarted": result.released_unstarted,
                   "retried": result.retried, "dead_lettered": len(result.dead_lettered),
                   "failed_rows": result.failed_rows},
        )
    _notify_dead_letters(registry, config, result.dead_lettered, shutdown)
    return result


def _notify_dead_letters(
    registry: JobRegistry, config: JobsConfig, dead: Sequence[ReapedDeadLetter], shutdown: threading.Event
) -> None:
    failure = lease_expired_failure()
    info = JobDeadLetterInfo(failure=failure, reason=JobDeadLetterReason.LEASE_EXPIRED, max_attempts=None)
    calls = [(registry.get(record.job_type), record) for record in dead]
    calls = [(handler, record) for handler, record in calls if handler is not None]
    for start in range(0, len(calls), MAX_CONCURRENT_HOOKS):
        if shutdown.is_set():
            log.warning("reaper shutting down; remaining dead-letter hooks skipped",
                        extra={"skipped": len(calls) - start})
            return
        timeout = config.dead_letter_hook_timeout_seconds
        threads = []
        for handler, record in calls[start:start + MAX_CONCURRENT_HOOKS]:
            context = JobContext(job_id=record.job_id, run_number=record.run_number, attempt=record.attempt,
                                 organization_id=record.organization_id, worker_id=REAPER_WORKER_ID,
                                 job_type=record.job_type, meta=record.meta)
            fields = job_log_fields(job_id=record.job_id, job_type=record.job_type, run_number=record.run_number,
                                    attempt=record.attempt, organization_id=record.organization_id,
                                    worker_id=REAPER_WORKER_ID)
            thread = threading.Thread(
                target=run_dead_letter_hook, args=(handler, context, record.payload, info),
                kwargs={"timeout_seconds": timeout, "log_fields": fields}, daemon=True,
            )
            thread.start()
            threads.append(thread)
        if not _join_hooks(threads, shutdown):
            return


def _join_hooks(threads: Sequence[threading.Thread], shutdown: threading.Event) -> bool:
    """Wait for the hook threads; return False if shutdown cut the wait short.

    Each thread ends within the hook timeout on its own, but shutdown must not
    wait that long (seconds per batch): once it is asked for, the hooks get
    :data:`SHUTDOWN_HOOK_WAIT_SECONDS` more and are then abandoned (daemon threads).
    """
    pending = list(threads)
    while pending:
        pending[0].join(SHUTDOWN_CHECK_SECONDS)
        pending = [thread for thread in pending if thread.is_alive()]
        if pending and shutdown.is_set():
            give_up = time.monotonic() + SHUTDOWN_HOOK_WAIT_SECONDS
            for thread in pending:
                thread.join(max(0.0, give_up - time.monotonic()))
            still_running = sum(thread.is_alive() for thread in pending)
            if still_running:
                log.warning("reaper shutting down; abandoning dead-letter hooks still running",
                            extra={"abandoned": still_running})
            return False
    return True


def run_reaper_loop(
    driver: Driver, registry: JobRegistry, config: JobsConfig, shutdown_event: threading.Event,
    *, marks: Optional[LoopMarks] = None,
) -> RuntimeLoopExit:
    """Sweep expired leases every ``reaper_interval_seconds`` until shutdown.

    Args:
        driver: the supervisor's; each sweep runs on it.
        marks: where each sweep that did not fail is marked (the Supervisor's health).

    Returns:
        ``SHUTDOWN``, or ``INVALID_CONFIG`` at once when the reaper's settings are invalid.
    """
    comeback = _Comeback(config.heartbeat_interval)

    def sweep() -> None:
        if comeback.holds_off(driver):
            return
        try:
            reap_once(driver, registry, config, shutdown_event)
        except Exception:
            comeback.lost()
            raise

    return run_periodically("reaper", config.validate_reaper, sweep, config.reaper_interval_seconds, shutdown_event,
                            on_success=None if marks is None else lambda: marks.mark(REAP),
                            on_turn=None if marks is None else lambda: marks.turned("reaper"))


class _Comeback:
    """Holds the sweeps off for one heartbeat interval once the database answers after an outage."""

    def __init__(self, hold_seconds: float) -> None:
        self._hold_seconds = hold_seconds
        self._after_outage = False
        self._until = 0.0

    def lost(self) -> None:
        self._after_outage = True

    def holds_off(self, driver: Driver) -> bool:
        """True while the sweep must wait; raises (a failed step) while the database is still out of reach."""
        if self._after_outage:
            driver.ping()
            self._after_outage = False
            self._until = time.monotonic() + self._hold_seconds
            log.info("reaper back after an outage; giving workers a heartbeat interval to land outcomes first",
                     extra={"hold_seconds": self._hold_seconds})
        return time.monotonic() < self._until
