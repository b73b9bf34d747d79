"""What an enqueue sends to the server, counted at the driver: the round trips are its speed.

A single enqueue on an Engine is one statement (the job row, its ENQUEUED event
and the NOTIFY together), committed by itself with no BEGIN or COMMIT, and run
prepared; a batch is one statement per chunk in one transaction. The pool's
pre-ping (``SELECT 1`` on checkout) is the engine's, kept for the application's
queries, and is counted apart.
"""

from __future__ import annotations

import select
import time
from typing import Any, Iterator

import psycopg2
import psycopg2.extensions
import pytest
from sqlalchemy.engine import make_url

import runledger_sync as rl
from runledger_sync.core.records import JobSpec
from runledger_sync.db.engine import create_engine
from runledger_sync.store.enqueue import enqueue
from runledger_sync.store import notify
from tests.support import JOB_TYPE, define, scalar, without_plan_settings

PING = "select 1"


class _Sent:
    """Every statement, COMMIT and ROLLBACK the driver sends to the server, in order."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def statements(self) -> list[str]:
        return [without_plan_settings(entry) for entry in self.log if entry.lower() != PING]


SENT = _Sent()


class _CountingCursor(psycopg2.extensions.cursor):
    def execute(self, query: Any, vars: Any = None) -> Any:  # noqa: A002 - psycopg2's name
        SENT.log.append(query if isinstance(query, str) else query.decode())
        return super().execute(query, vars)


class _CountingConnection(psycopg2.extensions.connection):
    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cursor_factory", _CountingCursor)
        return super().cursor(*args, **kwargs)

    def _in_transaction(self) -> bool:
        return self.info.transaction_status != psycopg2.extensions.TRANSACTION_STATUS_IDLE

    def commit(self) -> None:
        if self._in_transaction():
            SENT.log.append("COMMIT")
        super().commit()

    def rollback(self) -> None:
        if self._in_transaction():
            SENT.log.append("ROLLBACK")
        super().rollback()


@pytest.fixture
def counted(fresh_database) -> Iterator[Any]:
    """An engine of one pooled connection whose driver logs what it sends; the statements already prepared."""
    engine = create_engine(fresh_database, pool_size=1, max_overflow=0,
                           connect_args={"connection_factory": _CountingConnection})
    define(engine)
    rl.enqueue(engine, JOB_TYPE, {"warm": True})
    rl.enqueue_many_ids(engine, [JobSpec(JOB_TYPE, {"warm": True})])
    SENT.log.clear()
    yield engine
    engine.dispose()


def _drain(listener: psycopg2.extensions.connection, deadline_s: float = 5.0) -> set[str]:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        arrived = notify.read_notified_types(listener)
        if arrived:
            return arrived
        select.select([listener], [], [], 0.05)
    return set()


def test_a_single_enqueue_on_an_engine_is_one_prepared_statement_with_no_begin_or_commit(counted, fresh_database):
    listener = psycopg2.connect(make_url(fresh_database).set(drivername="postgresql").render_as_string(hide_password=False))
    listener.autocommit = True
    listener.cursor().execute(f"LISTEN {notify.CHANNEL}")
    try:
        job = rl.enqueue(counted, JOB_TYPE, {"n": 1}, event_log="full")

        assert len(SENT.statements()) == 1, SENT.log
        assert SENT.statements()[0].startswith("EXECUTE runledger_enqueue_")
        assert SENT.log.count(PING) <= 1
        # That one statement wrote the job, its event and the notification, and committed them.
        assert scalar(counted, "SELECT count(*) FROM job_queue WHERE id = :id", id=job.id) == 1
        assert scalar(counted, "SELECT count(*) FROM job_events WHERE job_id = :id AND event_type = 'ENQUEUED'",
                      id=job.id) == 1
        assert _drain(listener) == {JOB_TYPE}
    finally:
        listener.close()


@pytest.mark.parametrize("call", ["enqueue_many", "enqueue_many_ids"])
def test_a_batch_of_one_chunk_on_an_engine_is_one_statement(counted, call):
    result = getattr(rl, call)(counted, [JobSpec(JOB_TYPE, {"n": n}) for n in range(50)])

    assert len(result) == 50
    assert len(SENT.statements()) == 1, SENT.log
    assert SENT.statements()[0].startswith("EXECUTE runledger_enqueue")


def test_a_batch_of_several_chunks_on_an_engine_is_one_statement_per_chunk_and_a_commit(counted, monkeypatch):
    monkeypatch.setattr(enqueue, "ENQUEUE_CHUNK_SIZE", 3)

    ids = rl.enqueue_many_ids(counted, (JobSpec(JOB_TYPE, {"n": n}) for n in range(7)), event_log="full")

    assert len(ids) == 7
    assert [entry.split(" ", 1)[0] for entry in SENT.statements()] == ["EXECUTE"] * 3 + ["COMMIT"], SENT.log
    assert scalar(counted, "SELECT count(*) FROM job_events WHERE job_id = ANY(:ids)", ids=ids) == 7


def test_a_single_enqueue_in_the_callers_transaction_is_one_statement_and_leaves_the_commit_to_the_caller(counted):
    with counted.connect() as connection, connection.begin():
        SENT.log.clear()
        job = rl.enqueue(connection, JOB_TYPE, {"n": 1})
        sent_inside = list(SENT.statements())

    assert len(sent_inside) == 1, sent_inside
    assert SENT.statements()[-1] == "COMMIT"
    assert scalar(counted, "SELECT count(*) FROM job_queue WHERE id = :id", id=job.id) == 1
