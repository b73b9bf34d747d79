"""Handler continuations (spec T14) and retry hints: the delays a handler asks for, checked before anything is written.

A handler that returns ``JobCompletion(continue_after=...)`` or raises
:class:`~runledger_sync.core.types.Snooze` ends its run without ending the job:
the job waits PENDING for the delay, then runs again as run ``run_number + 1``,
attempt 0, with its checkpoint. It spends no attempt, but each job may continue
at most its definition's ``max_continuations`` times, so a handler that snoozes
for ever still ends. A workflow step's job continues only if its step was built
with ``continuation=True``: its dependents wait on it meanwhile.

A retryable failure may carry a hint (``retry_after``): the retry waits at least
that long, and longer when the backoff says so.

Every rule here answers with a failure code, recorded as a TERMINAL failure of
the attempt: the same code would ask the same of the next attempt.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any, Optional

#: How many times one job may continue unless its definition says otherwise.
DEFAULT_MAX_CONTINUATIONS = 100
#: The longest delay a continuation or a retry hint may ask for.
MAX_HANDLER_DELAY = timedelta(days=365)
#: The attempt row's outcome for a run that ended in a continuation (the failure kinds are the others).
CONTINUED_OUTCOME = "CONTINUED"
#: The REQUEUED event's ``reason`` and the row's ``status_reason`` after a continuation.
HANDLER_CONTINUATION_REASON = "HANDLER_CONTINUATION"

INVALID_CONTINUATION_DELAY_CODE = "job.invalid_continuation_delay"
CONTINUATION_OUTPUT_CODE = "job.continuation_output_not_allowed"
CONTINUATION_LIMIT_CODE = "job.continuation_limit_exceeded"
WORKFLOW_CONTINUATION_NOT_ENABLED_CODE = "job.workflow_handler_continuation_not_enabled"
INVALID_RETRY_TIMING_CODE = "job.invalid_retry_timing"


def delay_ms(value: Any) -> Optional[int]:
    """``value`` (a timedelta, or seconds as an int or float) in whole ms, rounded up; None when it is no valid delay.

    Rounded up, so the wait is never shorter than asked. Valid: from zero up to
    :data:`MAX_HANDLER_DELAY`; negative, NaN, infinite and larger values, and
    anything that is not a duration (a bool, a string), are not.
    """
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        return None
    if math.isnan(seconds) or not 0 <= seconds <= MAX_HANDLER_DELAY.total_seconds():
        return None
    return math.ceil(seconds * 1000)


def describe(value: Any) -> str:
    """How a refused delay is shown in the recorded failure's message (never a payload: only a duration's repr)."""
    return repr(value) if isinstance(value, (timedelta, int, float)) else f"a {type(value).__name__}"
