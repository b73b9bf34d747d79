"""How long handlers take lately, so the completer waits for company only when some is coming.

The completer lingers a moment for other jobs about to succeed, so that
they share one transaction. That pays off when handlers are short (no-op jobs
of one claim finish within microseconds of each other) and only delays every
success when they are long: of 32 jobs of 100 ms, fewer than one finishes
within a 2 ms linger.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

#: Weight of the newest handler's time in the moving average.
WEIGHT = 0.1


class HandlerPace:
    """A moving average of handler run times, reported by the pool threads."""

    def __init__(self) -> None:
        self._mean: Optional[float] = None
        self._lock = threading.Lock()

    def record(self, seconds: float) -> None:
        with self._lock:
            mean = self._mean
            self._mean = seconds if mean is None else mean + WEIGHT * (seconds - mean)

    def finishing_within(self, running: int, seconds: float) -> int:
        """How many of ``running`` handlers should return within ``seconds``, at the recent pace.

        Before any handler has returned, all of them: waiting as if handlers
        were short costs one short wait at worst.
        """
        mean = self._mean
        if mean is None or mean <= seconds:
            return running
        return int(running * seconds / mean)


class FinishingSoon:
    """How many running jobs will have succeeded within a moment: the one batching policy.

    The completer asks it whether company is coming within its linger; the
    claim asks it whether enough slots free within its gather time. The worker
    loop owns it and tells it how many jobs are running; the completer
    tells it how many successes it holds.
    """

    def __init__(self, running_jobs: Callable[[], int]) -> None:
        self.pace = HandlerPace()
        self._running_jobs = running_jobs
        self._succeeding: Callable[[], int] = lambda: 0

    def count_succeeding(self, succeeding: Callable[[], int]) -> None:
        """Use ``succeeding`` (jobs whose success is queued but not yet written) from now on."""
        self._succeeding = succeeding

    def record(self, handler_seconds: float) -> None:
        self.pace.record(handler_seconds)

    def others_within(self, seconds: float) -> int:
        """Running jobs whose handlers, at the recent pace, return within ``seconds``."""
        succeeding = self._succeeding()
        return self.pace.finishing_within(max(0, self._running_jobs() - succeeding), seconds)

    def within(self, seconds: float) -> int:
        """Jobs that will have succeeded within ``seconds``: those already queued, and the others."""
        return self._succeeding() + self.others_within(seconds)
