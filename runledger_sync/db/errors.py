"""Translate driver errors into the most specific coded RunledgerError.

psycopg2 and psycopg 3 errors map alike: both carry the SQLSTATE (``pgcode`` in
one, ``sqlstate`` in the other) and ``diag.constraint_name``.

Shared by the store and by migrations, so every layer above the driver sees
the same codes (``db.connection_failed``, ``db.unique_violation``, ...).
"""

from __future__ import annotations

import re
import sys
from typing import Optional

import psycopg2
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL

from runledger_sync.core import errors
from runledger_sync.core.queue_errors import QueueNotFound
from runledger_sync.core.store_errors import (
    BusinessRuleViolation,
    ConnectionFailed,
    DefinitionNotFound,
    PermissionDenied,
    RelatedResourceMissing,
    RelatedResourceStillReferenced,
    RequiredFieldMissing,
    SchemaMismatch,
    StoreError,
    UniqueViolation,
)
from runledger_sync.core.workflow_errors import WorkflowLinkageSymmetryViolation, WorkflowLinkageTriggerTableInvalid
from runledger_sync.db.connection_loss import means_connection_loss, sqlstate_of
from runledger_sync.db.engine import mask_url, mask_urls_in

_BY_SQLSTATE: dict[str, type[StoreError]] = {
    "23505": UniqueViolation,
    "23503": RelatedResourceMissing,
    "23001": RelatedResourceStillReferenced,
    "23514": BusinessRuleViolation,
    "23502": RequiredFieldMissing,
    "42501": PermissionDenied,
    # Raised by the job/step linkage trigger (revision 0004), which names its own SQLSTATEs.
    "RLW01": WorkflowLinkageSymmetryViolation,
    "RLW02": WorkflowLinkageTriggerTableInvalid,
}
_BY_CONSTRAINT: dict[str, type[errors.RunledgerError]] = {
    "fk_job_queue_job_type": DefinitionNotFound,
    "fk_job_schedules_job_type": DefinitionNotFound,
    "ck_job_queue_progress": errors.InvalidProgress,
    "fk_job_queue_queue": QueueNotFound,
    "fk_job_definitions_queue": QueueNotFound,
}
# The server's detail of a queue's foreign key: its one column, the queue's name (never
# a payload). Absent when the server's messages are not in English or the role may not
# read the column; the error then says what it can without the name.
_MISSING_QUEUE = re.compile(r'Key \(queue\)=\((?P<name>.*)\) is not present in table "job_queues"', re.DOTALL)
# undefined_table, undefined_column, undefined_function: a database not migrated, or behind.
_SCHEMA_MISSING_STATES = frozenset({"42P01", "42703", "42883"})

def _sqlstate(exc: sa_exc.DBAPIError) -> Optional[str]:
    # psycopg2 names it pgcode, psycopg 3 sqlstate; both are None when the
    # server sent no SQLSTATE (a refused or dropped connection).
    return sqlstate_of(exc.orig)


def violated_constraint(exc: sa_exc.DBAPIError) -> Optional[str]:
    """The name of the constraint ``exc`` reports broken, if the driver says."""
    diag = getattr(exc.orig, "diag", None)
    if diag is None:
        # asyncpg (under SQLAlchemy's emulated DBAPI error, its .orig) names it on its own exception.
        return getattr(getattr(exc.orig, "orig", None), "constraint_name", None)
    return getattr(diag, "constraint_name", None)


def is_transient(exc: sa_exc.DBAPIError) -> bool:
    """True for failures a fresh connection may not have: a lost or refused connection, a failover.

    The SQLSTATEs are :func:`~runledger_sync.db.connection_loss.means_connection_loss`'s.
    """
    if exc.connection_invalidated or isinstance(exc, sa_exc.InterfaceError):
        return True
    state = _sqlstate(exc)
    if state is None:
        # psycopg2 and psycopg 3 report a refused or dropped connection without a SQLSTATE.
        return isinstance(exc, sa_exc.OperationalError)
    return means_connection_loss(state)


def is_connection_loss(exc: BaseException) -> bool:
    """True when a handler's ``exc`` says its database connection was lost, not that its code failed.

    Such a failure spends no attempt (``job.handler_transient_error``): a restart
    or failover of the queue's database must not dead-letter work. It is the
    store's own :class:`ConnectionFailed`, a SQLAlchemy error flagged as a
    disconnect or carrying SQLSTATE class 08, 57P or 25006, and the drivers'
    (psycopg2, psycopg 3) connection errors, which report a dropped connection
    with no SQLSTATE or with one of those. Anything else, ``OSError`` included,
    is the handler's failure and spends an attempt.
    """
    if isinstance(exc, ConnectionFailed):
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        return is_transient(exc)
    # psycopg 3 is optional: a handler that raised one of its errors has imported it.
    psycopg = sys.modules.get("psycopg")
    connection_errors: tuple[type[BaseException], ...] = (psycopg2.OperationalError, psycopg2.InterfaceError)
    driver_errors: tuple[type[BaseException], ...] = (psycopg2.Error,)
    if psycopg is not None:
        connection_errors += (psycopg.OperationalError, psycopg.InterfaceError)
        driver_errors += (psycopg.Error,)
    if not isinstance(exc, driver_errors):
        return False
    state = sqlstate_of(exc)
    if state is None:
        return isinstance(exc, connection_errors)
    # By its SQLSTATE whatever its class: the drivers raise 25006 as an InternalError.
    return means_connection_loss(state)


def translate(exc: sa_exc.DBAPIError, url: str | URL | None = None) -> errors.RunledgerError:
    """Return the most specific coded error for a driver error (raise it ``from exc``)."""
    text = str(exc.orig).strip() if exc.orig is not None else str(exc)
    # A driver may quote the connection string it was given: mask any URL in its text.
    detail = mask_urls_in(text.splitlines()[0] if text else "")
    if is_transient(exc):
        where = f" ({mask_url(url)})" if url is not None else ""
        return ConnectionFailed(f"database connection failed{where}: {detail}")
    constraint = violated_constraint(exc)
    state = _sqlstate(exc)
    if state == "55P03":
        return StoreError(f"lock wait timed out: {detail}", sqlstate=state)
    if state in _SCHEMA_MISSING_STATES:
        # Every statement of ours names only our own tables and columns, so a missing one
        # means the schema was never migrated (or is behind), not a bug in the caller.
        return SchemaMismatch(
            f"the job tables are missing or behind this version of runledger-sync ({detail}); "
            "run `runledger-sync migrate` (or your Alembic upgrade) first",
            sqlstate=state,
        )
    cls = _BY_CONSTRAINT.get(constraint or "") or _BY_SQLSTATE.get(state or "", StoreError)
    if cls is QueueNotFound:
        return _queue_not_found(exc, detail, state, constraint)
    return cls(f"{detail}", sqlstate=state, constraint=constraint)


def _queue_not_found(exc: sa_exc.DBAPIError, detail: str, state: Optional[str], constraint: Optional[str]) -> QueueNotFound:
    diag = getattr(exc.orig, "diag", None)
    # psycopg 2 and 3 give the DETAIL line as diag.message_detail, asyncpg's error as .detail.
    found = _MISSING_QUEUE.search(getattr(diag, "message_detail", None) or getattr(exc.orig, "detail", None) or "")
    if found is None:
        return QueueNotFound(f"a job or job type names a queue that does not exist ({detail})", sqlstate=state,
                             constraint=constraint)
    name = found.group("name")
    return QueueNotFound(
        f"no queue is named {name!r}; declare it with registry.queue() and sync, or create it with configure_queue()",
        queue=name, sqlstate=state, constraint=constraint,
    )
