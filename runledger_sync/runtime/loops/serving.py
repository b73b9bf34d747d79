"""What a worker serves: the queues its config names must exist, and its row says what it serves while it runs.

The row (table ``job_workers``) is how an operator learns that nobody serves a
waiting job's queue or type (``jobs show``, :func:`runledger_sync.explain_wait`):
a worker writes it at start and again every :data:`WORKER_ROW_INTERVAL_SECONDS`,
well inside the minute after which a row counts as a worker gone, and deletes it
when it stops. Writing it is bookkeeping: a failure is logged and the worker
goes on claiming.
"""

from __future__ import annotations

import threading
from typing import Mapping, Optional

from runledger_sync.config import JobsConfig
from runledger_sync.core.errors import RunledgerError
from runledger_sync.core.queue_errors import QueueNotFound
from runledger_sync.logging import get_logger
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.loops.periodic import PeriodicThread
from runledger_sync.runtime.loops.pruning import Pruner
from runledger_sync.runtime.loops.sampling import Sampler
from runledger_sync.store.driver import Driver

log = get_logger(__name__)

#: Between two writes of a worker's row: a twelfth of the minute after which a row means a worker gone.
WORKER_ROW_INTERVAL_SECONDS = 5.0


def served_job_types(registry: JobRegistry, config: JobsConfig) -> list[str]:
    """The job types a worker with this config claims: the registered ones, or those of ``config.job_types``."""
    types = registry.registered_types()
    if config.job_types is None:
        return types
    wanted = set(config.job_types)
    return [job_type for job_type in types if job_type in wanted]


def check_queues_exist(
    driver: Driver, registry: JobRegistry, config: JobsConfig, *, sources: Optional[Mapping[str, str]] = None,
) -> None:
    """Refuse a config that names a queue nobody knows: its worker would wait for jobs that never come.

    A queue is known when it has a ``job_queues`` row, or when the registry
    declares it (``registry.queue``) or a job type joins it: ``sync_definitions``
    writes those. Reads nothing when the config names no queue. When the
    database does not answer, the check is skipped with a warning: the loops
    then wait for the database as they always do.

    Args:
        sources: how the message names where ``queues`` and ``queue_concurrency``
            came from (default ``jobs config queues``, ...): a command line names its options.

    Raises:
        QueueNotFound: ``config.queues`` or a key of ``config.queue_concurrency``
            names an unknown queue; ``details`` has the first one (``queue``) and
            the setting that names it (``setting``), the message every one.
    """
    named = {"queues": list(config.queues or ()), "queue_concurrency": sorted(config.queue_concurrency or {})}
    if not any(named.values()):
        return
    try:
        known = {queue.name for queue in driver.list_queues()}
    except RunledgerError as error:
        log.warning("queues of the jobs config not checked: the database did not answer",
                    extra={"worker_id": config.worker_id, "error": str(error)})
        return
    known |= {spec.name for spec in registry.queues} | {definition.queue for definition in registry.definitions()}
    for field, names in named.items():
        unknown = [name for name in names if name not in known]
        if unknown:
            source = (sources or {}).get(field, f"jobs config {field}")
            raise QueueNotFound(
                f"{source} names {'a queue' if len(unknown) == 1 else 'queues'} that "
                f"{'does' if len(unknown) == 1 else 'do'} not exist: {', '.join(map(repr, unknown))} "
                f"(known: {', '.join(sorted(known)) or 'none'}); a queue exists once a registry declares it "
                "(registry.queue) or a job type joins it, or once configure_queue() creates it",
                queue=unknown[0], setting=field)


class WorkerRow(PeriodicThread):
    """Keep a worker's ``job_workers`` row fresh on a thread of its own until shutdown, then delete it.

    Args:
        driver: one that owns its transactions: the row is written on its own pooled connections.
        registry, config: the worker's; the row names ``config.worker_id``, its
            ``queues`` (None: every queue) and the types it claims.
        shutdown_event: the supervisor's; once set the worker claims nothing
            more, so its row goes at once rather than when the drain ends.
        interval_seconds: between writes (None: :data:`WORKER_ROW_INTERVAL_SECONDS`).
    """

    def __init__(
        self, driver: Driver, registry: JobRegistry, config: JobsConfig, shutdown_event: threading.Event,
        *, interval_seconds: Optional[float] = None,
    ) -> None:
        self.driver = driver
        self.registry = registry
        self.config = config
        super().__init__(f"runledger-worker-row-{config.worker_id}", "worker row", self._write,
                         WORKER_ROW_INTERVAL_SECONDS if interval_seconds is None else interval_seconds, shutdown_event,
                         when_stopped=self._forget)

    def _write(self) -> None:
        # Read on each write, on this thread: a registry that fails to answer is
        # the worker loop's failure to report, not a reason to fail the start.
        self.driver.record_worker(self.config.worker_id, queues=self.config.queues,
                                  job_types=served_job_types(self.registry, self.config))

    def _forget(self) -> None:
        try:
            self.driver.forget_worker(self.config.worker_id)
        except Exception as error:  # noqa: BLE001 - a row left behind counts as a worker gone within a minute
            log.warning("worker row could not be removed",
                        extra={"worker_id": self.config.worker_id, "error": str(error)})


def start_upkeep(
    driver: Driver, registry: JobRegistry, config: JobsConfig, shutdown_event: threading.Event, prunes: bool,
) -> list[PeriodicThread]:
    """Start the worker's row; where ``prunes`` (the process reaps), the sampler and, with a retention, the pruner.

    ``driver`` must own its transactions: each of these threads runs its own.
    """
    started: list[PeriodicThread] = [WorkerRow(driver, registry, config, shutdown_event).start()]
    if prunes:
        started.append(Sampler(driver, config, shutdown_event).start())
    if prunes and config.retention is not None:
        started.append(Pruner(driver, config, shutdown_event).start())
    return started
