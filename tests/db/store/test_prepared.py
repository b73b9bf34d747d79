"""Hot statements run prepared on the store's own connections, and only there."""

from __future__ import annotations

from sqlalchemy import event, text

import runledger_sync as rl
from runledger_sync.store import enqueue as store_enqueue
from runledger_sync.store._prepared import OPTION
from runledger_sync.store.held import HeldConnection
from tests.support import JOB_TYPE, define, scalar


def prepared_names(held: HeldConnection) -> list[str]:
    with held.connect() as connection:
        names = list(connection.execute(text("SELECT name FROM pg_prepared_statements ORDER BY name")).scalars())
        connection.rollback()
    return names


def test_the_store_prepares_once_per_connection_and_then_only_executes(engine, held):
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2].split()[0]))
    for n in range(3):
        store_enqueue.enqueue(held, JOB_TYPE, {"n": n})
    assert statements == ["PREPARE", "EXECUTE", "EXECUTE", "EXECUTE"]
    assert [name.split("_")[1] for name in prepared_names(held)] == ["enqueue"]
    assert [job.payload for job in rl.list_jobs(engine)] == [{"n": 2}, {"n": 1}, {"n": 0}]


def test_a_callers_transaction_is_left_without_prepared_statements(engine):
    define(engine)
    with engine.begin() as connection:
        store_enqueue.enqueue(connection, JOB_TYPE, {"in": "caller"})
        assert list(connection.execute(text("SELECT name FROM pg_prepared_statements")).scalars()) == []
    assert scalar(engine, "SELECT count(*) FROM job_queue") == 1


def test_the_execution_option_turns_them_off(engine):
    define(engine)
    plain = engine.execution_options(**{OPTION: False})
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2].split()[0]))
    store_enqueue.enqueue(plain, JOB_TYPE, {})
    assert statements == ["WITH"]
    assert scalar(engine, "SELECT count(*) FROM job_queue") == 1


def test_statements_the_server_dropped_are_prepared_again_and_nothing_is_written_twice(engine, held):
    store_enqueue.enqueue(held, JOB_TYPE, {"n": 1})
    with held.connect() as connection:
        # What a pooler's DISCARD ALL or an operator's DEALLOCATE does behind our back.
        connection.execute(text("DEALLOCATE ALL"))
        connection.commit()
    store_enqueue.enqueue(held, JOB_TYPE, {"n": 2})
    assert sorted(job.payload["n"] for job in rl.list_jobs(engine)) == [1, 2]
    assert len(prepared_names(held)) == 1
