"""The group writer of the write every job ends with: success.

A job's running write goes out with its claim (:mod:`runledger_sync.store.claim_start`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

from sqlalchemy.engine import Engine

from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.validation import DEFAULT_MAX_OUTPUT_BYTES
from runledger_sync.core.types import JobCompletion
from runledger_sync.logging import get_logger
from runledger_sync.runtime.group_writer import GroupWriter
from runledger_sync.runtime.observer import WorkerObserver
from runledger_sync.runtime.pace import FinishingSoon
from runledger_sync.store import lifecycle_batch
from runledger_sync.store.held import HeldConnection

log = get_logger(__name__)

#: The longest a group write waits for items still on their way (a bound on the
#: delay grouping can add to one job's success write).
GROUP_LINGER_SECONDS = 0.002

SuccessItem = tuple[LeaseIdentity, Optional[JobCompletion]]
T = TypeVar("T")


@dataclass(frozen=True)
class HotPathWriters:
    """The group writer of every job's success."""

    success: GroupWriter[SuccessItem, None]
    #: The writer's own connection, used only on its thread.
    connections: tuple[HeldConnection, ...]
    #: How many running jobs succeed soon: the success writer lingers only for those.
    finishing: FinishingSoon

    @classmethod
    def start(
        cls, engine: Engine, worker_id: str, *, finishing: FinishingSoon,
        observer: Optional[WorkerObserver] = None, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> "HotPathWriters":
        """Start the writer.

        It lingers briefly for the company of the jobs ``finishing`` says should
        succeed meanwhile. ``observer`` is told the size and duration of each group write. ``max_output_bytes``
        is the worker's output limit, which the pool threads have already applied.
        """
        success_connection = HeldConnection(engine)
        success: GroupWriter[SuccessItem, None] = GroupWriter(
            f"runledger-success-{worker_id}",
            _timed(observer, "success", lambda group: lifecycle_batch.complete_jobs_success(
                success_connection, group, max_output_bytes=max_output_bytes)),
            linger_seconds=GROUP_LINGER_SECONDS,
            still_coming=lambda: finishing.others_within(GROUP_LINGER_SECONDS),
        )
        finishing.count_succeeding(lambda: success.waiting)
        return cls(success=success, connections=(success_connection,), finishing=finishing)

    def close(self) -> None:
        self.success.close()
        # Its thread has stopped, so its connection is free to close here.
        for connection in self.connections:
            connection.close()


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
