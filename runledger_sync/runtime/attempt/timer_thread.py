"""A pool thread's heartbeat timer thread, kept from one job to the next.

Every running job has a timer: it renews the lease, watches the deadline and
notices an operator's cancel. A thread started for each job, and woken only to
hear that the job is over, cost a no-op job about a quarter of the worker's
CPU. So each pool thread keeps one :class:`TimerThread` and gives it each job's
watch with the time the watch is first due (the first renewal or the deadline,
a second or more away). A job that ends before then is withdrawn without the
timer thread ever waking for it; one still running then is watched on the
timer thread until it ends.

The timer thread sleeps until the task it holds is due. A new task due no
sooner than that needs no wake-up, which is the common case: jobs of one pool
thread start one after another, each due an interval after its start.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Callable, Optional

from runledger_sync.logging import get_logger

log = get_logger(__name__)


class TimerThread:
    """Runs one task at a time, at its due time, unless it is withdrawn first."""

    def __init__(self, name: str) -> None:
        self._wake = threading.Condition()
        self._task: Optional[Callable[[], None]] = None
        self._due = math.inf
        #: When the thread's current sleep ends; a task due sooner must wake it.
        self._sleeping_until = math.inf
        self._running = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def schedule(self, due: float, task: Callable[[], None]) -> None:
        """Run ``task`` on the timer thread at ``due`` (``time.monotonic()``), unless withdrawn before.

        Raises:
            RuntimeError: the timer is closed, or still holds another task.
        """
        with self._wake:
            if self._closed:
                raise RuntimeError("the timer thread is closed")
            if self._task is not None or self._running:
                raise RuntimeError("the timer thread already holds a task")
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
