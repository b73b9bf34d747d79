"""The dashboard's sampler: once a minute closes, write it into the rollup the overview's charts read.

It runs in the process that runs the reaper, on a thread of its own beside the
loops, like the pruner. Each turn asks the store for the last closed minute
(:meth:`~runledger_sync.store.driver.Driver.sample_rollup`); the store writes it once,
under a lock one sampler holds at a time across every worker, so the others
find it written (or the lock taken) and wait for the next minute. Sampling is
upkeep: a failure is logged, tried again next turn, and never stops the worker.
"""

from __future__ import annotations

import threading
from typing import Optional

from runledger_sync.config import JobsConfig
from runledger_sync.logging import get_logger
from runledger_sync.runtime.loops.periodic import PeriodicThread
from runledger_sync.store.driver import Driver

log = get_logger(__name__)

#: Wait between turns when a turn failed, and the most a turn waits for the next minute.
INTERVAL_SECONDS = 60.0
#: The least a turn waits: the database's clock and this process's may differ a little.
MIN_WAIT_SECONDS = 1.0
#: Wait before the first turn: a deploy that restarts every worker does not start with a burst of samples.
FIRST_TURN_DELAY_SECONDS = 5.0


class Sampler(PeriodicThread):
    """Sample each closed minute on a thread of its own until shutdown.

    Args:
        driver: one that owns its transactions: each sample runs on its own pooled connection.
        config: the worker's (its ``worker_id`` names the thread).
        shutdown_event: the supervisor's.
        first_delay_seconds: wait before the first turn (None: :data:`FIRST_TURN_DELAY_SECONDS`).
    """

    def __init__(self, driver: Driver, config: JobsConfig, shutdown_event: threading.Event, *,
                 first_delay_seconds: Optional[float] = None) -> None:
        self.driver = driver
        super().__init__(f"runledger-sampler-{config.worker_id}", "sampler", self.sample_once, INTERVAL_SECONDS,
                         shutdown_event,
                         first_delay_seconds=FIRST_TURN_DELAY_SECONDS if first_delay_seconds is None else first_delay_seconds)

    def sample_once(self) -> float:
        """One turn; returns how soon the next minute is due."""
        sample = self.driver.sample_rollup()
        if sample.rows:
            log.debug("sampled the dashboard's minute", extra={"minute": sample.minute.isoformat(), "rows": sample.rows})
        return min(max(sample.next_in_seconds, MIN_WAIT_SECONDS), INTERVAL_SECONDS)
