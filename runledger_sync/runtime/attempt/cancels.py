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

from typing import Iterable, Optional
from uuid import UUID

from runledger_sync.core.errors import RunledgerError
from runledger_sync.core.outcomes import Canceled
from runledger_sync.core.states import JobStatus
from runledger_sync.runtime.attempt.state import Attempt, Decider, RunningHandlers
from runledger_sync.runtime.attempt.decision import finish

#: What ``ctx.cancel_reason`` says when the operator gave no reason (the row's status_reason then).
NO_REASON = "CANCELED"


def cancel_running(running: RunningHandlers, job_ids: Iterable[str]) -> None:
    """Stop the handlers running any of ``job_ids`` whose job an operator canceled (a notification's payloads)."""
    for payload in job_ids:
        try:
            job_id = UUID(payload)
        except ValueError:
            continue  # not one of ours: the channel is open to anyone who can NOTIFY
        for attempt in running.of_job(job_id):
            reason = canceled_reason(attempt)
            if reason is not None:
                stop_canceled(attempt, reason)


def canceled_reason(attempt: Attempt) -> Optional[str]:
    """The operator's reason when the job row says the attempt's run was canceled; None when not (or unreadable).

    Unreadable leaves the attempt running: its next renewal asks again.
    """
    try:
        current = attempt.driver.get_job(attempt.job.id)
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
