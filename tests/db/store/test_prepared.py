"""Hot statements run prepared on the store's own connections, and only there."""

from __future__ import annotations

import pytest
from sqlalchemy import Integer, Text, bindparam, create_engine, event, func, literal, select, text
from sqlalchemy.engine import make_url

import runledger_sync as rl
from runledger_sync.core import errors
from runledger_sync.db.pool_mode import POOL_MODE_VARIABLE, PoolMode, policy_of
from runledger_sync.store.enqueue.enqueue import enqueue
from runledger_sync.store.transactions import run_in_transaction
from runledger_sync.store.prepared import OPTION, PreparedStatement, execute_in_turn
from runledger_sync.store.claim.claim import claim_prestart_jobs_for_types
from runledger_sync.store.transactions import HeldConnection
from tests.support import JOB_TYPE, define, scalar, without_plan_settings


def prepared_names(held: HeldConnection) -> list[str]:
    with held.connect() as connection:
        names = list(connection.execute(text("SELECT name FROM pg_prepared_statements ORDER BY name")).scalars())
        connection.rollback()
    return names


def test_the_store_prepares_once_per_connection_and_then_only_executes(engine, held):
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *args: statements.append(without_plan_settings(args[2]).split()[0]))
    for n in range(3):
        enqueue(held, JOB_TYPE, {"n": n})
    assert statements == ["PREPARE", "EXECUTE", "EXECUTE", "EXECUTE"]
    assert [name.split("_")[1] for name in prepared_names(held)] == ["enqueue"]
    assert [job.payload for job in rl.list_jobs(engine)] == [{"n": 2}, {"n": 1}, {"n": 0}]


def test_a_callers_transaction_is_left_without_prepared_statements(engine):
    define(engine)
    with engine.begin() as connection:
        enqueue(connection, JOB_TYPE, {"in": "caller"})
        assert list(connection.execute(text("SELECT name FROM pg_prepared_statements")).scalars()) == []
    assert scalar(engine, "SELECT count(*) FROM job_queue") == 1


def test_the_execution_option_turns_them_off(engine):
    define(engine)
    plain = engine.execution_options(**{OPTION: False})
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *args: statements.append(without_plan_settings(args[2]).split()[0]))
    enqueue(plain, JOB_TYPE, {})
    assert statements == ["WITH"]
    assert scalar(engine, "SELECT count(*) FROM job_queue") == 1


def test_statements_the_server_dropped_are_prepared_again_and_nothing_is_written_twice(engine, held):
    enqueue(held, JOB_TYPE, {"n": 1})
    with held.connect() as connection:
        # What a pooler's DISCARD ALL or an operator's DEALLOCATE does behind our back.
        connection.execute(text("DEALLOCATE ALL"))
        connection.commit()
    enqueue(held, JOB_TYPE, {"n": 2})
    assert sorted(job.payload["n"] for job in rl.list_jobs(engine)) == [1, 2]
    assert len(prepared_names(held)) == 1


def run_prepared(held: HeldConnection, *statements: PreparedStatement, parameters: dict) -> list:
    return run_in_transaction(held, lambda connection: list(execute_in_turn(connection, statements, parameters)))


def test_statements_run_in_turn_share_one_round_trip_and_give_the_last_result(engine, held):
    first = PreparedStatement("test_first", select(func.set_config("application_name", bindparam("name", type_=Text), True)))
    second = PreparedStatement("test_second", select(func.current_setting("application_name").label("name")))
    run_prepared(held, first, second, parameters={"name": "warm"})  # prepares both
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    assert run_prepared(held, first, second, parameters={"name": "in turn"}) == [("in turn",)]
    assert len(statements) == 1 and statements[0].count("EXECUTE") == 2


def test_a_statement_that_cannot_be_prepared_is_refused_by_name(held):
    untyped = PreparedStatement("test_untyped", select(bindparam("value")))
    with pytest.raises(TypeError, match="test_untyped: parameter value needs one explicit type"):
        run_prepared(held, untyped, parameters={"value": 1})
    as_number = PreparedStatement("test_number", select(bindparam("value", type_=Integer)))
    as_text = PreparedStatement("test_text", select(bindparam("value", type_=Text)))
    with pytest.raises(TypeError, match="means different things"):
        run_prepared(held, as_number, as_text, parameters={"value": 1})


def test_literals_of_statements_sent_together_keep_their_own_values(held):
    # SQLAlchemy names both literals "param_1"; each must still send its own value.
    first = PreparedStatement("test_one", select(literal(1, Integer).label("n")))
    second = PreparedStatement("test_two", select(literal(2, Integer).label("n")))
    assert run_prepared(held, second, first, parameters={}) == [(1,)]
    assert run_prepared(held, first, second, parameters={}) == [(2,)]


def test_a_statements_own_numbers_and_words_are_sent_as_text_and_only_other_values_are_bound(engine, held):
    # The enqueue statement carries a dozen such values; binding each on every call cost more than sending it.
    odd = "50% off: 'now'"
    statement = PreparedStatement("test_constants", select(
        literal(7, Integer).label("n"), literal("ENQUEUED", Text).label("word"), literal(odd, Text).label("odd"),
        bindparam("value", type_=Text).label("value"),
    ))
    run_prepared(held, statement, parameters={"value": "warm"})  # prepares it
    sent: list[tuple[str, dict]] = []
    event.listen(engine, "before_cursor_execute", lambda *args: sent.append((args[2], args[3])))
    assert run_prepared(held, statement, parameters={"value": "b"}) == [(7, "ENQUEUED", odd, "b")]
    [(sql, parameters)] = sent
    assert "(7, 'ENQUEUED', %(" in sql
    assert sorted(parameters.values()) == sorted([odd, "b"])


def test_a_psycopg3_engine_runs_the_plain_statements_and_its_jobs_go_through(fresh_database):
    pytest.importorskip("psycopg")
    engine = create_engine(make_url(fresh_database).set(drivername="postgresql+psycopg"))
    try:
        define(engine)
        job = enqueue(engine, JOB_TYPE, {"driver": "psycopg"})
        [claimed] = claim_prestart_jobs_for_types(engine, worker_id="w", lease_ttl_seconds=30, limit=2,
                                                            job_types=[JOB_TYPE])
        assert claimed.id == job.id
        with engine.connect() as connection:
            assert list(connection.execute(text("SELECT name FROM pg_prepared_statements WHERE name LIKE 'runledger%'"))) == []
    finally:
        engine.dispose()


def warnings_naming_the_setting(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "RUNLEDGER_POOL_MODE" in r.getMessage()]


def test_statements_that_vanish_again_on_the_rerun_switch_the_engine_to_plain_statements(engine, held, caplog):
    # Gone again on the rerun: the next transaction ran in another session, as behind a
    # transaction pooler. Nothing was written by the failed runs; the plain run writes once.
    def drop_them_first(_conn, cursor, statement, *_):
        if without_plan_settings(statement).startswith("EXECUTE"):
            cursor.execute("DEALLOCATE ALL")

    event.listen(engine, "before_cursor_execute", drop_them_first)
    enqueue(held, JOB_TYPE, {"n": 1})
    event.remove(engine, "before_cursor_execute", drop_them_first)
    assert scalar(engine, "SELECT count(*) FROM job_queue") == 1
    assert not policy_of(engine).prepares
    assert len(warnings_naming_the_setting(caplog)) == 1


def test_a_statement_another_client_prepared_in_the_session_switches_the_engine_and_is_deallocated(engine, held, caplog):
    enqueue(held, JOB_TYPE, {"n": 1})
    with held.connect() as connection:
        # What a transaction pooler does: this session now serves a client that never
        # prepared here (it knows of no statement), and its PREPARE finds one (42P05).
        connection.info.pop("runledger_prepared")
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *args: statements.append(without_plan_settings(args[2]).split()[0]))
    for n in (2, 3):
        enqueue(held, JOB_TYPE, {"n": n})
    assert statements == ["PREPARE", "DO", "WITH", "WITH"]
    assert sorted(job.payload["n"] for job in rl.list_jobs(engine)) == [1, 2, 3]
    assert prepared_names(held) == []
    [warning] = warnings_naming_the_setting(caplog)
    assert "running statements unprepared" in warning
    # Engines derived from it share the pool, and what was learnt about it.
    assert not policy_of(rl.with_schema(engine, "public")).prepares


def test_other_connections_of_a_switched_engine_deallocate_theirs_on_next_use(engine, held, caplog):
    other = HeldConnection(engine)
    try:
        enqueue(other, JOB_TYPE, {"n": 1})
        assert len(prepared_names(other)) == 1
        enqueue(held, JOB_TYPE, {"n": 2})
        with held.connect() as connection:
            connection.info.pop("runledger_prepared")
        enqueue(held, JOB_TYPE, {"n": 3})  # 42P05: the engine stops preparing
        enqueue(other, JOB_TYPE, {"n": 4})
        assert prepared_names(other) == []
        assert scalar(engine, "SELECT count(*) FROM job_queue") == 4
        assert len(warnings_naming_the_setting(caplog)) == 1
    finally:
        other.close()


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_an_engine_in_transaction_pool_mode_prepares_nothing(fresh_database, monkeypatch, how):
    monkeypatch.delenv(POOL_MODE_VARIABLE, raising=False)
    if how == "environment":
        monkeypatch.setenv(POOL_MODE_VARIABLE, "Transaction")
    engine = rl.create_engine(fresh_database, pool_mode="transaction" if how == "argument" else None)
    try:
        define(engine)
        statements: list[str] = []
        event.listen(engine, "before_cursor_execute", lambda *args: statements.append(without_plan_settings(args[2]).split()[0]))
        held = HeldConnection(engine)
        enqueue(held, JOB_TYPE, {})
        claim_prestart_jobs_for_types(held, worker_id="w", lease_ttl_seconds=30, limit=1, job_types=[JOB_TYPE])
        held.close()
        assert "PREPARE" not in statements and "EXECUTE" not in statements
        assert policy_of(engine).mode is PoolMode.TRANSACTION
    finally:
        engine.dispose()


def test_an_unknown_pool_mode_is_refused_with_the_allowed_values(fresh_database, monkeypatch):
    with pytest.raises(errors.ConfigError, match="pool_mode must be one of session, transaction, got 'statement'"):
        rl.create_engine(fresh_database, pool_mode="statement")
    monkeypatch.setenv(POOL_MODE_VARIABLE, "sesion")
    with pytest.raises(errors.ConfigError, match="RUNLEDGER_POOL_MODE must be one of session, transaction"):
        rl.create_engine(fresh_database)
