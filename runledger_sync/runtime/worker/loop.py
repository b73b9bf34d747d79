"""The polling thread: claim due jobs into free slots and hand each to a pool thread.

This is the seed's ``run_worker_loop``. A full batch loops at once; a short or
empty one waits ``poll_interval_ms`` (jittered, cut short when a slot frees up
or shutdown is asked for). A failed claim is logged and tried again next turn.

On the worker's own connection the claim and the jobs' running write go out
together (:func:`~runledger_sync.store.driver.claim_and_start_jobs`), and
each job that comes back RUNNING goes straight to a pool thread.

While the queue is backed up (the last claim came back full), slots free one by
one, and claiming each at once would cost a claim and a running write, each
with its commit, per job. The loop then waits a moment (``CLAIM_GATHER_SECONDS``) for a whole
batch of slots, so jobs are claimed and written in groups. Slots free in groups
too (a success group commits several jobs at once), so waiting for the whole
batch rather than part of it keeps jobs that were claimed together moving
together through their running and success writes. It waits only while the
handlers' recent pace says enough slots will free in time: for long jobs the
claim takes what is free at once.

An idle worker also LISTENs (:mod:`runledger_sync.runtime.worker.listener`), so a job
enqueued for one of its types ends the pause at once instead of at the next
poll; without the listener (lost, or turned off) it simply polls. The listener
also hears operators' cancels, and the polling thread stops the canceled jobs'
handlers at once (:mod:`runledger_sync.runtime.attempt.cancels`); without it each
handler learns of its cancel at its next lease renewal.
"""

from __future__ import annotations

import random
from functools import partial
import threading
import time
from queue import SimpleQueue
from typing import Any, Callable, Optional

from sqlalchemy.engine import Engine

from runledger_sync.config import JobsConfig
from runledger_sync.core.errors import ConfigError
from runledger_sync.core.outcomes import LEFT_BEHIND
from runledger_sync.core.records import JobRecord
from runledger_sync.core.types import RuntimeLoopExit
from runledger_sync.logging import get_logger
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.attempt.cancels import cancel_running
from runledger_sync.runtime.attempt.run import WRITE_RUNNING, process_claimed_job
from runledger_sync.runtime.attempt.state import Decider, RunningHandlers
from runledger_sync.runtime.health import CLAIM, LoopMarks
from runledger_sync.runtime.attempt.completer import Completer
from runledger_sync.runtime.worker.listener import JobListener
from runledger_sync.runtime.observer import WorkerObserver
from runledger_sync.runtime.attempt.completer import FinishingSoon
from runledger_sync.runtime.worker.queue_limits import QueueLimitsWatch
from runledger_sync.runtime.worker.tally import OutcomeTally
from runledger_sync.runtime.attempt.watch import TimerThread
from runledger_sync.store.driver import Driver, driver_for

log = get_logger(__name__)

#: How often a wait re-checks the caller's shutdown event.
SHUTDOWN_CHECK_SECONDS = 0.05
#: Poll waits vary by up to this share, so many workers do not claim in lockstep.
POLL_JITTER = 0.1
#: Whether workers LISTEN for enqueue notifications by default (``listen=`` overrides it).
LISTEN_BY_DEFAULT = True
#: While backed up, how long a claim may wait for more slots to free. Short next
#: to any real job, long next to a no-op one's few hundred microseconds.
CLAIM_GATHER_SECONDS = 0.002
#: An idle worker's listener is probed at most this often (or once per poll interval, if longer).
PROBE_INTERVAL_SECONDS = 1.0


class WorkerLoop:
    """One polling turn at a time (:meth:`turn`), so tests can drive the loop step by step.

    Args:
        driver: every database operation of the worker. On one that owns its
            transactions (an Engine's) each commits its own; in a caller's
            transaction (a Connection's) the worker just polls, and its jobs write
            one by one in that transaction.
    """

    claim_gather_seconds = CLAIM_GATHER_SECONDS

    def __init__(
        self, driver: Driver, registry: JobRegistry, config: JobsConfig, shutdown: threading.Event,
        *, listen: bool = LISTEN_BY_DEFAULT, observer: Optional[WorkerObserver] = None,
        marks: Optional[LoopMarks] = None, stop_jobs: Optional[threading.Event] = None,
    ) -> None:
        self.driver = driver
        self.registry = registry
        self.config = config
        self.shutdown = shutdown
        types = registry.registered_types()
        if config.job_types is not None:
            types = [t for t in types if t in set(config.job_types)]
        self.job_types = types
        #: Claimed jobs whose attempt has not ended yet: each holds a slot.
        self.in_flight = 0
        #: This worker's own cap per queue (``queue_concurrency``), and its jobs in flight of each.
        self.queue_caps: dict[str, int] = dict(config.queue_concurrency or {})
        self.in_flight_by_queue: dict[str, int] = dict.fromkeys(self.queue_caps, 0)
        self.queue_limits = QueueLimitsWatch(config.queues, config.worker_id)
        self._lock = threading.Lock()
        self._slot_freed = threading.Event()
        #: Set when the drain deadline has come: running handlers are told to stop.
        self.stop_jobs = stop_jobs
        #: Attempts whose handler is running now, by job id.
        self.handlers_running = RunningHandlers()
        #: The runner threads. Daemons: a handler that ignores its cancellation
        #: must not hold the process past its shutdown.
        self._runner_threads: list[threading.Thread] = []
        # The pool's threads each run one job after another, taken from this queue:
        # a future per job, and the callback that freed its slot, cost more than
        # a no-op job's own work. A runner is started only when none is idle.
        self._tasks: SimpleQueue[Optional[tuple[Callable[..., None], Any, Any]]] = SimpleQueue()
        self._runners = 0
        self._idle_runners = 0
        #: Each runner's heartbeat timer thread, made when the runner starts and kept.
        self._timers: list[TimerThread] = []
        # Claims come every few milliseconds under load: one connection kept for them
        # spares each a pool checkout and its pre-ping.
        self.claims = self.driver.held()
        self.listener = (
            JobListener(driver, types, worker_id=config.worker_id, probe_bind=self.claims,
                        probe_interval_seconds=max(PROBE_INTERVAL_SECONDS, config.poll_interval_ms / 1000.0),
                        on_canceled=partial(cancel_running, self.handlers_running))
            if listen and types and self.driver.listens else None
        )
        #: Told of each claimed batch, job end and group write; None when metrics are off.
        self.observer = observer
        #: Where a successful claim is marked, for the supervisor's health.
        self.marks = marks
        if marks is not None:
            marks.listener = self.listener
        #: True while the last claim came back full: more jobs are due than slots.
        self.backlogged = False
        self.gather_target = min(config.claim_batch_size, config.max_global_concurrency)
        #: How attempts ended, logged as a summary a minute rather than a line a job.
        self.tally = OutcomeTally(config.worker_id, observer)
        #: The batching policy: how many running jobs succeed soon (the claim's gather
        #: wait and the completer's linger both ask it).
        self.finishing = FinishingSoon()
        #: The writer of every job's outcome; None when polling on a caller's connection.
        self.completer = Completer(
            self.driver, f"runledger-completer-{config.worker_id}", max_output_bytes=config.max_output_bytes,
            max_checkpoint_bytes=config.max_payload_bytes,
            finishing=self.finishing, observer=observer,
        ) if self.driver.owns_transactions else None

    @property
    def free_slots(self) -> int:
        return self.config.max_global_concurrency - self.in_flight

    def turn(self) -> bool:
        """Claim and dispatch once; return True when the batch was full (loop again at once)."""
        # Cleared before counting free slots, so a job finishing from here on
        # cuts the following pause short instead of being missed.
        self._slot_freed.clear()
        self.tally.report_if_due()
        if self.backlogged:
            # A backed-up worker never pauses, where the listener is otherwise read.
            if self.listener is not None:
                self.listener.read_while_busy()
            self._gather_free_slots()
        limit = min(self.free_slots, self.config.claim_batch_size)
        if not self.job_types or limit <= 0:
            return False
        started = time.monotonic()
        claim: dict[str, Any] = {
            "worker_id": self.config.worker_id, "lease_ttl_seconds": self.config.lease_ttl_seconds, "limit": limit,
            "job_types": self.job_types, "event_log": self.config.event_log, "queues": self.config.queues,
            "queue_rooms": self._queue_rooms(), "unlimited_only": not self.queue_limits.limited(self.claims),
        }
        try:
            batch = self.claims.claim_and_start_jobs(**claim)
        except Exception as error:  # noqa: BLE001 - a failed claim must never stop the loop
            log.warning("worker claim failed", extra={"worker_id": self.config.worker_id, "error": str(error)})
            self.backlogged = False
            return False
        claimed = batch.running + batch.unstarted
        if self.marks is not None:
            self.marks.mark(CLAIM)
        if self.observer is not None:
            self.observer.claimed(claimed)
            if batch.running:
                # The running write went out with the claim: timed with it.
                self.observer.group_written("running", len(batch.running), time.monotonic() - started)
        with self._lock:
            self.in_flight += len(claimed)
            self.finishing.running = self.in_flight
            for job in claimed:
                if job.queue in self.in_flight_by_queue:
                    self.in_flight_by_queue[job.queue] += 1
        for job in batch.running:
            self._dispatch(self._process, job, None)
        # Claimed on a caller's connection, each job's pool thread writes its running.
        # After a running write that failed or may not have landed, it checks and
        # hands the claim back unless it landed.
        unstarted = WRITE_RUNNING if batch.error is None else batch.error
        for job in batch.unstarted:
            self._dispatch(self._process, job, unstarted)
        self.backlogged = len(claimed) == limit
        return self.backlogged

    def _queue_rooms(self) -> Optional[dict[str, int]]:
        """How many more jobs of each capped queue this worker may take (None: no queue is capped)."""
        if not self.queue_caps:
            return None
        with self._lock:
            return {queue: max(0, cap - self.in_flight_by_queue[queue]) for queue, cap in self.queue_caps.items()}

    def _gather_free_slots(self) -> None:
        """Wait up to the gather time for ``gather_target`` free slots, while they can still come in time."""
        deadline = time.monotonic() + self.claim_gather_seconds
        while not self.shutdown.is_set():
            free = self.free_slots
            if free >= self.gather_target:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0 or free + self._freeing_within(remaining) < self.gather_target:
                return
            self._slot_freed.wait(remaining)
            self._slot_freed.clear()

    def _freeing_within(self, seconds: float) -> int:
        """How many busy slots should free within ``seconds``.

        Jobs of 100 ms at concurrency 32 free one slot every 3 ms or so, so a
        wait for a batch of them would only leave slots idle.
        """
        if self.completer is None:
            return self.in_flight
        return self.finishing.within(seconds)

    def _dispatch(self, task: Callable[..., None], first: Any, second: Any = None) -> None:
        """Run ``task(first, second)`` on a pool thread: an idle runner, or a new one."""
        with self._lock:
            start_runner = self._idle_runners == 0
            if start_runner:
                self._runners += 1
            else:
                self._idle_runners -= 1
        self._tasks.put((task, first, second))
        if start_runner:
            runner = threading.Thread(target=self._run_tasks, daemon=True,
                                      name=f"runledger-job-{self.config.worker_id}-{len(self._runner_threads)}")
            self._runner_threads.append(runner)
            runner.start()

    def _run_tasks(self) -> None:
        """A pool thread's life: run queued tasks one after another until told to stop."""
        timer = TimerThread(f"runledger-heartbeat-{threading.current_thread().name}")
        with self._lock:
            self._timers.append(timer)
        tasks = self._tasks
        while True:
            entry = tasks.get()
            if entry is None:
                return
            task, first, second = entry
            try:
                task(first, second, timer)
            except BaseException as error:  # noqa: BLE001 - one job's crash must not end the runner
                log.error("job task crashed", extra={"worker_id": self.config.worker_id, "error": repr(error)},
                          exc_info=error)
            with self._lock:
                self._idle_runners += 1

    def _process(self, job: JobRecord, running: object, timer: TimerThread) -> None:
        """Run one job on this pool thread; its slot is freed when its attempt ends."""
        process_claimed_job(self.driver, self.registry, job, self.config, self.completer, running, timer, self.tally,
                            on_ended=partial(self._slot_ended, job.queue),
                            handlers_running=self.handlers_running)

    def _slot_ended(self, queue: str) -> None:
        with self._lock:
            self.in_flight -= 1
            self.finishing.running = self.in_flight
            if queue in self.in_flight_by_queue:
                self.in_flight_by_queue[queue] -= 1
        if not self._slot_freed.is_set():  # setting an Event takes its Condition: skip it when nobody cleared it
            self._slot_freed.set()

    def pause(self) -> None:
        """Wait one jittered poll interval, or less when a slot frees up, a job is enqueued or shutdown is asked for."""
        seconds = self.config.poll_interval_ms / 1000.0
        seconds *= 1 + random.uniform(-POLL_JITTER, POLL_JITTER)  # noqa: S311 - jitter, not security
        deadline = time.monotonic() + seconds
        listener = self.listener
        if listener is not None and self.free_slots > 0:
            # Idle: a LISTEN that stopped delivering is noticed within a probe interval or two.
            listener.probe()
        while not self.shutdown.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if listener is not None and listener.connect_if_due():
                # (Re)connected: jobs enqueued before the LISTEN took effect notified
                # nobody, so claim once more before waiting.
                return
            step = min(remaining, SHUTDOWN_CHECK_SECONDS)
            if listener is not None and listener.connected and self.free_slots > 0:
                # The last claim came back short, so only new work (a notification)
                # or the poll can give the next claim something; a freed slot is
                # noticed within one step.
                if listener.wait(step) or self._slot_freed.is_set():
                    return
            else:
                # No slot to fill (or no listener): a notification could not be acted
                # on, so wait for a slot, and drop notifications so none pile up.
                if self._slot_freed.wait(step):
                    return
                if listener is not None:
                    listener.read_while_busy()

    def drain(self) -> None:
        """Wait for every in-flight job to finish, or until ``stop_jobs`` is set; then stop the loop's threads.

        The supervisor keeps the deadline and sets ``stop_jobs`` when it passes:
        each running handler is then told to stop (its cancellation flag, which
        wakes ``ctx.wait_cancelled``) and gets ``timeout_grace_seconds``. One that
        stops when told is queued again without spending an attempt. A job still
        running after that keeps its daemon thread and is left behind: nothing is
        written for it, whatever it returns later, and the reaper recovers it once
        its lease runs out.
        """
        if self.in_flight:
            log.info("worker shutdown requested; draining in-flight jobs",
                     extra={"worker_id": self.config.worker_id, "in_flight": self.in_flight})
        stop_jobs = self.stop_jobs
        while self.in_flight > 0 and not (stop_jobs is not None and stop_jobs.is_set()):
            self._slot_freed.wait(SHUTDOWN_CHECK_SECONDS)
            self._slot_freed.clear()
            if self.listener is not None:
                self.listener.read_while_busy()  # an operator may cancel a job the drain waits for
        if self.listener is not None:
            self.listener.close()
        if self.in_flight > 0:
            self._stop_running_handlers()
        left_behind = self.in_flight > 0
        if not left_behind:
            for _ in range(self._runners):
                self._tasks.put(None)
            for runner in self._runner_threads:
                runner.join()
            for timer in self._timers:
                timer.close()
        self.tally.report()
        if self.completer is not None:
            self.completer.close()
        self.claims.close()

    def _stop_running_handlers(self) -> None:
        """Tell every running handler to stop, and wait up to the grace period for the jobs in flight."""
        grace = self.config.timeout_grace_seconds
        log.warning("drain deadline reached; telling running jobs to stop", extra={
            "worker_id": self.config.worker_id, "in_flight": self.in_flight, "grace_seconds": grace})
        deadline = time.monotonic() + grace
        while True:
            # Again each step: a job whose running write was in flight meanwhile starts its handler late.
            for attempt in list(self.handlers_running):
                attempt.interrupt()
            remaining = deadline - time.monotonic()
            if self.in_flight <= 0 or remaining <= 0:
                break
            self._slot_freed.wait(min(remaining, SHUTDOWN_CHECK_SECONDS))
            self._slot_freed.clear()
        for attempt in list(self.handlers_running):
            # Its late return must not be written (the completer closes as the worker exits), and its
            # watch stops renewing (a timer still watching would also hold its close() up).
            if attempt.take(Decider.DRAIN):
                attempt.ended_with(LEFT_BEHIND)
            log.warning("job ignored its cancellation past the shutdown grace; leaving its lease to the reaper",
                        extra=attempt.log_fields | {"grace_seconds": grace})


def run_worker_loop(
    engine: Engine, registry: JobRegistry, config: JobsConfig, shutdown_event: threading.Event,
    *, listen: bool = LISTEN_BY_DEFAULT, observer: Optional[WorkerObserver] = None, marks: Optional[LoopMarks] = None,
    stop_jobs: Optional[threading.Event] = None,
) -> RuntimeLoopExit:
    """Run the worker until ``shutdown_event`` is set, then drain in-flight jobs.

    Args:
        listen: LISTEN for enqueue notifications so an idle worker starts new jobs
            at once; False leaves only the poll.
        observer: told of each claimed batch, job end and group write (e.g.
            :class:`runledger_sync.metrics.WorkerMetrics`); None keeps no metrics.
        marks: where each successful claim is marked (the Supervisor's health).
        stop_jobs: set once the drain has lasted long enough: running handlers are
            told to stop and the drain ends after ``timeout_grace_seconds``
            (:meth:`WorkerLoop.drain`). None drains for as long as the jobs run.

    Returns:
        ``RuntimeLoopExit.SHUTDOWN`` after a drain, or ``INVALID_CONFIG`` at once
        (nothing claimed) when the config does not validate.

    Example:
        ``rl.run_worker_loop(engine, registry, rl.JobsConfig(), threading.Event())``
    """
    return run_worker_loop_on(driver_for(engine), registry, config, shutdown_event, listen=listen, observer=observer,
                              marks=marks, stop_jobs=stop_jobs)


def run_worker_loop_on(
    driver: Driver, registry: JobRegistry, config: JobsConfig, shutdown_event: threading.Event,
    *, listen: bool = LISTEN_BY_DEFAULT, observer: Optional[WorkerObserver] = None, marks: Optional[LoopMarks] = None,
    stop_jobs: Optional[threading.Event] = None,
) -> RuntimeLoopExit:
    """:func:`run_worker_loop` on a driver the caller made (the Supervisor's, shared with its other loops)."""
    # Once per start, before anything else: a value the environment gave that is
    # not the one in use must not go unnoticed (the spec's fallback is silent).
    for adjustment in config.env_adjustments:
        log.warning(adjustment.describe(), extra=adjustment.log_fields())
    try:
        config.validate_worker_loop()
        _check_job_types(config, registry)
    except ConfigError as error:
        log.warning("invalid jobs config; stopping worker loop", extra={"error": str(error)})
        return RuntimeLoopExit.INVALID_CONFIG
    loop = WorkerLoop(driver, registry, config, shutdown_event, listen=listen, observer=observer, marks=marks,
                      stop_jobs=stop_jobs)
    log.info("worker started", extra={"worker_id": config.worker_id, "job_types": loop.job_types,
                                      "max_global_concurrency": config.max_global_concurrency,
                                      "listen": loop.listener is not None})
    if listen and driver.owns_transactions and not driver.listens:
        log.info("pool mode transaction: no LISTEN; idle workers poll", extra={
            "worker_id": config.worker_id, "poll_interval_ms": config.poll_interval_ms,
            "pool_mode": driver.pool_mode,
        })
    try:
        while not shutdown_event.is_set():
            if marks is not None:
                marks.turned("worker")
            if not loop.turn():
                loop.pause()
    finally:
        loop.drain()
    return RuntimeLoopExit.SHUTDOWN


def _check_job_types(config: JobsConfig, registry: JobRegistry) -> None:
    # A type no handler serves would be dropped from the claim, and its jobs would
    # wait for ever while the worker looked healthy: a typo must stop the start.
    unknown = sorted(set(config.job_types or ()) - set(registry.registered_types()))
    if unknown:
        raise ConfigError([
            f"jobs config job_types names types no handler is registered for: {', '.join(unknown)}; "
            f"registered: {', '.join(registry.registered_types()) or 'none'}"
        ])
