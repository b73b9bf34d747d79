"""Group commit for the hot path: many pool threads' writes in one transaction.

Every job writes stage ``running`` before its handler and SUCCEEDED after it.
Written one by one, each costs a round trip and a commit. A
:class:`GroupWriter` owns one thread that writes, in a single call, everything
queued while its previous group was being written. A writer may also be told
how many more items are on their way (``still_coming``): it then waits up to
``linger_seconds`` for them, so that jobs finishing together are written
together instead of the first alone and the rest behind it. With nothing on
its way a lone job is written at once.

Each caller blocks in :meth:`GroupWriter.submit` until its own item is written,
so a job's slot is only freed after its outcome is durable: grouping changes
how many commits there are, never what a crash can lose. A caller that already
holds several items (the polling thread, with a claimed batch) queues them
together with :meth:`GroupWriter.post` and each job waits on its own ticket.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Generic, Optional, Sequence, TypeVar

from runledger_sync.logging import get_logger

log = get_logger(__name__)

T = TypeVar("T")
R = TypeVar("R")

#: The most items one group write takes; the rest wait for the next group.
MAX_GROUP_SIZE = 256


class Ticket(Generic[T, R]):
    """One queued item; :meth:`result` waits until its group is written."""

    __slots__ = ("item", "done", "value", "error")

    def __init__(self, item: T) -> None:
        self.item = item
        self.done = threading.Event()
        self.value: Optional[R] = None
        self.error: Optional[BaseException] = None

    def result(self) -> R:
        """The item's result once written, or its error raised."""
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


class GroupWriter(Generic[T, R]):
    """Writes submitted items in groups on a thread of its own.

    Args:
        write_group: writes a list of items in one transaction and returns one
            result per item, in order; an item's result may be an exception,
            which :meth:`submit` raises for that item only. If the call itself
            raises, every item of the group gets that exception.
    """

    def __init__(
        self, name: str, write_group: Callable[[list[T]], list[object]], *,
        linger_seconds: float = 0.0, still_coming: Optional[Callable[[], int]] = None,
    ) -> None:
        self._write_group = write_group
        self._linger_seconds = linger_seconds
        self._still_coming = still_coming
        #: Items queued and not written yet, so a caller can tell how many more it expects.
        self.waiting = 0
        self._queue: deque[Ticket[T, R]] = deque()
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: T) -> R:
        """Queue ``item``, wait until its group is written, and return its result (or raise its error)."""
        return self.post([item])[0].result()

    def post(self, items: Sequence[T]) -> list[Ticket[T, R]]:
        """Queue ``items`` at once, so they are written in the same group, and return without waiting."""
        tickets: list[Ticket[T, R]] = [Ticket(item) for item in items]
        with self._wake:
            if self._closed:
                raise RuntimeError("the group writer is closed")
            self._queue.extend(tickets)
            self.waiting += len(tickets)
            self._wake.notify()
        return tickets

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join()

    def _run(self) -> None:
        try:
            self._write_until_closed()
        finally:
            # Whatever ended the thread, nobody may wait on it for ever.
            with self._wake:
                self._closed = True
                orphans = list(self._queue)
                self._queue.clear()
            self._finish(orphans, RuntimeError("the group writer stopped"))

    def _write_until_closed(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closed:
                    self._wake.wait()
                if not self._queue:
                    return
                self._linger()
                group = [self._queue.popleft() for _ in range(min(len(self._queue), MAX_GROUP_SIZE))]
            self._write(group)

    def _linger(self) -> None:
        """Wait (lock held) up to the linger time while more items are on their way."""
        if self._still_coming is None or self._linger_seconds <= 0:
            return
        deadline = time.monotonic() + self._linger_seconds
        while len(self._queue) < MAX_GROUP_SIZE and not self._closed and self._still_coming() > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._wake.wait(remaining)

    def _write(self, group: list[Ticket[T, R]]) -> None:
        try:
            results = self._write_group([ticket.item for ticket in group])
            if len(results) != len(group):
                raise RuntimeError(f"group write returned {len(results)} results for {len(group)} items")
        except BaseException as error:  # noqa: BLE001 - every waiter must be woken, whatever happened
            self._finish(group, error)
            if not isinstance(error, Exception):
                raise
            return
        for ticket, result in zip(group, results, strict=True):
            if isinstance(result, BaseException):
                ticket.error = result
            else:
                ticket.value = result  # type: ignore[assignment]
        self._finish(group)

    def _finish(self, group: list[Ticket[T, R]], error: Optional[BaseException] = None) -> None:
        with self._wake:
            self.waiting -= len(group)
        for ticket in group:
            if error is not None:
                ticket.error = error
            ticket.done.set()
