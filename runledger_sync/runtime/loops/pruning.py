"""The pruner: delete finished jobs and workflow runs past ``JobsConfig.retention``, every few minutes.

It runs in the process that runs the reaper, on a thread of its own beside the
loops. Each turn prunes at most :data:`BATCHES_PER_TURN` batches (so shutdown
never waits for a long prune) and comes back at once while more is left. Its
batches are exclusive: one pruner works at a time across every worker, the
others find the lock taken and wait for their next turn. Pruning is upkeep: a
failure is logged, tried again next turn, and never stops the worker.
"""

from __future__ import annotations

import threading
from typing import Optional

from runledger_sync.config import JobsConfig
from runledger_sync.logging import get_logger
from runledger_sync.runtime.loops.periodic import PeriodicThread
from runledger_sync.store.driver import Driver

log = get_logger(__name__)

#: Batches one turn may run before it lets shutdown (and the other workers) in.
BATCHES_PER_TURN = 20
#: Smaller batches with a pause between them than rl.prune's default: with them the
#: live traffic's pickup p95 rose 1.9x and 2.2x during prunes of 100,000 and
#: 1,000,000 jobs, against 2.2-2.5x flat out (bench/retention.py, bench/README.md),
#: and some 5,000 jobs a second is ample upkeep.
BATCH_SIZE = 500
PAUSE_SECONDS = 0.05
#: Wait before the next turn when a turn stopped with rows left.
MORE_LEFT_SECONDS = 0.05
#: Most wait before the first turn (the interval, if shorter): a deploy that restarts
#: every worker does not start with a prune.
FIRST_TURN_DELAY_SECONDS = 30.0


class Pruner(PeriodicThread):
    """Prune on a thread of its own every ``config.prune_interval_seconds`` until shutdown.

    Args:
        driver: one that owns its transactions: each batch runs on its own pooled connection.
        config: the worker's; ``retention`` must not be None.
        shutdown_event: the supervisor's.
    """

    def __init__(self, driver: Driver, config: JobsConfig, shutdown_event: threading.Event) -> None:
        self.driver = driver
        self.config = config
        interval = float(config.prune_interval_seconds)
        super().__init__(f"runledger-pruner-{config.worker_id}", "pruner", self.prune_once, interval, shutdown_event,
                         validate=config.validate_pruner, first_delay_seconds=min(interval, FIRST_TURN_DELAY_SECONDS))

    def prune_once(self) -> Optional[float]:
        """One turn; returns how soon to come back (None: the interval)."""
        result = self.driver.prune(self.config.retention, batch_size=BATCH_SIZE, exclusive=True,
                       max_batches=BATCHES_PER_TURN, pause_seconds=PAUSE_SECONDS)
        if result.batches:
            log.info("pruned finished jobs and workflow runs",
                     extra={"jobs": result.total_jobs, "workflow_runs": result.workflow_runs,
                            "batches": result.batches, "elapsed_seconds": round(result.elapsed_seconds, 3)})
        return MORE_LEFT_SECONDS if not (result.complete or result.contended) else None
