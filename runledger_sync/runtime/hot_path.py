"""The writers of the two writes every job makes: its running write, grouped, then its outcome, by the completer."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

from sqlalchemy.engine import Engine

from runledger_sync.core.records import JobRecord, LeaseIdentity
from runledger_sync.core.validation import DEFAULT_MAX_OUTPUT_BYTES
from runledger_sync.core.types import EventLog
from runledger_sync.logging import get_logger
from runledger_sync.runtime.completer import Completer
from runledger_sync.runtime.group_writer import GroupWriter
from runledger_sync.runtime.observer import WorkerObserver
from runledger_sync.runtime.pace import FinishingSoon
from runledger_sync.store import driver
from runledger_sync.store.driver import HeldConnection

log = get_logger(__name__)

#: A claimed job and the lease it runs under, on its way to its running write.
RunningItem = tuple[LeaseIdentity, JobRecord]
T = TypeVar("T")


@dataclass(frozen=True)
class HotPathWriters:
    """The writers of a worker's jobs: the running writes' group writer, and the completer of their outcomes."""

    running: GroupWriter[RunningItem, None]
    completer: Completer
    #: The running writer's own connection, used only on its thread.
    connection: HeldConnection
    #: How many running jobs succeed soon: the completer lingers only for those.
    finishing: FinishingSoon

    @classmethod
    def start(
        cls, engine: Engine, worker_id: str, *, finishing: FinishingSoon, event_log: EventLog | str = EventLog.FULL,
        observer: Optional[WorkerObserver] = None, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> "HotPathWriters":
        """Start both.

        The polling thread posts each claimed batch to the running writer whole,
        so that writer never waits for company; each job goes to a pool thread
        once its running write has been answered. The completer lingers briefly
        for the company of the jobs ``finishing`` says should succeed meanwhile.
        ``event_log`` is the worker's level: ``transitions`` writes no STAGE_CHANGED(running) rows.
        ``observer`` is told the size and duration of each group write. ``max_output_bytes``
        is the worker's output limit, which the pool threads have already applied.
        """
        running_connection = HeldConnection(engine)
        running: GroupWriter[RunningItem, None] = GroupWriter(
            f"runledger-running-{worker_id}",
            _timed(observer, "running", lambda group: driver.mark_jobs_running(
                running_connection, [identity for identity, _ in group], event_log=event_log)),
        )
        completer = Completer(engine, f"runledger-completer-{worker_id}", max_output_bytes=max_output_bytes,
                              still_coming=finishing.others_within, observer=observer)
        finishing.count_succeeding(lambda: completer.waiting)
        return cls(running=running, completer=completer, connection=running_connection, finishing=finishing)

    def close(self) -> None:
        self.running.close()
        self.completer.close()
        # The running writer's thread has stopped, so its connection is free to close here.
        self.connection.close()


def _timed(
    observer: Optional[WorkerObserver], writer: str, write: Callable[[list[T]], list[object]],
) -> Callable[[list[T]], list[object]]:
    """``write``, reporting each group's size and duration to ``observer``; ``write`` itself when there is none."""
    if observer is None:
        return write

    def timed_write(group: list[T]) -> list[object]:
        started = time.monotonic()
        results = write(group)
        observer.group_written(writer, len(group), time.monotonic() - started)
        return results

    return timed_write
