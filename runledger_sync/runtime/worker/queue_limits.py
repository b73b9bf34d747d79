"""Whether the worker's claims must count: does any queue it serves have a global or rate limit?

A claim that counts (advisory locks, LEASED counts, the rate log) costs about
half again a claim that does not, and most queues have no such limit. The
worker asks the database at most once a second and otherwise claims with what
it last heard. That answer can be stale without harm: the claim that counts
nothing serves only the queues that have no limit in its own snapshot, so a
limit set meanwhile leaves its queue's jobs waiting for the next look instead
of overrunning it; and a limit lifted meanwhile is still counted once more.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

from runledger_sync.logging import get_logger
from runledger_sync.store.driver import Driver

log = get_logger(__name__)

#: How long an answer stands: at most this long before a queue's first limit is served.
LOOK_AGAIN_SECONDS = 1.0


class QueueLimitsWatch:
    """The worker's latest answer to :func:`serves_limited_queue` for its queues."""

    def __init__(self, queues: Optional[Sequence[str]], worker_id: str) -> None:
        self.queues = queues
        self.worker_id = worker_id
        self._limited = True
        self._looked_at: Optional[float] = None

    def limited(self, driver: Driver) -> bool:
        """True unless the latest look found no served queue with a global or rate limit."""
        now = time.monotonic()
        if self._looked_at is None or now - self._looked_at >= LOOK_AGAIN_SECONDS:
            self._looked_at = now
            try:
                self._limited = driver.serves_limited_queue(self.queues)
            except Exception as error:  # noqa: BLE001 - the counting claim is right in any case
                self._limited = True
                log.warning("queue limits could not be read", extra={"worker_id": self.worker_id, "error": str(error)})
        return self._limited
