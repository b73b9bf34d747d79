"""How long handlers take lately, so the success writer waits for company only when some is coming.

The success writer lingers a moment for other jobs about to succeed, so that
they share one transaction. That pays off when handlers are short (no-op jobs
of one claim finish within microseconds of each other) and only delays every
success when they are long: of 32 jobs of 100 ms, fewer than one finishes
within a 2 ms linger.
"""

from __future__ import annotations

import threading
from typing import Optional

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
