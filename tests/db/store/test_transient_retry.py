"""Lost connections are retried within a budget; guard misses and bad input never are."""

from __future__ import annotations

import psycopg2
import pytest
from sqlalchemy import event, text

from runledger_sync.core import errors
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.store_errors import CommitOutcomeUnknown
from runledger_sync.db.engine import create_engine
from runledger_sync.store.enqueue.enqueue import enqueue
from runledger_sync.store.attempt.ends import complete_job_success
from runledger_sync.store.transactions import HeldConnection
from tests.support import JOB_TYPE, claim_one, define, identity, scalar, without_plan_settings, write_successes


def statements_of(engine) -> list[str]:
    seen: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda conn, cursor, statement, *rest: seen.append(statement))
    return seen


def test_a_killed_pooled_connection_is_retried_and_the_job_written_once(fresh_database):
    # No pre-ping, so the dead connection is really used and the retry budget is what saves the call.
    engine = create_engine(fresh_database, pool_pre_ping=False, pool_size=1, max_overflow=0)
    try:
        define(engine)
        with engine.connect() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
        killer = create_engine(fresh_database)
        with killer.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()
        killer.dispose()
        job = enqueue(engine, JOB_TYPE, {"once": True})
        assert scalar(engine, "SELECT count(*) FROM job_queue") == 1
        assert scalar(engine, "SELECT id FROM job_queue") == job.id
    finally:
        engine.dispose()


def test_a_guard_miss_runs_one_statement_and_is_not_retried(engine):
    define(engine)
    enqueue(engine, JOB_TYPE, {})
    job = claim_one(engine)
    seen = statements_of(engine)
    with pytest.raises(errors.LeaseOwnerMismatch):
        complete_job_success(engine, **identity(job) | {"worker_id": "someone-else"})
    # Preparing the statements on first use aside, the fenced write is one round trip, sent once.
    assert [s for s in seen if not s.startswith("PREPARE")] == [s for s in seen if "EXECUTE" in s]
    assert len([s for s in seen if "EXECUTE" in s]) == 1


def test_bad_input_runs_no_statement(engine):
    seen = statements_of(engine)
    with pytest.raises(errors.InvalidPayload):
        enqueue(engine, JOB_TYPE, {"x": {1}})
    assert seen == []


def test_an_enqueue_whose_reply_is_lost_after_it_committed_returns_the_job_written_once(fresh_database):
    engine = create_engine(fresh_database, pool_size=1, max_overflow=0)
    try:
        define(engine)
        lost = []

        def lose_the_reply(conn, cursor, statement, *rest):
            if without_plan_settings(statement).startswith("EXECUTE runledger_enqueue") and not lost:
                # The statement has committed; the connection dies before its reply is read.
                lost.append(conn.connection.dbapi_connection.get_backend_pid())
                with create_engine(fresh_database).connect() as killer:
                    killer.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": lost[0]})
                raise psycopg2.OperationalError("server closed the connection unexpectedly")

        event.listen(engine, "after_cursor_execute", lose_the_reply)
        job = enqueue(engine, JOB_TYPE, {"once": True}, event_log="full")
        event.remove(engine, "after_cursor_execute", lose_the_reply)
        assert lost
        assert scalar(engine, "SELECT count(*) FROM job_queue") == 1
        assert scalar(engine, "SELECT id FROM job_queue") == job.id
        assert job.payload == {"once": True}
        # Its own row, drawn for this call before the first try: created, as without the loss.
        assert job.disposition == "created"
        assert scalar(engine, "SELECT count(*) FROM job_events WHERE event_type = 'ENQUEUED'") == 1
    finally:
        engine.dispose()


def test_a_group_success_whose_reply_is_lost_after_its_one_query_committed_is_unknown_not_repeated(fresh_database):
    engine = create_engine(fresh_database, pool_size=1, max_overflow=0)
    held = HeldConnection(engine)
    try:
        define(engine)
        enqueue(engine, JOB_TYPE, {})
        job = claim_one(engine)
        lost = []

        def lose_the_reply(conn, cursor, statement, *rest):
            if "EXECUTE runledger_apply_transitions_plain" in statement and not lost:
                # The query was the whole transaction and has committed; the reply never comes.
                lost.append(conn.connection.dbapi_connection.get_backend_pid())
                with create_engine(fresh_database).connect() as killer:
                    killer.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": lost[0]})
                raise psycopg2.OperationalError("server closed the connection unexpectedly")

        event.listen(engine, "after_cursor_execute", lose_the_reply)
        with pytest.raises(CommitOutcomeUnknown):
            write_successes(held, [(LeaseIdentity.of(job), None)])
        event.remove(engine, "after_cursor_execute", lose_the_reply)
        assert lost
        assert scalar(engine, "SELECT status FROM job_queue WHERE id = :id", id=job.id) == "SUCCEEDED"
        assert scalar(engine, "SELECT count(*) FROM job_events WHERE event_type = 'SUCCEEDED'") == 1
    finally:
        held.close()
        engine.dispose()
