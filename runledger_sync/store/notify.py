"""LISTEN/NOTIFY on the ``runledger_jobs`` channel: enqueue notifies, idle workers listen.

Enqueue adds ``pg_notify(CHANNEL, job_type)`` for each distinct job type it
inserts that is due at once, inside its one statement (see
:mod:`runledger_sync.store.enqueue`). PostgreSQL delivers a notification only
when the transaction commits, so a rolled-back enqueue wakes nobody; a job
that becomes due later (a delay, a retry) is found by polling.

The listener side is one psycopg2 connection per worker, in autocommit mode,
detached from the engine's pool (a listening session must never be handed to
someone else, and must not use up a pool slot for the life of the worker).
"""

from __future__ import annotations

from typing import Any

import psycopg2.extensions
from sqlalchemy import func, literal, select
from sqlalchemy.engine import Engine

#: The notification channel; the payload is the job type.
CHANNEL = "runledger_jobs"
#: ``application_name`` of listener sessions, so operators (and tests) can find them in pg_stat_activity.
LISTENER_APPLICATION_NAME = "runledger-listener"


def notify_due_types(inserted: Any) -> Any:
    """Return a scalar subquery sending one notification per distinct due job type in ``inserted``.

    ``inserted`` is the enqueue statement's data-modifying CTE. A SELECT in a
    WITH clause runs only if the main query references it, so the caller puts
    this subquery in its WHERE clause (it counts the notifications, always >= 0).
    """
    due_types = (
        select(inserted.c.job_type)
        # A delayed job cannot be claimed yet; waking workers for it only costs a claim.
        .where(inserted.c.next_run_at <= func.now())
        .distinct()
        .subquery("due_types")
    )
    return select(func.count(func.pg_notify(literal(CHANNEL), due_types.c.job_type))).scalar_subquery()


def open_listener(engine: Engine) -> psycopg2.extensions.connection:
    """Open a listening psycopg2 connection on :data:`CHANNEL`.

    The connection comes from ``engine``'s pool and is detached from it at once:
    close it with :func:`close_listener`.

    Raises:
        Whatever connecting raises (SQLAlchemy ``DBAPIError``, psycopg2 ``Error``).
    """
    fairy = engine.raw_connection()
    fairy.detach()
    connection = fairy.dbapi_connection
    try:
        # The pool's pre-ping may have left a transaction open; autocommit needs none.
        connection.rollback()
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute("SET application_name = %s", (LISTENER_APPLICATION_NAME,))
            cursor.execute(f"LISTEN {CHANNEL}")
    except BaseException:
        connection.close()
        raise
    return connection


def read_notified_types(connection: psycopg2.extensions.connection) -> set[str]:
    """Read what has arrived on the listener without blocking; return the notified job types.

    Raises:
        psycopg2.OperationalError (or another ``psycopg2.Error``): the connection is lost.
    """
    connection.poll()
    types = {notify.payload for notify in connection.notifies if notify.channel == CHANNEL}
    connection.notifies.clear()
    return types


def close_listener(connection: psycopg2.extensions.connection) -> None:
    """Close a listener connection; closing a lost one is fine too."""
    if not connection.closed:
        connection.close()
