"""The points at which the worker reports what it does, for metrics kept in process (or gathered from worker processes).

The worker holds an observer, or None. With None (metrics off) each point costs
one attribute check; with one, a call per claimed batch, per job end, per
failed attempt and per group write. The runtime never imports an implementation:
:class:`runledger_sync.metrics.WorkerMetrics` is the Prometheus one.
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol, Sequence

from runledger_sync.core.records import JobRecord
from runledger_sync.core.types import JobFailure


class WorkerObserver(Protocol):
    """What a worker tells its observer. Calls come from many threads at once."""

    def claimed(self, jobs: Sequence[JobRecord]) -> None:
        """A claim returned ``jobs`` (possibly none); each carries its next_run_at and the claim's time as last_heartbeat_at."""

    def job_finished(self, job_type: str, outcome: str, handler_seconds: Optional[float]) -> None:
        """An attempt ended with ``outcome`` (succeeded, retry_scheduled, dead_lettered, lease_lost,
        not_started, undecided); ``handler_seconds`` is None when the handler never ran."""

    def group_written(self, writer: str, size: int, seconds: float) -> None:
        """``size`` jobs were written together: ``running`` (sent with their claim, and timed with it) or ``outcome``."""

    def heartbeat_failed(self, job_type: str) -> None:
        """A lease renewal failed (retried after a lost connection, or given up)."""

    def attempt_failed(self, job_type: str, failure: JobFailure, exception: Optional[BaseException]) -> None:
        """A failed attempt's outcome (a retry or a dead letter) is durable: ``failure`` as written, and the
        exception the handler raised (None when it raised none: a timeout, an invalid result).

        Optional: an observer without this method is not told (see :func:`failure_observer`).
        """


FailureObserver = Callable[[str, JobFailure, Optional[BaseException]], None]


def failure_observer(observer: Optional[WorkerObserver]) -> Optional[FailureObserver]:
    """The observer's ``attempt_failed``, or None: observers written before it was added keep working."""
    return getattr(observer, "attempt_failed", None)


class ProcessesObserver(WorkerObserver, Protocol):
    """An observer that follows worker processes too: what ``Supervisor(processes=N, observer=...)`` needs.

    The parent runs no job, so its observer is told nothing itself: each worker
    process builds its own, and the observer gathers what they count (through
    files, a socket...) wherever it is read.
    """

    def worker_process_observer(self) -> Callable[[], WorkerObserver]:
        """Return a picklable callable that each worker process calls once, first of all, for its own observer."""

    def worker_process_exited(self, pid: int) -> None:
        """The worker process ``pid`` has exited (it may be restarted under another pid)."""


def follows_processes(observer: Optional[WorkerObserver]) -> bool:
    """Whether ``observer`` can be given with ``processes > 1``."""
    return callable(getattr(observer, "worker_process_observer", None)) and \
        callable(getattr(observer, "worker_process_exited", None))
