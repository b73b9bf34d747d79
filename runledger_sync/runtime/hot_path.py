"""The group writers of the two writes every job makes: running, then success."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, TypeVar

from sqlalchemy.engine import Engine

from runledger_sync.core.records import JobRecord, LeaseIdentity
from runledger_sync.core.validation import DEFAULT_MAX_OUTPUT_BYTES
from runledger_sync.core.types import (
    EventLog,
    JobCompletion,
)
from runledger_sync.logging import get_logger
from runledger_sync.runtime.group_writer import GroupWriter
from runledger_sync.runtime.observer import WorkerObserver
from runledger_sync.runtime.pace import FinishingSoon
from runledger_sync.store import lifecycle_batch
from runledger_sync.store.held import HeldConnection

log = get_logger(__name__)

#: The longest a group write waits for items still on their way (a bound on the
#: delay grouping can add to one job's running or success write).
GROUP_LINGER_SECONDS = 0.002

SuccessItem = tuple[LeaseIdentity, Optional[JobCompletion]]
#: A claimed job and the lease it runs under, on its way to its running write.
RunningItem = tuple[LeaseIdentity, JobRecord]
T = TypeVar("T")


@dataclass(frozen=True)
class HotPathWriters:
    """The group writers for the two writes every job makes: running, then success."""

    running: GroupWriter[RunningItem, None]
    success: GroupWriter[SuccessItem, None]
    #: Each writer's own connection, used only on its thread.
    connections: tuple[HeldConnection, ...]
    #: How many running jobs succeed soon: the success writer lingers only for those.
    finishing: FinishingSoon

    @classmethod
    def start(
        cls, engine: Engine, worker_id: str, *, finishing: FinishingSoon, event_log: EventLog | str = EventLog.FULL,
        observer: Optional[WorkerObserver] = None, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> "HotPathWriters":
        """Start both writers.

        The polling thread posts each claimed batch to the running writer whole,
        so that writer never waits for company; each job goes to a pool thread
        once its running write has been answered. The success writer lingers briefly
        for the company of the jobs ``finishing`` says should succeed meanwhile.
        ``event_log`` is the worker's level: ``transitions`` writes no STAGE_CHANGED(running) rows.
        ``observer`` is told the size and duration of each group write. ``max_output_bytes``
        is the worker's output limit, which the pool threads have already applied.
        """
        running_connection, success_connection = HeldConnection(engine), HeldConnection(engine)
        running: GroupWriter[RunningItem, None] = GroupWriter(
            f"runledger-running-{worker_id}",
            _timed(observer, "running", lambda group: lifecycle_batch.mark_jobs_running(
                running_connection, [identity for identity, _ in group], event_log=event_log)),
        )
        success: GroupWriter[SuccessItem, None] = GroupWriter(
            f"runledger-success-{worker_id}",
            _timed(observer, "success", lambda group: lifecycle_batch.complete_jobs_success(
                success_connection, group, max_output_bytes=max_output_bytes)),
            linger_seconds=GROUP_LINGER_SECONDS,
            still_coming=lambda: finishing.others_within(GROUP_LINGER_SECONDS),
        )
        finishing.count_succeeding(lambda: success.waiting)
        return cls(running=running, success=success, connections=(running_connection, success_connection),
                   finishing=finishing)

    def close(self) -> None:
        self.running.close()
        self.success.close()
        # Both threads have stopped, so their connections are free to close here.
        for connection in self.connections:
            connection.close()


def _timed(
    observer: Optional[WorkerObserver], writer: str, write: Callable[[list[T]], Sequence[object]],
) -> Callable[[list[T]], Sequence[object]]:
    """``write``, reporting each group's size and duration to ``observer``; ``write`` itself when there is none."""
    if observer is None:
        return write

    def timed_write(group: list[T]) -> Sequence[object]:
        started = time.monotonic()
        results = write(group)
        observer.group_written(writer, len(group), time.monotonic() - started)
        return results

    return timed_write
