"""An operator's cancel reaching the handler that runs the job: which attempt runs which job, and how one is stopped.

A cancel ends the job in the database at once (CANCELED, spec section 4); the
handler still running it learns of it from one of two places, and both end the
attempt here, the same way:

- the worker's listener, told by the cancel's notification when it commits
  (:data:`~runledger_sync.store.driver.CANCELED_CHANNEL`), within milliseconds;
- otherwise the attempt's next lease renewal, which the cancel makes fail: the
  fallback, since a notification is lost whenever no LISTEN hears it (the
  listener reconnecting, a transaction-pooling proxy, ``listen=False``).

Either reads the job row first: only a row CANCELED in the attempt's own run
stops it, so a stray notification, or one about an earlier run, stops nothing.
The handler's flag is then set with the operator's reason (``ctx.cancel_reason``),
the attempt is decided as :class:`~runledger_sync.core.outcomes.Canceled` (one
INFO line, nothing written), and its watch stops renewing. It is not a lost
lease: nothing is logged as one, and no reaper is needed.
"""

from __future__ import annotations

import threading
from typing import Iterable, Iterator, Optional
from uuid import UUID

from runledger_sync.core.errors import RunledgerError
from runledger_sync.core.outcomes import Canceled
from runledger_sync.core.states import JobStatus
from runledger_sync.runtime.attempt.state import Attempt, Decider
from runledger_sync.runtime.attempt.decision import finish
from runledger_sync.store import driver

#: What ``ctx.cancel_reason`` says when the operator gave no reason (the row's status_reason then).
NO_REASON = "CANCELED"


class RunningHandlers:
    """The attempts whose handler is running now, by job id.

    The worker adds each attempt just before its handler starts and removes it
    when the handler returns. A cancel's notification finds the attempt here;
    the worker's drain tells every one of them to stop. One job id may name two
    attempts for a moment: a handler left running after its lease was lost, and
    the job's next attempt on this same worker.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_job: dict[UUID, list[Attempt]] = {}

    def add(self, attempt: Attempt) -> None:
        with self._lock:
            self._by_job.setdefault(attempt.job.id, []).append(attempt)

    def discard(self, attempt: Attempt) -> None:
        with self._lock:
            running = self._by_job.get(attempt.job.id)
            if running is not None and attempt in running:
                running.remove(attempt)
                if not running:
                    del self._by_job[attempt.job.id]

    def __iter__(self) -> Iterator[Attempt]:
        with self._lock:
            snapshot = [attempt for running in self._by_job.values() for attempt in running]
        return iter(snapshot)

    def cancel(self, job_ids: Iterable[str]) -> None:
        """Stop the handlers running any of ``job_ids`` whose job an operator canceled (a notification's payloads)."""
        for payload in job_ids:
            try:
                job_id = UUID(payload)
            except ValueError:
                continue  # not one of ours: the channel is open to anyone who can NOTIFY
            with self._lock:
                running = list(self._by_job.get(job_id, ()))
            for attempt in running:
                reason = canceled_reason(attempt)
                if reason is not None:
                    stop_canceled(attempt, reason)


def canceled_reason(attempt: Attempt) -> Optional[str]:
    """The operator's reason when the job row says the attempt's run was canceled; None when not (or unreadable).

    Unreadable leaves the attempt running: its next renewal asks again.
    """
    try:
        current = driver.get_job(attempt.engine, attempt.job.id)
    except RunledgerError:
        return None
    if current is None or current.status is not JobStatus.CANCELED or current.run_number != attempt.job.run_number:
        return None
    return current.status_reason or NO_REASON


def stop_canceled(attempt: Attempt, reason: str) -> None:
    """End the attempt of a canceled job: tell its handler why, stop its watch, and write nothing.

    When the attempt was already decided (the handler returned first, or its
    deadline passed), that decision stands; the handler is still told.
    """
    canceled = Canceled(reason)
    attempt.cancel(canceled)
    if attempt.take(Decider.CANCEL):
        finish(attempt, canceled)
