"""Where a job is: its status (``job_queue.status``) and its stage (``job_queue.stage``)."""

from __future__ import annotations

import enum


class JobStatus(str, enum.Enum):
    """Where a job row is in its lifecycle (column ``job_queue.status``)."""

    #: Into: enqueue, retry, unstarted release, reaper retry, requeue. Out: claim, cancel.
    PENDING = "PENDING"
    #: Into: claim. Out: success, failure, release, reaper, cancel.
    LEASED = "LEASED"
    #: Into: complete success. Out: requeue.
    SUCCEEDED = "SUCCEEDED"
    #: Into: terminal failure, exhausted attempts, reaper. Out: requeue.
    DEAD_LETTERED = "DEAD_LETTERED"
    #: Into: cancel. Out: requeue.
    CANCELED = "CANCELED"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.DEAD_LETTERED, JobStatus.CANCELED})


class JobStage(str, enum.Enum):
    """The coarse execution stage shown to operators (column ``job_queue.stage``)."""

    QUEUED = "queued"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    COMPLETED = "completed"
