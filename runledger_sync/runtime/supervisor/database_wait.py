"""Wait for the database when a worker starts: a server or PgBouncer not up yet is waited for, not a crash.

Containers start in any order: a worker that exits when its database refuses the
first connection is restarted by its orchestrator, which backs off longer each time,
so the worker starts later than the database did. Waiting here instead, with a short
capped backoff, starts it within a couple of seconds of the database answering.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Optional

from runledger_sync.core.errors import ConfigError
from runledger_sync.core.store_errors import ConnectionFailed, DatabaseWaitTimeout
from runledger_sync.logging import get_logger
from runledger_sync.store.driver import Driver

log = get_logger(__name__)

#: The first pause after a refused connection; each next one doubles, up to the cap.
FIRST_RETRY_SECONDS = 0.1
MAX_RETRY_SECONDS = 2.0
#: How often the wait is logged: a line for each try would flood the log of a long outage.
LOG_EVERY_SECONDS = 5.0


def check_wait_seconds(value: Optional[float], name: str = "wait_for_database_seconds") -> Optional[float]:
    """Return ``value`` if it is None (wait for ever) or a finite number of seconds >= 0; raise ConfigError otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError([f"{name} must be a number of seconds >= 0 (0: do not wait), got {value!r}"])
    return float(value)


def _first_line(error: BaseException) -> str:
    # The driver's own words (connection refused, no such database), without the rest of its report.
    cause = error.__cause__ or error
    lines = str(cause).strip().splitlines()
    return lines[0][:300] if lines else type(cause).__name__


def wait_for_database(driver: Driver, *, timeout_seconds: Optional[float],
                      stop: Optional[threading.Event] = None) -> bool:
    """Return True once the database answers, False if ``stop`` is set first.

    Tries at once, then again after 0.1, 0.2, 0.4 ... s (at most 2 s apart), logging
    "waiting for the database" (the URL without its password, the error's first line)
    at the first refusal and every 5 s after, and "database answered" once it does.
    Only a connection failure is waited for; any other error is raised at once.

    Args:
        driver: The supervisor's (its engine's), pinged until it answers.
        timeout_seconds: How long to wait; None for ever, 0 for one try.
        stop: Ends the wait early (a shutdown signal).

    Raises:
        DatabaseWaitTimeout: The database did not answer within ``timeout_seconds``
            (``db.wait_timeout``).
    """
    started = time.monotonic()
    delay = FIRST_RETRY_SECONDS
    next_log = started
    stop = stop if stop is not None else threading.Event()
    while True:
        try:
            driver.ping()
        except ConnectionFailed as error:
            problem = _first_line(error)
        else:
            if next_log > started:  # it was waited for: say that the wait is over
                log.info("database answered", extra={"waited_seconds": round(time.monotonic() - started, 1)})
            return True
        waited = time.monotonic() - started
        remaining = None if timeout_seconds is None else timeout_seconds - waited
        if remaining is not None and remaining <= 0:
            raise DatabaseWaitTimeout(f"the database did not answer within {timeout_seconds:g} s: {problem}")
        if time.monotonic() >= next_log:
            log.warning("waiting for the database", extra={
                "database": driver.location, "error": problem,
                "waited_seconds": round(waited, 1), "timeout_seconds": timeout_seconds,
            })
            next_log = time.monotonic() + LOG_EVERY_SECONDS
        if stop.wait(delay if remaining is None else min(delay, remaining)):
            return False
        delay = min(delay * 2, MAX_RETRY_SECONDS)

