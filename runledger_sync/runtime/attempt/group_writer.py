"""Group commit for the hot path: many jobs' writes in one transaction, on a thread of its own.

Every job writes stage ``running`` before its handler and SUCCEEDED after it.
Written one by one, each costs a round trip and a commit. A
:class:`GroupWriter` owns one thread that writes, in a single call, everything
queued while its previous group was being written. A writer may also be told
how many more items are on their way (``still_coming``): it then waits up to
``linger_seconds`` for them, so that jobs finishing together are written
together instead of the first alone and the rest behind it. With nothing on
its way a lone job is written at once.

Callers do not wait for their write: they :meth:`~GroupWriter.post` items with
a callback, which the writer's thread calls with each item's result once its
group is written. The worker frees a job's slot only from that callback, so
grouping changes how many commits there are, never what a crash can lose.
"""

from __future__ import annotations

import threading
import time
from queue import Empty, SimpleQueue
from typing import Callable, Generic, Optional, Sequence, TypeVar

from runledger_sync.logging import get_logger

log = get_logger(__name__)

T = TypeVar("T")
R = TypeVar("R")

#: The most items one group write takes; the rest wait for the next group.
MAX_GROUP_SIZE = 256


class GroupWriter(Generic[T, R]):
    """Writes posted items in groups on a thread of its own.

    Args:
        write_group: writes a list of items in one transaction and returns one
            result per item, in order; an item's result may be an exception,
            which that item's callback receives alone. If the call itself
            raises, every item of the group gets that exception.
    """

    def __init__(
        self, name: str, write_group: Callable[[list[T]], Sequence[object]], *,
        linger_seconds: float = 0.0, still_coming: Optional[Callable[[], int]] = None,
    ) -> None:
        self._write_group = write_group
        self._linger_seconds = linger_seconds
        self._still_coming = still_coming
        # Each entry is one post: its items and their callback. A SimpleQueue is
        # the cheapest hand-off between threads the standard library has.
        self._queue: SimpleQueue[Optional[tuple[Sequence[T], Callable[[T, object], None]]]] = SimpleQueue()
        self._waiting = 0
        self._waiting_lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Items posted and not yet answered."""
        return self._waiting

    def _count(self, items: int) -> None:
        with self._waiting_lock:
            self._waiting += items

    def post(self, items: Sequence[T], on_written: Callable[[T, object], None]) -> None:
        """Queue ``items`` to be written in the same group; ``on_written(item, result)`` is called for each.

        The callback runs on the writer's thread: it must be quick and must not
        block on the database. ``result`` is the item's result or an exception.
        """
        if self._closed:
            raise RuntimeError("the group writer is closed")
        if items:
            self._count(len(items))
            self._queue.put((items, on_written))

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        self._closed = True
        self._queue.put(None)
        self._thread.join()
        # A post that raced close() landed behind the stop mark: nobody may wait on it for ever.
        self._answer_all(self._take_queued()[0], RuntimeError("the group writer stopped"))

    def _run(self) -> None:
        pending: list[tuple[T, Callable[[T, object], None]]] = []
        try:
            closing = False
            while pending or not closing:
                if not pending:
                    closing = self._take(self._queue.get(), pending)
                    if closing and not pending:
                        return
                queued, stop = self._take_queued()
                pending.extend(queued)
                closing = closing or stop
                if not closing:
                    closing = self._linger(pending)
                group, pending = pending[:MAX_GROUP_SIZE], pending[MAX_GROUP_SIZE:]
                self._write(group)
        finally:
            # Whatever ended the thread, nobody may wait on it for ever.
            self._closed = True
            self._answer_all(pending + self._take_queued()[0], RuntimeError("the group writer stopped"))

    @staticmethod
    def _take(entry: Optional[tuple[Sequence[T], Callable[[T, object], None]]],
              pending: list[tuple[T, Callable[[T, object], None]]]) -> bool:
        """Add one queue entry's items to ``pending``; True if it was the stop mark."""
        if entry is None:
            return True
        items, callback = entry
        pending.extend((item, callback) for item in items)
        return False

    def _take_queued(self) -> tuple[list[tuple[T, Callable[[T, object], None]]], bool]:
        """Everything queued right now, without waiting, and whether the stop mark was among it."""
        taken: list[tuple[T, Callable[[T, object], None]]] = []
        stop = False
        while True:
            try:
                entry = self._queue.get_nowait()
            except Empty:
                return taken, stop
            stop = self._take(entry, taken) or stop

    def _linger(self, pending: list[tuple[T, Callable[[T, object], None]]]) -> bool:
        """Wait up to the linger time while more items are on their way; True if the stop mark came."""
        if self._still_coming is None or self._linger_seconds <= 0:
            return False
        deadline = time.monotonic() + self._linger_seconds
        while len(pending) < MAX_GROUP_SIZE and self._still_coming() > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                entry = self._queue.get(timeout=remaining)
            except Empty:
                return False
            if self._take(entry, pending):
                return True
        return False

    def _write(self, group: list[tuple[T, Callable[[T, object], None]]]) -> None:
        try:
            results = self._write_group([item for item, _ in group])
            if len(results) != len(group):
                raise RuntimeError(f"group write returned {len(results)} results for {len(group)} items")
        except BaseException as error:  # noqa: BLE001 - every item must be answered, whatever happened
            self._answer_all(group, error)
            if not isinstance(error, Exception):
                raise
            return
        self._count(-len(group))
        for (item, callback), result in zip(group, results, strict=True):
            self._answer(item, callback, result)

    def _answer_all(self, group: list[tuple[T, Callable[[T, object], None]]], error: BaseException) -> None:
        self._count(-len(group))
        for item, callback in group:
            self._answer(item, callback, error)

    @staticmethod
    def _answer(item: T, callback: Callable[[T, object], None], result: object) -> None:
        try:
            callback(item, result)
        except Exception:  # noqa: BLE001 - one caller's broken callback must not cost the others theirs
            log.exception("group write callback crashed")
