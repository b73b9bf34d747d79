"""Run store transactions with a retry budget for lost connections.

Only transient connection failures are retried, and only while retrying cannot
repeat a write: a failure while sending COMMIT leaves the outcome unknown, so
the caller's ``recheck`` decides whether the write landed.
"""

from __future__ import annotations

from typing import Callable, Optional, TypeVar

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential

from runledger_sync.core import errors
from runledger_sync.db.errors import is_transient, translate

T = TypeVar("T")

#: How long one store call keeps retrying a lost connection before giving up.
TRANSIENT_RETRY_BUDGET_SECONDS = 2.0
TRANSIENT_RETRY_ATTEMPTS = 4


def run_in_transaction(
    bind: Engine | Connection,
    work: Callable[[Connection], T],
    *,
    recheck: Optional[Callable[[Engine], Optional[T]]] = None,
) -> T:
    """Run ``work`` in one transaction and return its result.

    Given a Connection, ``work`` joins the caller's transaction and nothing is
    retried: the caller owns the transaction. Given an Engine, the transaction is
    committed here, and a lost connection is retried within a small budget.

    Args:
        recheck: called after an unknown commit outcome; returns the result if the
            write landed, or None to run ``work`` again.
    """
    if isinstance(bind, Connection):
        try:
            return work(bind)
        except sa_exc.DBAPIError as exc:
            raise translate(exc, bind.engine.url) from exc
    retrying = Retrying(
        retry=retry_if_exception(_worth_retrying),
        stop=stop_after_delay(TRANSIENT_RETRY_BUDGET_SECONDS) | stop_after_attempt(TRANSIENT_RETRY_ATTEMPTS),
        wait=wait_exponential(multiplier=0.05, max=0.5),
        reraise=True,
    )
    for attempt in retrying:
        with attempt:
            return _once(bind, work, recheck)
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover


def _worth_retrying(exc: BaseException) -> bool:
    # An unknown commit outcome is never retried blindly: that could write twice.
    return isinstance(exc, errors.ConnectionFailed) and not isinstance(exc, errors.CommitOutcomeUnknown)


def _once(engine: Engine, work: Callable[[Connection], T], recheck: Optional[Callable[[Engine], Optional[T]]]) -> T:
    try:
        connection = engine.connect()
    except sa_exc.DBAPIError as exc:
        raise translate(exc, engine.url) from exc
    with connection:
        try:
            result = work(connection)
        except sa_exc.DBAPIError as exc:
            connection.rollback()
            raise translate(exc, engine.url) from exc
        except BaseException:
            connection.rollback()
            raise
        try:
            connection.commit()
        except sa_exc.DBAPIError as exc:
            if not is_transient(exc):
                raise translate(exc, engine.url) from exc
            if recheck is None:
                raise errors.CommitOutcomeUnknown(f"commit outcome unknown: {exc.orig}") from exc
            landed = recheck(engine)
            if landed is None:
                raise translate(exc, engine.url) from exc
            return landed
    return result
