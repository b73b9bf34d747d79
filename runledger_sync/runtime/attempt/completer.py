"""The completer: the one writer of every attempt's decided outcome.

Pool threads and the watch hand it a decided :data:`~runledger_sync.core.outcomes.Transition`
(succeed, continue, retry, dead-letter) with the lease it was decided under. It writes
what was queued while its previous group was being written as one group, every
kind together, with one call (``apply_transitions`` of :mod:`runledger_sync.store.driver`),
and answers every item once its outcome is durable: only then may the caller
free the job's slot (the seed's rule: a slot is held until its outcome is
written). With other jobs about to finish it lingers briefly for their company,
and only then: :class:`FinishingSoon` keeps a moving average of handler times,
since lingering pays when handlers are short (no-op jobs of one claim finish
within microseconds of each other) and only delays every success when they are
long (of 32 jobs of 100 ms, fewer than one finishes within a 2 ms linger).
Callers never wait for the write: they post with a callback, called on the
completer's thread once the group is durable, and the worker frees a slot only
from there, so grouping changes how many commits there are, never what a crash
can lose.

It has one retry policy for every write. A lost connection is retried for as
long as the completer is open (on its own thread: as long as the worker lives),
since an outcome lands whenever nobody else took its job, even past its lease;
once it closes, or on a caller's Connection, until the latest lease of the
group runs out. Before anything is written again, the
rows are read back, since a write whose reply was lost may have landed (the
fence would refuse a repeat, and a landed success would look like a lost
lease). A group the database refuses as a whole (one job's invalid progress) is
split in halves and each written again, down to the one job it concerns, whose
answer is that error; nothing goes back to the pool.

On a driver that owns its transactions the completer writes on a thread and
connection of its own. On one that joins a caller's Connection (a worker that polls on it) it writes each outcome at
once, on the calling thread, under the same policy.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from queue import Empty, SimpleQueue
from typing import Callable, Optional, TypeVar


from runledger_sync.core.errors import RunledgerError
from runledger_sync.core.outcomes import Written
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.store_errors import CommitOutcomeUnknown, ConnectionFailed
from runledger_sync.core.validation import DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_MAX_PAYLOAD_BYTES
from runledger_sync.logging import get_logger
from runledger_sync.runtime.observer import WorkerObserver
from runledger_sync.store.driver import Driver

log = get_logger(__name__)

#: The pause between tries of a write or read whose connection was lost.
RETRY_PAUSE_SECONDS = 0.2
#: The longest a group waits for outcomes still on their way (a bound on the
#: delay grouping adds to one job's outcome write).
GROUP_LINGER_SECONDS = 0.002

T = TypeVar("T")
#: Called once with the item's answer: None once durable, LANDED_AFTER_LOST_REPLY,
#: or the error that kept it from landing.
OnAnswer = Callable[[object], None]


# -- the batching policy: how many successes are coming ----------------------------------

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
    loop owns it and keeps ``running`` (its jobs claimed and not yet ended); the
    completer keeps ``queued`` (outcomes posted and not yet written); pool
    threads record each handler's time.
    """

    def __init__(self) -> None:
        self.pace = HandlerPace()
        #: Jobs claimed and not yet ended (each job's slot).
        self.running = 0
        #: Outcomes posted to the completer and not yet written.
        self.queued = 0

    def record(self, handler_seconds: float) -> None:
        self.pace.record(handler_seconds)

    def others_within(self, seconds: float) -> int:
        """Running jobs whose handlers, at the recent pace, return within ``seconds``."""
        return self.pace.finishing_within(max(0, self.running - self.queued), seconds)

    def within(self, seconds: float) -> int:
        """Jobs that will have succeeded within ``seconds``: those already queued, and the others."""
        return self.queued + self.others_within(seconds)


# -- the completer -------------------------------------------------------------------------

#: The most outcomes one group write takes; the rest wait for the next group.
MAX_GROUP_SIZE = 256


class LandedAfterLostReply:
    """The answer of a write whose reply was lost and whose row, read back, showed it had landed."""

    def __repr__(self) -> str:
        return "LANDED_AFTER_LOST_REPLY"


LANDED_AFTER_LOST_REPLY = LandedAfterLostReply()


@dataclass(frozen=True)
class _Item:
    identity: LeaseIdentity
    transition: Written
    #: When, by this process's clock, its lease is out: the completer stops retrying then once it is closing.
    give_up_at: float
    on_answer: OnAnswer


#: What the completer's thread is told to stop by.
_STOP = None


class Completer:
    """Writes decided outcomes in groups (see the module docstring).

    Args:
        driver: one that owns its transactions (a thread and a held connection
            of its own, unless ``threaded`` is False), or one that joins a
            caller's (written at once, on the posting thread).
        finishing: the worker's batching policy: how many running jobs succeed
            soon. The completer lingers for those, tells it how many outcomes wait
            to be written, and pool threads record each handler's time in it.
            None never lingers.
    """

    def __init__(
        self, driver: Driver, name: str, *, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        max_checkpoint_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES, finishing: Optional[FinishingSoon] = None,
        observer: Optional[WorkerObserver] = None, threaded: bool = True,
    ) -> None:
        self.finishing = finishing
        self._max_output_bytes = max_output_bytes
        self._max_checkpoint_bytes = max_checkpoint_bytes
        self._observer = observer
        self._held: Optional[Driver] = None
        self._driver = driver
        # A SimpleQueue is the cheapest hand-off between threads the standard library has.
        self._queue: SimpleQueue[Optional[_Item]] = SimpleQueue()
        self._waiting = 0
        self._waiting_lock = threading.Lock()
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        if threaded and driver.owns_transactions:
            self._held = self._driver = driver.held()
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()

    @property
    def threaded(self) -> bool:
        """True when outcomes are written on the completer's own thread, False when on the posting one."""
        return self._thread is not None

    @property
    def waiting(self) -> int:
        """Outcomes posted to the completer's thread and not yet answered."""
        return self._waiting

    def keeps_trying(self) -> bool:
        """True while a lost connection is retried past the lease: on the completer's thread, until it closes."""
        return self._thread is not None and not self._closed

    def post(self, identity: LeaseIdentity, transition: Written, *, give_up_at: float, on_answer: OnAnswer) -> None:
        """Write ``transition`` under ``identity``'s lease; ``on_answer(result)`` is called once it is durable or lost.

        On the completer's thread the callback must be quick and must not block on the database.

        Raises:
            RuntimeError: the completer is closed.
        """
        item = _Item(identity, transition, give_up_at, on_answer)
        if self._thread is None:
            on_answer(self._write_group([item])[0])
            return
        if self._closed:
            raise RuntimeError("the completer is closed")
        self._count(1)
        self._queue.put(item)

    def close(self) -> None:
        """Write what is queued, then stop (a write still retried gives up at its lease's end)."""
        if self._thread is not None:
            self._closed = True
            self._queue.put(_STOP)
            self._thread.join()
            # A post that raced close() landed behind the stop mark: nobody may wait on it for ever.
            self._answer_all(self._take_queued()[0], RuntimeError("the completer stopped"))
        if self._held is not None:
            self._held.close()

    def _count(self, items: int) -> None:
        with self._waiting_lock:
            self._waiting += items
            if self.finishing is not None:
                self.finishing.queued = self._waiting

    # -- the completer's thread: take what is queued, linger for company, write it as one group

    def _run(self) -> None:
        pending: list[_Item] = []
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
                self._answer_group(group)
        finally:
            # Whatever ended the thread, nobody may wait on it for ever.
            self._closed = True
            self._answer_all(pending + self._take_queued()[0], RuntimeError("the completer stopped"))

    @staticmethod
    def _take(entry: Optional[_Item], pending: list[_Item]) -> bool:
        """Add one queue entry to ``pending``; True if it was the stop mark."""
        if entry is _STOP:
            return True
        pending.append(entry)
        return False

    def _take_queued(self) -> tuple[list[_Item], bool]:
        """Everything queued right now, without waiting, and whether the stop mark was among it."""
        taken: list[_Item] = []
        stop = False
        while True:
            try:
                entry = self._queue.get_nowait()
            except Empty:
                return taken, stop
            stop = self._take(entry, taken) or stop

    def _linger(self, pending: list[_Item]) -> bool:
        """Wait up to the linger time while more outcomes are on their way; True if the stop mark came."""
        finishing = self.finishing
        if finishing is None:
            return False
        deadline = time.monotonic() + GROUP_LINGER_SECONDS
        while len(pending) < MAX_GROUP_SIZE and finishing.others_within(GROUP_LINGER_SECONDS) > 0:
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

    def _answer_group(self, group: list[_Item]) -> None:
        try:
            results = self._write_group(group)
        except BaseException as error:  # noqa: BLE001 - every item must be answered, whatever happened
            self._answer_all(group, error)
            if not isinstance(error, Exception):
                raise
            return
        self._count(-len(group))
        for item, result in zip(group, results, strict=True):
            _answer(item, result)

    def _answer_all(self, group: list[_Item], error: BaseException) -> None:
        self._count(-len(group))
        for item in group:
            _answer(item, error)

    # -- the write and its one retry policy

    def _write_group(self, items: list[_Item]) -> list[object]:
        results: list[object] = [None] * len(items)
        self._write(list(range(len(items))), items, results)
        return results

    def _write(self, indexes: list[int], items: list[_Item], results: list[object]) -> None:
        """Write the items at ``indexes`` (of any kinds) until each has its answer in ``results``."""
        give_up_at = max(items[index].give_up_at for index in indexes)
        pending, read_first, reply_lost = indexes, False, False
        while True:
            try:
                if read_first:
                    pending = self._read_back(pending, items, results)
                    read_first = False
                    if not pending:
                        return
                for index, answer in zip(pending, self._write_once([items[index] for index in pending]), strict=True):
                    results[index] = answer
                return
            except CommitOutcomeUnknown:
                read_first = reply_lost = True
            except ConnectionFailed:
                # Part of the group (its plain jobs' transaction, say) may have
                # landed before the connection went: read before writing again.
                read_first = True
            except RunledgerError as error:
                if len(pending) == 1:
                    results[pending[0]] = error
                    return
                half = len(pending) // 2
                self._write(pending[:half], items, results)
                self._write(pending[half:], items, results)
                return
            if time.monotonic() >= give_up_at and not self.keeps_trying():
                gave_up: ConnectionFailed = CommitOutcomeUnknown(
                    "the database stayed out of reach after an outcome write whose reply was lost; it may have landed"
                ) if reply_lost else ConnectionFailed("the outcome could not be written before its lease ran out")
                for index in pending:
                    results[index] = gave_up
                return
            time.sleep(RETRY_PAUSE_SECONDS)

    def _write_once(self, items: list[_Item]) -> list[object]:
        started = time.monotonic()
        answers: list[object] = list(self._driver.apply_transitions(
            [(item.identity, item.transition) for item in items],
            max_output_bytes=self._max_output_bytes, max_checkpoint_bytes=self._max_checkpoint_bytes, retry=False))
        if self._observer is not None:
            self._observer.group_written("outcome", len(items), time.monotonic() - started)
        return answers

    def _read_back(self, pending: list[int], items: list[_Item], results: list[object]) -> list[int]:
        """Answer the items whose write landed or can no longer land; return those still to write."""
        verdicts = self._driver.read_back_outcomes(
            [(items[index].identity, items[index].transition) for index in pending])
        still = []
        for index, verdict in zip(pending, verdicts, strict=True):
            if verdict is None:
                still.append(index)
            else:
                results[index] = LANDED_AFTER_LOST_REPLY if verdict is True else verdict
        return still


def _answer(item: _Item, result: object) -> None:
    try:
        item.on_answer(result)
    except Exception:  # noqa: BLE001 - one caller's broken callback must not cost the others theirs
        log.exception("outcome answer callback crashed")


def with_retries(
    read: Callable[[], T], *, give_up_at: float, keep_trying: Callable[[], bool] = lambda: False,
    pause: Optional[Callable[[float], bool]] = None,
) -> T:
    """``read()``, tried again after a lost connection until ``give_up_at``: the one retry policy of the attempt.

    The completer's writes, the reads its decisions need and the watch's renewals all retry by it.

    Args:
        keep_trying: past ``give_up_at``, try again while it says so (:meth:`Completer.keeps_trying`).
        pause: sleeps between tries (``time.sleep`` when None); True when woken because nobody needs the answer any more.

    Raises:
        ConnectionFailed: the database stayed out of reach.
    """
    while True:
        try:
            return read()
        except ConnectionFailed:
            if time.monotonic() >= give_up_at and not keep_trying():
                raise
            seconds = RETRY_PAUSE_SECONDS if keep_trying() else min(RETRY_PAUSE_SECONDS, max(0.0, give_up_at - time.monotonic()))
            if pause is None:
                time.sleep(seconds)
            elif pause(seconds):
                raise


def wait_for_answer(completer: Completer, identity: LeaseIdentity, transition: Written, *, give_up_at: float) -> object:
    """Post ``transition`` and block until its answer comes (never call this on the completer's own thread)."""
    answered = threading.Event()
    answer: list[object] = []

    def keep(result: object) -> None:
        answer.append(result)
        answered.set()

    completer.post(identity, transition, give_up_at=give_up_at, on_answer=keep)
    answered.wait()
    return answer[0]
