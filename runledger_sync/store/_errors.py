"""Translate driver errors into coded RunledgerErrors, and run transactions with a retry budget.

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
from runledger_sync.db.engine import mask_url

T = TypeVar("T")

#: How long one store call keeps retrying a lost connection before giving up.
TRANSIENT_RETRY_BUDGET_SECONDS = 2.0
TRANSIENT_RETRY_ATTEMPTS = 4

_BY_SQLSTATE: dict[str, type[errors.StoreError]] = {
    "23505": errors.UniqueViolation,
    "23503": errors.RelatedResourceMissing,
    "23001": errors.RelatedResourceStillReferenced,
    "23514": errors.BusinessRuleViolation,
    "23502": errors.RequiredFieldMissing,
    "42501": errors.PermissionDenied,
}
_BY_CONSTRAINT: dict[str, type[errors.RunledgerError]] = {
    "fk_job_queue_job_type": errors.DefinitionNotFound,
    "ck_job_queue_progress": errors.InvalidProgress,
}
# Connection exceptions (08), operator intervention (57P01-57P03: shutdown,
# crash, cannot connect now) and a standby that stopped being writable.
_TRANSIENT_PREFIXES = ("08", "57P")


def _sqlstate(exc: sa_exc.DBAPIError) -> Optional[str]:
    return getattr(exc.orig, "pgcode", None)


def _constraint(exc: sa_exc.DBAPIError) -> Optional[str]:
    diag = getattr(exc.orig, "diag", None)
    return getattr(diag, "constraint_name", None)


def is_transient(exc: sa_exc.DBAPIError) -> bool:
    """True for failures a fresh connection may not have: a lost or refused connection."""
    if exc.connection_invalidated or isinstance(exc, sa_exc.InterfaceError):
        return True
    state = _sqlstate(exc)
    if state is None:
        # psycopg2 reports a refused or dropped connection without a SQLSTATE.
        return isinstance(exc, sa_exc.OperationalError)
    return state.startswith(_TRANSIENT_PREFIXES)


def translate(exc: sa_exc.DBAPIError, url: object = None) -> errors.RunledgerError:
    """Return the most specific coded error for a driver error (raise it ``from exc``)."""
    detail = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
    if is_transient(exc):
        where = f" ({mask_url(url)})" if url is not None else ""
        return errors.ConnectionFailed(f"database connection failed{where}: {_mask(detail, url)}")
    constraint = _constraint(exc)
    state = _sqlstate(exc)
    if state == "55P03":
        return errors.StoreError(f"lock wait timed out: {detail}", sqlstate=state)
    cls = _BY_CONSTRAINT.get(constraint or "") or _BY_SQLSTATE.get(state or "", errors.StoreError)
    return cls(f"{detail}", sqlstate=state, constraint=constraint)


def _mask(text: str, url: object) -> str:
    password = getattr(url, "password", None)
    return text.replace(password, "***") if password else text


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
