"""The watch of a running attempt: renew its lease, enforce its deadline, notice an operator's cancel.

It runs on the pool thread's timer thread from the first renewal or the
deadline on. Whichever of it and the pool thread decides first takes the
attempt's one outcome (:meth:`Attempt.take`); a lost lease writes nothing.
"""

from __future__ import annotations

import math
import threading
import time
from concurrent import futures
from concurrent.futures import Future
from queue import SimpleQueue
from typing import Any, Callable, Optional, TypeVar


from runledger_sync.core.errors import LeaseOwnerMismatch, RunledgerError
from runledger_sync.core.outcomes import (
    LEASE_OWNER_MISMATCH_CODE,
    MAINTENANCE_LOST,
    LeaseLost,
    timeout_failure,
)
from runledger_sync.core.store_errors import ConnectionFailed
from runledger_sync.logging import get_logger
from runledger_sync.runtime.attempt.state import Attempt, Decider
from runledger_sync.runtime.attempt.cancels import canceled_reason, stop_canceled
from runledger_sync.runtime.attempt.completer import with_retries
from runledger_sync.runtime.attempt.decision import finish

log = get_logger(__name__)

T = TypeVar("T")

#: How long a renewal still in flight when the lease ran out may take to answer,
#: so the lost attempt is logged with the database's reason when it has one.
LATE_RENEWAL_ANSWER_SECONDS = 1.0
#: How often a watchdog waiting on a renewal looks whether the attempt has ended.
RENEWAL_JOIN_STEP_SECONDS = 0.05


def deadline_of(attempt: Attempt, started: float) -> float:
    return started + max(1, attempt.job.timeout_seconds)


def watch(attempt: Attempt, timer: TimerThread, started: float, next_beat: float) -> None:
    """Renew the lease, enforce the deadline, and after the grace period write the timeout."""
    try:
        _watch_until_done(attempt, timer, started, next_beat)
    except Exception as error:  # noqa: BLE001 - logged with the job's fields; the timer goes on
        log.exception("job watch crashed; its lease is no longer renewed",
                      extra=attempt.log_fields | {"error": repr(error)})


def _watch_until_done(attempt: Attempt, timer: TimerThread, started: float, next_beat: float) -> None:
    config = attempt.config
    interval = config.heartbeat_interval
    deadline = deadline_of(attempt, started)
    give_up = deadline + config.timeout_grace_seconds
    while True:
        now = time.monotonic()
        wake_at = min(next_beat, give_up if attempt.deadline_passed else deadline)
        if attempt.wait_decided(max(0.0, wake_at - now)):
            return
        now = time.monotonic()
        if now >= deadline and not attempt.deadline_passed:
            attempt.pass_deadline()
            log.warning("job exceeded its timeout; cancellation requested", extra=attempt.log_fields)
        if attempt.deadline_passed and now >= give_up:
            if attempt.take(Decider.WATCH):
                log.warning(
                    "handler ignored cancellation past its grace period; writing the timeout without it",
                    extra=attempt.log_fields | {"grace_seconds": config.timeout_grace_seconds},
                )
                finish(attempt, timeout_failure())
            return
        if now >= next_beat:
            next_beat = now + interval
            if not _heartbeat(attempt, timer):
                return


def _renew_lease(attempt: Attempt, timer: TimerThread) -> None:
    """Renew the lease, for no longer than the lease itself lasts by the local clock.

    The lease is gone when its TTL has passed whether or not the database said
    so, so the attempt is treated as lost then, and a renewal still unanswered is
    left behind on its thread (:class:`RenewalThread`). Until then a lost
    connection is retried: a database restart shorter than the lease costs the
    attempt nothing.
    """
    sent_at = time.monotonic()
    deadline = attempt.local_lease_deadline
    tries = 0

    def renew_once() -> object:
        nonlocal tries
        if tries:
            _count_heartbeat_failure(attempt)
        tries += 1
        return attempt.driver.heartbeat_job(
            **attempt.identity.keywords(), event_log=attempt.config.event_log,
            lease_ttl_seconds=attempt.config.lease_ttl_seconds, lock_timeout_ms=attempt.config.heartbeat_lock_timeout_ms,
            retry=False)

    # No retry that could only land after the lease ran out, nor after the attempt ended.
    renewal = timer.renewals().send(lambda: with_retries(renew_once, give_up_at=deadline, pause=attempt.wait_decided))
    _wait_unless_attempt_ended(attempt, renewal, deadline)
    if attempt.is_decided:
        return  # the attempt ended meanwhile; its outcome, not this renewal, decides
    if not renewal.done():
        if not attempt.completed_in_transaction:
            # Another worker may claim the job from now on: stop the handler at once,
            # then give the renewal a moment to say why (a row lock released just
            # after expiry answers with the owner mismatch the database decided).
            # _heartbeat replaces this verdict with the final one and logs it.
            attempt.lose_lease(MAINTENANCE_LOST, verdict_pending=True)
        futures.wait([renewal], min(attempt.config.heartbeat_interval, LATE_RENEWAL_ANSWER_SECONDS))
        if not renewal.done() or renewal.exception() is None:
            timer.leave_renewal_behind()
            raise ConnectionFailed(
                f"no answer to the lease renewal of job {attempt.job.id} before its lease ran out")
    renewal.result()  # raises what the renewal raised
    attempt.local_lease_deadline = sent_at + attempt.config.lease_ttl_seconds


def _wait_unless_attempt_ended(attempt: Attempt, renewal: futures.Future[object], deadline: float) -> None:
    # A handler that returns while a renewal hangs must not wait for the lease to run out.
    while not renewal.done() and not attempt.is_decided:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        futures.wait([renewal], min(remaining, RENEWAL_JOIN_STEP_SECONDS))


def _heartbeat(attempt: Attempt, timer: TimerThread) -> bool:
    """Renew the lease; on failure mark the attempt lost and ask the handler to stop."""
    try:
        _renew_lease(attempt, timer)
        return True
    except RunledgerError as error:
        if attempt.completed_in_transaction:
            # Since complete_in the handler's transaction holds the row: a heartbeat
            # waits on its lock, then misses once it commits. Neither is a lost
            # lease, and the lock keeps the attempt safe until the handler returns.
            log.debug("heartbeat skipped: the handler owns the completion",
                      extra=attempt.log_fields | {"error": str(error)})
            return True
        if isinstance(error, LeaseOwnerMismatch):
            # The fence also refuses a job an operator canceled: when the cancel's
            # notification did not reach the worker, this is where the handler learns of it.
            reason = canceled_reason(attempt)
            if reason is not None:
                stop_canceled(attempt, reason)
                return False
        _count_heartbeat_failure(attempt)
        if isinstance(error, LeaseOwnerMismatch):
            lost = LeaseLost(LEASE_OWNER_MISMATCH_CODE, "Job lease ownership was lost during processing.")
            log.warning("job heartbeat lost lease ownership", extra=attempt.log_fields | {"error": str(error)})
        else:
            lost = MAINTENANCE_LOST
            log.warning(
                "aborting job because lease heartbeat could not be persisted",
                extra=attempt.log_fields | {"error": str(error)},
            )
    # Lease loss is recorded by where it came from (here), never inferred from a
    # failure code, so a handler's own failure with the same code is persisted.
    attempt.lose_lease(lost)
    if attempt.take(Decider.WATCH):
        finish(attempt, lost)  # writes nothing; logs which kind of lease loss ended the attempt
    return False


def _count_heartbeat_failure(attempt: Attempt) -> None:
    if attempt.observer is not None:
        attempt.observer.heartbeat_failed(attempt.job.job_type)


# -- the threads the watch runs on: the pool thread's timer, and its renewals' ------------------------------------------------------

class TimerThread:
    """Runs one task at a time, at its due time, unless it is withdrawn first.

    Every running job has a timer: it renews the lease, watches the deadline
    and notices an operator's cancel. A thread started for each job, and woken
    only to hear that the job is over, costs more than a short job itself. So
    each pool thread keeps one :class:`TimerThread` and gives it each job's
    watch with the time the watch is first due (the first renewal or the
    deadline, a second or more away). A job that ends before then is withdrawn,
    or its watch replaced by the next job's, without the timer thread ever
    waking for it; one still running then is watched on the timer thread until
    it ends.

    The timer thread sleeps until the task it holds is due. A new task due no
    sooner than that needs no wake-up, which is the common case: jobs of one
    pool thread start one after another, each due an interval after its start.
    """

    def __init__(self, name: str) -> None:
        self._wake = threading.Condition()
        self._task: Optional[Callable[[], None]] = None
        self._due = math.inf
        #: When the thread's current sleep ends; a task due sooner must wake it.
        self._sleeping_until = math.inf
        self._running = False
        self._closed = False
        self._name = name
        self._renewals: Optional[RenewalThread] = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def renewals(self) -> RenewalThread:
        """The thread the watch sends its lease renewals from (made at the first: most jobs end before one)."""
        if self._renewals is None:
            self._renewals = RenewalThread(self._name.replace("heartbeat", "renewal", 1))
        return self._renewals

    def leave_renewal_behind(self) -> None:
        """A renewal hangs past its lease: leave its thread to end when it answers; the next renewal gets a new one."""
        if self._renewals is not None:
            self._renewals.close()
            self._renewals = None

    def schedule(self, due: float, task: Callable[[], None]) -> None:
        """Run ``task`` on the timer thread at ``due`` (``time.monotonic()``), unless withdrawn before.

        It replaces a task held and not started: the watch of a job that was
        decided, which would only have returned. One running is let return first.

        Raises:
            RuntimeError: the timer is closed.
        """
        with self._wake:
            while self._running and not self._closed:
                self._wake.wait()
            if self._closed:
                raise RuntimeError("the timer thread is closed")
            self._task, self._due = task, due
            if due < self._sleeping_until:
                self._wake.notify()

    def withdraw(self) -> None:
        """Drop the task if it has not started; if it has, wait until it returns."""
        with self._wake:
            self._task, self._due = None, math.inf
            while self._running:
                self._wake.wait()

    def close(self) -> None:
        """Drop any task not started, and stop the thread once a running one returns."""
        with self._wake:
            self._closed = True
            self._task, self._due = None, math.inf
            self._wake.notify_all()
        self._thread.join()
        if self._renewals is not None:
            self._renewals.close()

    def _run(self) -> None:
        while True:
            with self._wake:
                task = self._wait_for_due_task()
                if task is None:
                    return
                self._running = True
            try:
                task()
            except BaseException:  # noqa: BLE001 - one job's watch must not end the timer of the jobs after it
                log.exception("heartbeat timer task crashed")
            finally:
                with self._wake:
                    self._running = False
                    self._wake.notify_all()

    def _wait_for_due_task(self) -> Optional[Callable[[], None]]:
        """With the lock held: sleep until the task held is due and take it; None once closed."""
        while not self._closed:
            now = time.monotonic()
            if self._task is not None and self._due <= now:
                task, self._task, self._due = self._task, None, math.inf
                self._sleeping_until = math.inf
                return task
            self._sleeping_until = self._due
            self._wake.wait(None if self._task is None else self._due - now)
        return None


class RenewalThread:
    """Sends a timer thread's lease renewals, one at a time.

    A renewal sent into a dead network can hang far longer than the lease (no
    reply ever comes and nothing times it out), so the watch waits for it on a
    thread of its own, no longer than the lease lasts. The thread is kept from
    one renewal to the next and left behind only when one hangs.
    """

    def __init__(self, name: str) -> None:
        self._calls: SimpleQueue[Optional[tuple[Callable[[], Any], Future[Any]]]] = SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def send(self, call: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self._calls.put((call, future))
        return future

    def close(self) -> None:
        """Stop once the call in hand (if any) has answered."""
        self._calls.put(None)

    def _run(self) -> None:
        while (entry := self._calls.get()) is not None:
            call, future = entry
            try:
                future.set_result(call())
            except BaseException as error:  # noqa: BLE001 - handed to the watch, which decides
                future.set_exception(error)
