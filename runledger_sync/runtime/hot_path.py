"""The group writers of the two writes every job makes: running, then success."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from sqlalchemy.engine import Engine

from runledger_sync.core.types import (
    JobCompletion,
)
from runledger_sync.logging import get_logger
from runledger_sync.runtime.group_writer import GroupWriter
from runledger_sync.runtime.pace import HandlerPace
from runledger_sync.store import lifecycle, lifecycle_batch
from runledger_sync.store.held import HeldConnection

log = get_logger(__name__)

#: The longest a group write waits for items still on their way (a bound on the
#: delay grouping can add to one job's running or success write).
GROUP_LINGER_SECONDS = 0.002

SuccessItem = tuple[lifecycle.LeaseIdentity, Optional[JobCompletion]]


@dataclass(frozen=True)
class HotPathWriters:
    """The group writers for the two writes every job makes: running, then success."""

    running: GroupWriter[lifecycle.LeaseIdentity, None]
    success: GroupWriter[SuccessItem, None]
    #: Each writer's own connection, used only on its thread.
    connections: tuple[HeldConnection, ...]
    #: How long handlers take lately: how many others may succeed within the linger.
    pace: HandlerPace

    @classmethod
    def start(cls, engine: Engine, worker_id: str, *, in_flight: Callable[[], int]) -> "HotPathWriters":
        """Start both writers.

        The polling thread posts each claimed batch to the running writer whole,
        so that writer never waits for company.

        Args:
            in_flight: how many jobs are running now; any of them may be about to
                succeed, so the success writer lingers briefly for the company of
                those that handlers' recent pace says should come meanwhile.
        """
        running_connection, success_connection = HeldConnection(engine), HeldConnection(engine)
        pace = HandlerPace()
        running: GroupWriter[lifecycle.LeaseIdentity, None] = GroupWriter(
            f"runledger-running-{worker_id}",
            lambda group: lifecycle_batch.mark_jobs_running(running_connection, group),
        )
        success: GroupWriter[SuccessItem, None] = GroupWriter(
            f"runledger-success-{worker_id}",
            lambda group: lifecycle_batch.complete_jobs_success(success_connection, group),
            linger_seconds=GROUP_LINGER_SECONDS,
            still_coming=lambda: pace.finishing_within(in_flight() - success.waiting, GROUP_LINGER_SECONDS),
        )
        return cls(running=running, success=success, connections=(running_connection, success_connection), pace=pace)

    def close(self) -> None:
        self.running.close()
        self.success.close()
        # Both threads have stopped, so their connections are free to close here.
        for connection in self.connections:
            connection.close()
