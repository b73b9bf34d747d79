"""LISTEN/NOTIFY on the ``runledger_jobs`` channel: enqueue notifies, idle workers listen.

The ``runledger_schedules`` channel works alike for the scheduler loop: a write
that gives an active schedule a new next fire (a new schedule, a new timing, a
resume) notifies it (:func:`notify_schedules_changed`), so a schedule resumed
while the loop sleeps fires on time, not up to a poll interval late.

Enqueue adds ``pg_notify(CHANNEL, job_type)`` for each distinct job type it
inserts that is due at once, inside its one statement (see
:mod:`runledger_sync.store.enqueue.chunk`). PostgreSQL delivers a notification only
when the transaction commits, so a rolled-back enqueue wakes nobody; a job
that becomes due later (a delay, a retry) is found by polling.

The ``runledger_ended`` channel tells :func:`runledger_sync.wait_for_job` that
jobs ended: each write that makes jobs SUCCEEDED, DEAD_LETTERED or CANCELED (a
worker's success or failure, single or grouped, the reaper's, an operator's
cancel, a workflow run's cancel) sends one notification listing their ids, inside its one statement
(:func:`notify_ended`). One per statement, not one per job: the worker's group
writes stay one pg_notify dearer, whoever listens.

The ``runledger_canceled`` channel tells workers that an operator canceled
jobs: :func:`runledger_sync.cancel_job` (and so the CLI's ``jobs cancel`` and
the dashboard's action) sends one notification per job it cancels, its id,
inside its one statement (:func:`notify_canceled`). The worker running one of
them tells its handler at once instead of at its next heartbeat, which stays
the fallback: a notification is lost whenever no LISTEN hears it. A workflow
run's cancel sends none: it cancels only jobs no worker holds.

The listener side is one psycopg2 connection per worker, in autocommit mode,
detached from the engine's pool (a listening session must never be handed to
someone else, and must not use up a pool slot for the life of the worker). It
runs ``UNLISTEN *`` before it is closed: a pooler in front of the server may
keep the session for its next client.

A LISTEN reaches the listener only while its session stays its own. Behind a
transaction-pooling proxy the LISTEN stays on a server connection the client
leaves at once, and nothing arrives: no error says so. So the listener proves
delivery with a probe: a notification on a channel of its own, sent from
another connection (:func:`send_probe`), that must come back to it. (A
NOTIFY sent on the listener's own connection would prove nothing there: it
would run on, and be delivered to, whichever server connection the proxy gave
that transaction.)
"""

from __future__ import annotations

import re
import secrets
from typing import Any, Iterable, Optional
from typing import cast as typing_cast

import psycopg2.extensions
from sqlalchemy import String, Text, any_, bindparam, case, cast, func, literal, select
from sqlalchemy.dialects.postgresql import array
from sqlalchemy.engine import Connection, Engine

from runledger_sync.core.states import TERMINAL_STATUSES
from runledger_sync.db.pool_mode import policy_of
from runledger_sync.store.binds import Bind
from runledger_sync.store.transactions import run_in_transaction

#: The notification channel; the payload is the job type.
CHANNEL = "runledger_jobs"
#: The channel the scheduler loop listens on; the payload says nothing (one per transaction).
SCHEDULES_CHANNEL = "runledger_schedules"
#: The channel told of ended jobs; the payload is their ids, comma-separated, or empty (see :func:`notify_ended`).
ENDED_CHANNEL = "runledger_ended"
#: The channel told of jobs an operator canceled; the payload is one job's id.
CANCELED_CHANNEL = "runledger_canceled"
#: ``application_name`` of listener sessions, so operators (and tests) can find them in pg_stat_activity.
LISTENER_APPLICATION_NAME = "runledger-listener"
#: Probe channels are this prefix and random hex: ours, never user input (LISTEN takes an identifier).
PROBE_CHANNEL_PREFIX = "runledger_probe_"
# PostgreSQL refuses a payload of 8000 bytes or more; ids past that are sent as "some jobs ended".
_MAX_ENDED_PAYLOAD_BYTES = 7999
_TERMINAL_VALUES = sorted(status.value for status in TERMINAL_STATUSES)
_CHANNEL_NAME = re.compile(r"runledger_[a-z0-9_]{1,50}")
_NOTIFY = select(func.pg_notify(bindparam("channel", type_=String), bindparam("payload", type_=String)))


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


def notify_ended(written: Any) -> Any:
    """Return a WHERE clause, always true, that notifies :data:`ENDED_CHANNEL` of the ended rows of ``written``.

    ``written`` is a data-modifying CTE returning ``id`` and ``status``; the caller
    selects from it with this clause, so the notification is sent once per
    statement, and only when a row reached a terminal status (a retry sends none).
    The payload lists the ids; when they would not fit in one notification it is
    empty, which a waiter reads as "look again".
    """
    ended = (
        select(func.string_agg(cast(written.c.id, Text), literal(",")).label("ids"))
        # An array, not IN (...): IN's list is expanded at execution, which a prepared statement cannot take.
        .where(written.c.status == any_(array([literal(value) for value in _TERMINAL_VALUES])))
        .correlate(None)
        .subquery("ended_ids")
    )
    payload = case((func.octet_length(ended.c.ids) <= _MAX_ENDED_PAYLOAD_BYTES, ended.c.ids), else_=literal(""))
    sent = (
        select(func.count(func.pg_notify(literal(ENDED_CHANNEL), payload)))
        .where(ended.c.ids.is_not(None))
        .correlate(None)
        .scalar_subquery()
    )
    return sent >= 0


def notify_canceled(canceled: Any) -> Any:
    """Return a WHERE clause, always true, that notifies :data:`CANCELED_CHANNEL` of each row of ``canceled``.

    ``canceled`` is a data-modifying CTE returning ``id``; the caller selects
    from it with this clause. A job still PENDING is named too: whether a worker
    held it is gone from the row once canceled, and a worker ignores ids it does
    not run.
    """
    sent = (
        select(func.count(func.pg_notify(literal(CANCELED_CHANNEL), cast(canceled.c.id, Text))))
        .correlate(None)
        .scalar_subquery()
    )
    return sent >= 0


def ended_job_ids(payloads: Iterable[str]) -> Optional[set[str]]:
    """The job ids notifications of :data:`ENDED_CHANNEL` name; None when one of them named none (look at yours)."""
    ids: set[str] = set()
    for payload in payloads:
        if not payload:
            return None
        ids.update(payload.split(","))
    return ids


def notify_schedules_changed(connection: Connection) -> None:
    """Tell the scheduler loops, when the caller's transaction commits, that a schedule's next fire moved.

    The payload is fixed, so PostgreSQL delivers one notification however many
    schedules the transaction writes.
    """
    connection.execute(_NOTIFY, {"channel": SCHEDULES_CHANNEL, "payload": "changed"})


def new_probe_channel() -> str:
    """Return a channel name no other listener uses."""
    return PROBE_CHANNEL_PREFIX + secrets.token_hex(8)


def hears_listen(engine: Engine) -> bool:
    """True when a LISTEN on ``engine``'s connections is heard by the session that made it.

    Behind a transaction-pooling proxy sessions are shared: a LISTEN would stay on
    a pooled server connection and deliver to whoever runs there next.
    """
    return policy_of(engine).listens


def pool_mode_of(engine: Engine) -> str:
    """``engine``'s pool mode (``session``, ``transaction``), as a log line says why a worker does not listen."""
    return policy_of(engine).mode.value


def open_listener(engine: Engine, channels: Iterable[str] = (CHANNEL,)) -> psycopg2.extensions.connection:
    """Open a psycopg2 connection listening on ``channels`` (by default :data:`CHANNEL`).

    The connection comes from ``engine``'s pool and is detached from it at once:
    close it with :func:`close_listener`.

    Raises:
        Whatever connecting raises (SQLAlchemy ``DBAPIError``, psycopg2 ``Error``).
    """
    fairy = engine.raw_connection()
    fairy.detach()
    # The engines of this package are built on psycopg2 (db.engine.create_engine).
    connection = typing_cast(psycopg2.extensions.connection, fairy.dbapi_connection)
    try:
        # The pool's pre-ping may have left a transaction open; autocommit needs none.
        connection.rollback()
        connection.autocommit = True
        with connection.cursor() as cursor:
            # Session state on a session that is closed with the listener, never given back.
            cursor.execute("SET application_name = %s", (LISTENER_APPLICATION_NAME,))
        for channel in channels:
            listen(connection, channel)
    except BaseException:
        connection.close()
        raise
    return connection


def listen(connection: psycopg2.extensions.connection, channel: str) -> None:
    """LISTEN on one more of our channels."""
    if not _CHANNEL_NAME.fullmatch(channel):
        raise ValueError(f"not a channel of ours: {channel!r}")
    with connection.cursor() as cursor:
        cursor.execute(f"LISTEN {channel}")


def send_probe(bind: Bind, channel: str, payload: str) -> None:
    """Notify ``channel`` with ``payload`` from ``bind`` (not from the listener: see the module docstring)."""

    def work(connection: Connection) -> None:
        connection.execute(_NOTIFY, {"channel": channel, "payload": payload})

    run_in_transaction(bind, work)


def read_notifications(connection: psycopg2.extensions.connection) -> dict[str, set[str]]:
    """Read what has arrived on the listener without blocking; return the payloads by channel.

    Raises:
        psycopg2.OperationalError (or another ``psycopg2.Error``): the connection is lost.
    """
    connection.poll()
    payloads: dict[str, set[str]] = {}
    for notify in connection.notifies:
        payloads.setdefault(notify.channel, set()).add(notify.payload)
    connection.notifies.clear()
    return payloads


def read_notified_types(connection: psycopg2.extensions.connection) -> set[str]:
    """Read what has arrived on the listener without blocking; return the notified job types.

    Raises:
        psycopg2.OperationalError (or another ``psycopg2.Error``): the connection is lost.
    """
    return read_notifications(connection).get(CHANNEL, set())


def close_listener(connection: psycopg2.extensions.connection) -> None:
    """Stop listening and close a listener connection; closing a lost one is fine too."""
    if connection.closed:
        return
    try:
        # A pooler may keep the session after we close: leave no LISTEN on it.
        with connection.cursor() as cursor:
            cursor.execute("UNLISTEN *")
    except psycopg2.Error:
        pass  # a broken connection: its session is gone, or no longer reachable by us
    finally:
        connection.close()
