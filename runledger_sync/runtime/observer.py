"""The points at which the worker reports what it does, for metrics kept in process.

The worker holds an observer, or None. With None (metrics off) each point costs
one attribute check; with one, a call per claimed batch, per job end and per
group write. The runtime never imports an implementation:
:class:`runledger_sync.metrics.WorkerMetrics` is the Prometheus one.
"""

from __future__ import annotations

from typing import Optional, Protocol, Sequence

from runledger_sync.core.records import JobRecord


class WorkerObserver(Protocol):
    """What a worker tells its observer. Calls come from many threads at once."""

    def claimed(self, jobs: Sequence[JobRecord]) -> None:
        """A claim returned ``jobs`` (possibly none); each carries its next_run_at and the claim's time as last_heartbeat_at."""

    def job_finished(self, job_type: str, outcome: str, handler_seconds: Optional[float]) -> None:
        """An attempt ended with ``outcome`` (succeeded, retry_scheduled, dead_lettered, lease_lost,
        not_started, undecided); ``handler_seconds`` is None when the handler never ran."""

    def group_written(self, writer: str, size: int, seconds: float) -> None:
        """``size`` jobs were written together: ``running`` (sent with their claim, and timed with it) or ``success``."""

    def heartbeat_failed(self, job_type: str) -> None:
        """A lease renewal failed (retried after a lost connection, or given up)."""
