"""Run the worker, reaper and scheduler loops together on one shutdown event.

If one loop ends on its own (an error, an invalid config), the others are
stopped and the failure is reported. Embed it with ``start()``/``stop()`` or
``with Supervisor(...)``; a script calls :meth:`Supervisor.run_until_shutdown`.
With ``processes=N`` (N > 1) the loops run in N child processes instead
(:mod:`runledger_sync.runtime.supervisor.processes`), for handlers that need CPU.

While the loops run, each worker keeps its row in ``job_workers`` (which queues
and types it serves, for an operator asking why a job waits) and deletes it when
it stops (:mod:`runledger_sync.runtime.loops.serving`); one that reaps also samples
the dashboard's minutes and prunes (``config.retention``).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Mapping, Optional, cast

from sqlalchemy.engine import Engine

from runledger_sync.config import JobsConfig
from runledger_sync.core.encryption import configure_encryption
from runledger_sync.core.errors import ConfigError
from runledger_sync.core.queue_errors import QueueNotFound
from runledger_sync.core.types import RuntimeLoopExit
from runledger_sync.logging import configure_logging, get_logger
from runledger_sync.loading import load_registry
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.supervisor.database_wait import check_wait_seconds, wait_for_database
from runledger_sync.runtime.health import (
    CLAIM,
    STALL_ALLOWANCE_SECONDS,
    DatabaseProbe,
    LoopHealth,
    LoopMarks,
    SupervisorHealth,
)
from runledger_sync.runtime.supervisor.loop_health import process_health, thread_health
from runledger_sync.runtime.observer import ProcessesObserver, WorkerObserver, follows_processes
from runledger_sync.runtime.supervisor.processes import CHECK_SECONDS, EXIT_REFUSED, ChildSpec, ProcessGroup, check_processes
from runledger_sync.runtime.supervisor.processes import log as process_log
from runledger_sync.runtime.loops.reaper import run_reaper_loop
from runledger_sync.runtime.loops.scheduler import run_scheduler_loop
from runledger_sync.runtime.loops.periodic import PeriodicThread
from runledger_sync.runtime.loops.serving import check_queues_exist, start_upkeep
from runledger_sync.store.driver import Driver, driver_for
from runledger_sync.runtime.worker.loop import run_worker_loop_on

log = get_logger(__name__)

Loop = Callable[[Driver, JobRegistry, JobsConfig, threading.Event], RuntimeLoopExit]
#: A claim that succeeded this recently (or within three poll intervals, if longer)
#: shows the database answers: readiness then asks it nothing.
CLAIM_EVIDENCE_SECONDS = 5.0
DEFAULT_DRAIN_TIMEOUT_SECONDS = 30.0
#: Beyond the drain deadline and the grace: time for the loops to close their connections and end.
STOP_MARGIN_SECONDS = 1.0
#: Exit status of a process stopped by a second signal, as shells report SIGINT.
FORCED_EXIT_STATUS = 130


class Supervisor:
    """Own the worker, reaper and scheduler threads of one process.

    Args:
        run_reaper: recover expired leases (any number may) and prune past ``config.retention`` here.
        run_scheduler: fire due cron schedules in this process (any number may:
            each due instant is enqueued once). False for processes that should only work.
        processes: 1 (the default) runs the loops as threads of this process. N > 1
            starts N worker processes, each with its own pool of
            ``max_global_concurrency`` threads and its own engine (same URL, pool size
            and execution options), worker ids ``<worker_id>-p0`` ... ``-p<N-1>``;
            the first also runs the reaper and scheduler. A child that dies is
            restarted (backoff 0.5-8 s; after 5 restarts within a minute, or a child
            that cannot load ``app``, all are stopped and :attr:`failure` says why).
        observer: told of each claimed batch, job end and group write of the
            worker (:class:`runledger_sync.metrics.WorkerMetrics` keeps Prometheus
            counters). With ``processes > 1`` it must also follow worker processes
            (:class:`~runledger_sync.runtime.observer.ProcessesObserver`, as WorkerMetrics does):
            each process then reports to an observer of its own that it asks for.
        app: with ``processes > 1``, where each worker process imports the registry:
            ``"module:attribute"`` naming a JobRegistry, or a callable returning
            one, with the same job types as ``registry``. Required then, since a
            registry object cannot be copied into another process.

    Raises:
        ConfigError: ``processes`` is not an int >= 1, or it is > 1 and ``app`` is
            missing, does not import, names no registry or one with other types,
            or is the ``__main__`` of an interactive session; or an ``observer`` that
            does not follow worker processes is given with ``processes > 1``.

    Example:
        ``with rl.Supervisor(engine, registry, rl.JobsConfig.from_env()): serve()``, or
        ``rl.Supervisor(engine, registry, config, processes=4, app="myapp.jobs:registry").run_until_shutdown()``
    """

    def __init__(
        self,
        engine: Engine,
        registry: JobRegistry,
        config: Optional[JobsConfig] = None,
        *,
        run_reaper: bool = True,
        run_scheduler: bool = True,
        processes: int = 1,
        app: Optional[str] = None,
        observer: Optional[WorkerObserver] = None,
    ) -> None:
        #: Every database operation of the loops and their helpers, on ``engine``.
        self.driver = driver_for(engine)
        self.registry = registry
        self.config = config if config is not None else JobsConfig.from_env()
        self.shutdown_event = threading.Event()
        #: Set when the drain deadline passes: the worker tells its running handlers to stop.
        self._stop_jobs = threading.Event()
        self._marks = LoopMarks()
        self._loops: dict[str, Loop] = {
            "worker": functools.partial(run_worker_loop_on, observer=observer, marks=self._marks,
                                        stop_jobs=self._stop_jobs),
        }
        if run_reaper:
            self._loops["reaper"] = functools.partial(run_reaper_loop, marks=self._marks)
        if run_scheduler:
            self._loops["scheduler"] = functools.partial(run_scheduler_loop, marks=self._marks)
        self._threads: list[threading.Thread] = []
        self._helpers: list[PeriodicThread] = []
        self._exits: dict[str, Any] = {}
        self._failure: Optional[str] = None
        self._probe = DatabaseProbe(self.driver)
        self.processes = check_processes(processes)
        if observer is not None and processes > 1 and not follows_processes(observer):
            raise ConfigError([f"this observer needs processes=1 (got {processes}): it has no "
                               "worker_process_observer() to give each worker process one of its own"])
        self._group = ProcessGroup(
            engine, registry, app, self.config, processes, run_reaper=run_reaper, run_scheduler=run_scheduler,
            shutdown_event=self.shutdown_event, child_main=child_main,
            observer=cast(Optional[ProcessesObserver], observer),  # follows_processes() said so
        ) if processes > 1 else None

    @property
    def failure(self) -> Optional[str]:
        """Why a loop (or a worker process) ended before it was asked to, or None."""
        return self._group.failure if self._group is not None else self._failure

    @property
    def exits(self) -> dict[str, Any]:
        """Each finished loop's RuntimeLoopExit (or the exception that ended it).

        With ``processes > 1``: each worker process's id -> its last exit status.
        """
        return self._group.exits if self._group is not None else dict(self._exits)

    @property
    def running(self) -> bool:
        if self._group is not None:
            return self._group.running
        return any(thread.is_alive() for thread in self._threads)

    def health(self, *, check_database: bool = True) -> SupervisorHealth:
        """Report whether each loop runs and keeps turning, when it last did its work, and whether the database answers.

        Liveness (:attr:`SupervisorHealth.live`, also ``healthy``) comes from the
        loops alone; readiness (:attr:`SupervisorHealth.ready`) adds the database.
        A claim of the last few seconds shows the database answers; otherwise one
        ``SELECT 1`` is sent on a connection of the health check's own, so a pool
        taken whole by jobs or by the application does not read as an outage, and
        the answer is waited for at most :data:`~runledger_sync.runtime.health.DATABASE_CHECK_SECONDS`.
        The answer never names the database: a failure is reported by its code.

        Args:
            check_database: ask the database (False reports ``database_reachable``
                as True without asking, for a liveness probe).

        Returns:
            A :class:`SupervisorHealth`: per loop (``worker``, ``reaper``,
            ``scheduler``, and ``listener`` when the worker LISTENs) whether it is
            alive, whether it stalled, and its last successful claim, sweep or tick;
            with ``processes > 1``, whether each worker process is alive.

        Example:
            ``status = sup.health(); status.live, status.ready, status.loops["worker"].last_success_at``
        """
        loops = self._thread_health() if self._group is None else process_health(self._group)
        error = self._database_error() if check_database else None
        return SupervisorHealth(loops=loops, database_reachable=error is None, database_error=error)

    def _database_error(self) -> Optional[str]:
        if self._group is None:
            since_claim = self._marks.seconds_since(CLAIM)
            evidence = max(CLAIM_EVIDENCE_SECONDS, 3 * self.config.poll_interval_ms / 1000.0)
            if since_claim is not None and since_claim <= evidence:
                return None
        return self._probe.check()

    def _thread_health(self) -> dict[str, LoopHealth]:
        threads = dict(zip(self._loops, self._threads, strict=False))  # no threads before start()
        return thread_health(self._loops, threads, self._exits, self._marks, self.config, STALL_ALLOWANCE_SECONDS)

    def wait_for_database(self, timeout_seconds: Optional[float] = None) -> bool:
        """Wait until the database answers: return True then, False if shutdown was asked for first.

        A database (or PgBouncer) that refuses connections is tried again with a backoff
        capped at 2 s, logging "waiting for the database" every 5 s (the URL without its
        password, the driver's error).

        Args:
            timeout_seconds: How long to wait; None (the default) for ever, 0 for one try.

        Raises:
            DatabaseWaitTimeout: It did not answer in time (``db.wait_timeout``).
            ConfigError: ``timeout_seconds`` is not a number of seconds >= 0.
        """
        return wait_for_database(self.driver, timeout_seconds=check_wait_seconds(timeout_seconds),
                                 stop=self.shutdown_event)

    def check_queues(self, *, sources: Optional[Mapping[str, str]] = None) -> None:
        """Raise QueueNotFound if ``config.queues`` or ``queue_concurrency`` names a queue that does not exist.

        :meth:`start` calls it; call it first to refuse before writing anything (``runledger-sync
        worker`` does, before its sync). See :func:`~runledger_sync.runtime.loops.serving.check_queues_exist`.
        """
        check_queues_exist(self.driver, self.registry, self.config, sources=sources)

    def start(self, *, drain_timeout: float = DEFAULT_DRAIN_TIMEOUT_SECONDS) -> "Supervisor":
        """Start the loops in background threads; return at once.

        Args:
            drain_timeout: With ``processes > 1``, how long a worker process that finds
                this one gone (killed) lets its jobs finish before it tells them to stop,
                as :meth:`stop` would; :meth:`run_until_shutdown` passes its own.

        Raises:
            ConfigError: the config does not validate.
            QueueNotFound: the config names a queue that does not exist (:meth:`check_queues`).
        """
        if self._threads or (self._group is not None and self._group.started):
            raise RuntimeError("this Supervisor was already started")
        self.config.validate()
        # Before any claim: a worker of a misspelt queue would look healthy and run nothing.
        self.check_queues()
        if self._group is not None:
            # The parent logs the environment's adjustments once; its children do not.
            for adjustment in self.config.env_adjustments:
                log.warning(adjustment.describe(), extra=adjustment.log_fields())
            self._group.start(drain_timeout_seconds=drain_timeout)
            log.info("supervisor started", extra={"worker_id": self.config.worker_id, "processes": self.processes})
            return self
        for name, loop in self._loops.items():
            thread = threading.Thread(target=self._run, args=(name, loop), name=f"runledger-{name}", daemon=True)
            self._threads.append(thread)
            thread.start()
        if self.driver.owns_transactions:  # a caller's Connection must not be shared with another thread
            self._helpers = start_upkeep(self.driver, self.registry, self.config, self.shutdown_event,
                                         prunes="reaper" in self._loops)
        log.info("supervisor started", extra={"worker_id": self.config.worker_id, "loops": list(self._loops)})
        return self

    def _run(self, name: str, loop: Loop) -> None:
        try:
            exit_reason: Any = loop(self.driver, self.registry, self.config, self.shutdown_event)
        except BaseException as error:  # noqa: BLE001 - reported, then the other loops stop
            exit_reason = error
            log.error(f"{name} loop crashed", extra={"error": repr(error)}, exc_info=error)
        self._exits[name] = exit_reason
        if not self.shutdown_event.is_set():
            self._failure = f"{name} loop ended unexpectedly: {exit_reason!r}"
            log.error("a runtime loop ended early; stopping the others", extra={"loop": name, "exit": repr(exit_reason)})
            self.shutdown_event.set()

    def stop(self, timeout: float = DEFAULT_DRAIN_TIMEOUT_SECONDS) -> bool:
        """Stop claiming at once, let in-flight jobs finish for up to ``timeout`` seconds, then stop them.

        At the deadline every running handler is told to stop (its cancellation
        flag, which wakes ``ctx.wait_cancelled``) and gets
        ``config.timeout_grace_seconds`` to return. One that stops when told
        (raises ``JobCancelled``) is queued again without spending an attempt
        (``job.worker_shutdown``); one that returns or raises anything else has
        that outcome written. Nothing is written for a handler still running
        after the grace: its job keeps its lease, and the reaper gives it to a
        worker once the lease runs out (spec: a bounded shutdown aborts
        stragglers; the expired attempt counts as the reaper's LEASE_EXPIRED).
        This returns within ``timeout`` plus the grace plus about a second.

        Returns:
            True if every job finished before the deadline. False when some had
            to be stopped (or the loops did not end in time); a handler that
            ignored its flag keeps its daemon thread until it returns, and its
            result is not written.
        """
        try:
            if self._group is not None:
                return _stop_group(self._group, timeout, self.config.timeout_grace_seconds)
            self.shutdown_event.set()
            drained = self._join(timeout)
            if not drained:
                self._stop_jobs.set()
                self._join(self.config.timeout_grace_seconds + STOP_MARGIN_SECONDS)
                if self.running:
                    log.warning("supervisor stop timed out with loops still running",
                                extra={"timeout_seconds": timeout})
            for helper in self._helpers:
                # The row was deleted and the prune stopped when shutdown was set; this waits for that.
                helper.join(STOP_MARGIN_SECONDS)
            return drained
        finally:
            self._probe.close()

    def interrupt_jobs(self) -> None:
        """Tell the running jobs to stop now, as :meth:`stop` does at its deadline (call it after ``stop`` began)."""
        self._stop_jobs.set()

    def _join(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not self.running

    def run_until_shutdown(self, drain_timeout: float = DEFAULT_DRAIN_TIMEOUT_SECONDS, *,
                           wait_for_database_seconds: Optional[float] = None) -> int:
        """Run in the foreground until SIGINT/SIGTERM; return a process exit status.

        First it waits for the database as :meth:`wait_for_database` does, for
        ``wait_for_database_seconds`` (None: for ever; a signal ends the wait, and the run).

        The first signal stops claiming and drains in-flight jobs for up to
        ``drain_timeout`` seconds; then running jobs are told to stop, as
        :meth:`stop` says, and the process returns within the drain timeout plus
        ``timeout_grace_seconds`` plus a second or two. A second signal exits at
        once (leases left behind are recovered by the reaper). With
        ``processes > 1`` each child is sent SIGTERM on the first signal, SIGUSR1
        (stop your jobs) at the deadline and SIGKILL on a second signal or when
        it still runs after the grace.

        Returns:
            0 after a clean stop, 1 when a loop failed or the drain timed out.

        Raises:
            DatabaseWaitTimeout: The database did not answer within ``wait_for_database_seconds``.
        """
        signals = {"count": 0}

        def on_signal(signum: int, _frame: Any) -> None:
            signals["count"] += 1
            if signals["count"] == 1:
                log.info("shutdown signal received; draining", extra={"signal": signal.Signals(signum).name})
                self.shutdown_event.set()
            else:
                log.warning("second shutdown signal; exiting now", extra={"signal": signal.Signals(signum).name})
                if self._group is not None:
                    self._group.kill()
                os._exit(FORCED_EXIT_STATUS)

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            if not self.wait_for_database(wait_for_database_seconds):
                return 0
            self.start(drain_timeout=drain_timeout)
            while not self.shutdown_event.wait(0.2):
                pass
            stopped = self.stop(drain_timeout)
            if not stopped and self._group is not None:
                # Their leases expire and the reaper gives the jobs to another worker.
                self._group.kill()
                self._group.stop(timeout=10)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 0 if stopped and self.failure is None else 1

    def __enter__(self) -> "Supervisor":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def child_main(spec: ChildSpec) -> None:
    """A child process's body: run one Supervisor until SIGTERM or the parent's death.

    :class:`~runledger_sync.runtime.supervisor.processes.ProcessGroup` starts it in each
    child; it logs as that module does, the child's lines beside the group's.
    """
    # Ctrl-C reaches the whole process group; the parent alone decides what it means.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Before the app is imported: an observer may need to set this process up before any metric exists.
    observer = spec.observer() if spec.observer is not None else None
    configure_encryption(spec.encryption)
    if spec.logging is not None:
        setup = dict(spec.logging)
        configure_logging(level=setup["level"], json=setup["json"], stream=getattr(sys, setup["stream_name"]),
                          job_lines=setup["job_lines"])
    try:
        registry = load_registry(spec.app)
    except ConfigError as error:
        process_log.error("worker process could not load its app",
                          extra={"worker_id": spec.config.worker_id, "error": str(error)})
        sys.exit(EXIT_REFUSED)
    engine = spec.engine.build()
    supervisor = Supervisor(engine, registry, spec.config, run_reaper=spec.run_reaper,
                            run_scheduler=spec.run_scheduler, observer=observer)

    def on_sigterm(_signum: int, _frame: Any) -> None:
        if not supervisor.shutdown_event.is_set():
            process_log.info("shutdown signal received; draining", extra={"worker_id": spec.config.worker_id})
        supervisor.shutdown_event.set()

    def on_sigusr1(_signum: int, _frame: Any) -> None:
        supervisor.interrupt_jobs()

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGUSR1, on_sigusr1)
    try:
        supervisor.start()
    except (ConfigError, QueueNotFound) as error:
        process_log.error("worker process refused its config",
                          extra={"worker_id": spec.config.worker_id, "error": str(error)})
        sys.exit(EXIT_REFUSED)
    process_log.info("worker process started",
                     extra={"worker_id": spec.config.worker_id, "pid": os.getpid(), "index": spec.index})
    orphaned = False
    while not supervisor.shutdown_event.wait(CHECK_SECONDS):
        if os.getppid() != spec.parent_pid:
            orphaned = True
            process_log.warning("parent process is gone; draining", extra={"worker_id": spec.config.worker_id})
            supervisor.shutdown_event.set()
    # With a parent, no deadline here: it keeps it, sends SIGUSR1 when it passes and kills a child
    # that outlives the grace. Without one, nobody else would end the drain.
    supervisor.stop(timeout=spec.drain_timeout_seconds if orphaned else threading.TIMEOUT_MAX)
    engine.dispose()
    sys.exit(0 if supervisor.failure is None else 1)


def _stop_group(group: ProcessGroup, timeout: float, grace: float) -> bool:
    drained = group.stop(timeout)
    if not drained:
        log.warning("drain deadline reached with worker processes still draining; telling their jobs to stop",
                    extra={"timeout_seconds": timeout})
        group.stop_jobs()
        group.stop(grace + STOP_MARGIN_SECONDS)
    return drained
