"""Enqueue (T1), batches, idempotency (spec section 9) and bad input, on a real PostgreSQL."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy
from sqlalchemy import event, text

from runledger_sync.core import errors
from runledger_sync.core.records import JobDefinition, JobSpec
from runledger_sync.core.store_errors import ConnectionFailed, PermissionDenied
from runledger_sync.core.states import JobStage, JobStatus
from runledger_sync.db.engine import create_engine
from runledger_sync.store.enqueue.enqueue import enqueue, enqueue_many
from runledger_sync.store.definitions import set_job_definition_enabled, sync_job_definitions, upsert_job_definition
from tests.support import JOB_TYPE, define, events, rows, scalar, without_plan_settings


def count_jobs(engine) -> int:
    return scalar(engine, "SELECT count(*) FROM job_queue")


def test_enqueue_takes_definition_defaults_and_writes_enqueued_event(engine):
    define(engine, max_attempts=4, default_timeout_seconds=120, default_priority=7)
    job = enqueue(engine, JOB_TYPE, {"to": "a@b.c"}, event_log="full")
    assert (job.status, job.stage, job.attempt, job.run_number) == (JobStatus.PENDING, JobStage.QUEUED, 0, 1)
    assert (job.max_attempts, job.timeout_seconds, job.priority) == (4, 120, 7)
    assert job.payload == {"to": "a@b.c"}
    assert job.id.version == 7
    db_now = scalar(engine, "SELECT now()")
    assert abs((job.next_run_at - db_now).total_seconds()) < 5
    assert events(engine, job.id) == [("ENQUEUED", None, {"job_type": JOB_TYPE})]
    assert job.enqueue_request is None  # unkeyed enqueues never store a snapshot


def test_enqueue_explicit_values_override_defaults(engine):
    define(engine)
    run_at = datetime.now(timezone.utc) + timedelta(hours=1)
    job = enqueue(engine, JOB_TYPE, [1, 2], priority=-5, max_attempts=2, timeout_seconds=5, run_at=run_at,
                        organization_id="org-1", stage=JobStage.SCHEDULED)
    assert (job.priority, job.max_attempts, job.timeout_seconds) == (-5, 2, 5)
    assert job.next_run_at == run_at
    assert job.organization_id == "org-1"
    assert job.stage is JobStage.SCHEDULED
    assert job.payload == [1, 2]


def test_delay_seconds_postpones_next_run_at(engine):
    define(engine)
    job = enqueue(engine, JOB_TYPE, {}, delay_seconds=120)
    delay = scalar(engine, "SELECT extract(epoch FROM next_run_at - created_at) FROM job_queue WHERE id = :id", id=job.id)
    assert 119.9 <= float(delay) <= 120.1


@pytest.mark.parametrize("enabled", [False, None])
def test_unknown_or_disabled_type_is_refused_and_writes_nothing(engine, enabled):
    if enabled is False:
        define(engine)
        set_job_definition_enabled(engine, JOB_TYPE, False)
    with pytest.raises(errors.DefinitionNotFoundOrDisabled) as caught:
        enqueue(engine, JOB_TYPE, {})
    assert caught.value.code == "job.definition_not_found_or_disabled"
    assert count_jobs(engine) == 0
    assert scalar(engine, "SELECT count(*) FROM job_events") == 0


BAD_INPUT = [
    ({"job_type": ""}, "job.invalid_job_type"),
    ({"job_type": "   "}, "job.invalid_job_type"),
    ({"job_type": "x" * 256}, "job.invalid_job_type"),
    ({"job_type": 42}, "job.invalid_job_type"),
    ({"job_type": "a\x00b"}, "job.invalid_job_type"),
    ({"payload": {1, 2}}, "job.invalid_payload"),
    ({"payload": object()}, "job.invalid_payload"),
    ({"payload": {"x": float("nan")}}, "job.invalid_payload"),
    ({"payload": {"x": "nul\x00byte"}}, "job.invalid_payload"),
    ({"payload": {"big": "x" * 2000}, "max_payload_bytes": 1000}, "job.invalid_payload"),
    ({"priority": True}, "job.invalid_argument"),
    ({"priority": 10**9}, "job.invalid_argument"),
    ({"priority": "1"}, "job.invalid_argument"),
    ({"max_attempts": 0}, "job.invalid_argument"),
    ({"max_attempts": -1}, "job.invalid_argument"),
    ({"max_attempts": 1001}, "job.invalid_argument"),
    ({"timeout_seconds": 0}, "job.invalid_argument"),
    ({"timeout_seconds": 10**9}, "job.invalid_argument"),
    ({"delay_seconds": -1}, "job.invalid_argument"),
    ({"delay_seconds": float("inf")}, "job.invalid_argument"),
    ({"run_at": datetime(2030, 1, 1)}, "job.invalid_argument"),
    ({"run_at": "tomorrow"}, "job.invalid_argument"),
    ({"run_at": datetime.now(timezone.utc), "delay_seconds": 1}, "job.invalid_argument"),
    ({"organization_id": " "}, "job.invalid_argument"),
    ({"organization_id": "o'; DROP TABLE job_queue; --" * 20}, "job.invalid_argument"),
    ({"idempotency_key": ""}, "job.invalid_argument"),
    ({"idempotency_key": "k" * 513}, "job.invalid_argument"),
]


@pytest.mark.parametrize("arguments, code", BAD_INPUT)
def test_bad_input_gets_its_code_and_writes_nothing(engine, arguments, code):
    define(engine)
    arguments = {"job_type": JOB_TYPE, "payload": {}} | arguments
    job_type = arguments.pop("job_type")
    payload = arguments.pop("payload")
    with pytest.raises(errors.RunledgerError) as caught:
        enqueue(engine, job_type, payload, **arguments)
    assert caught.value.code == code
    assert isinstance(caught.value, errors.ValidationError)
    assert count_jobs(engine) == 0


def test_sql_metacharacters_are_data_not_sql(engine):
    hostile = "t'); DELETE FROM job_queue; --"
    define(engine, hostile)
    job = enqueue(engine, hostile, {"q": "'; DROP TABLE job_events; --"}, organization_id="o' OR '1'='1", event_log="full")
    assert rows(engine, "SELECT job_type, organization_id FROM job_queue WHERE id = :id", id=job.id) == [
        (hostile, "o' OR '1'='1")
    ]
    assert scalar(engine, "SELECT count(*) FROM job_events") == 1


def test_enqueue_many_is_one_statement_keeps_order_and_returns_records(engine):
    define(engine)
    statements = []
    event.listen(engine.sync_engine if hasattr(engine, "sync_engine") else engine, "before_cursor_execute",
                 lambda *args: statements.append(args[2]))
    specs = [JobSpec(JOB_TYPE, {"i": i}, priority=i % 3) for i in range(500)]
    jobs = enqueue_many(engine, specs, event_log="full")
    # The first use on a connection also prepares the statement, once.
    assert [without_plan_settings(s).split()[0] for s in statements] == ["PREPARE", "EXECUTE"]
    assert [job.payload["i"] for job in jobs] == list(range(500))
    assert [job.priority for job in jobs] == [i % 3 for i in range(500)]
    assert count_jobs(engine) == 500
    assert scalar(engine, "SELECT count(*) FROM job_events WHERE event_type = 'ENQUEUED'") == 500
    statements.clear()
    enqueue_many(engine, specs, event_log="full")
    assert [without_plan_settings(s).split()[0] for s in statements] == ["EXECUTE"]


def test_engine_enqueue_commits_with_its_statement_and_leaves_the_pooled_connection_transactional(engine):
    define(engine)
    in_autocommit = []
    event.listen(engine, "before_cursor_execute",
                 lambda conn, *args: in_autocommit.append(conn.connection.dbapi_connection.autocommit))
    enqueue(engine, JOB_TYPE, {"a": 1})
    # No BEGIN and no COMMIT round trip: the one statement is its own transaction.
    assert in_autocommit and all(in_autocommit)
    with engine.connect() as conn:
        assert conn.connection.dbapi_connection.autocommit is False
        conn.execute(text("CREATE TEMP TABLE scratch (x int)"))
        conn.rollback()
        assert scalar(engine, "SELECT count(*) FROM pg_tables WHERE tablename = 'scratch'") == 0
    assert count_jobs(engine) == 1


def test_an_autocommit_engine_keeps_its_connections_in_autocommit_after_an_enqueue(fresh_database):
    engine = create_engine(fresh_database, isolation_level="AUTOCOMMIT", pool_size=1, max_overflow=0)
    try:
        define(engine)
        enqueue(engine, JOB_TYPE, {"a": 1})
        with engine.connect() as conn:
            assert conn.connection.dbapi_connection.autocommit is True
        assert count_jobs(engine) == 1
    finally:
        engine.dispose()


def test_enqueue_many_rejects_the_whole_batch_for_one_unknown_type(engine):
    define(engine)
    specs = [JobSpec(JOB_TYPE, {}), JobSpec("missing.type", {}), JobSpec(JOB_TYPE, {})]
    with pytest.raises(errors.DefinitionNotFoundOrDisabled) as caught:
        enqueue_many(engine, specs)
    assert "missing.type" in caught.value.message
    assert count_jobs(engine) == 0


def test_enqueue_many_rejects_the_whole_batch_for_one_bad_payload(engine):
    define(engine)
    with pytest.raises(errors.InvalidPayload):
        enqueue_many(engine, [JobSpec(JOB_TYPE, {}), JobSpec(JOB_TYPE, {"bad": {1}})])
    assert count_jobs(engine) == 0


def test_enqueue_many_of_nothing_returns_nothing(engine):
    assert enqueue_many(engine, []) == []


def test_connection_enqueue_joins_the_callers_transaction(engine):
    define(engine)
    with engine.connect() as conn:
        enqueue(conn, JOB_TYPE, {"n": 1})
        assert conn.execute(text("SELECT count(*) FROM job_queue")).scalar() == 1
        conn.rollback()
    assert count_jobs(engine) == 0
    with engine.connect() as conn:
        job = enqueue(conn, JOB_TYPE, {"n": 2}, event_log="full")
        conn.commit()
    assert rows(engine, "SELECT payload FROM job_queue") == [({"n": 2},)]
    assert events(engine, job.id)[0][0] == "ENQUEUED"


def test_failed_enqueue_inside_callers_transaction_leaves_their_rows_alone(engine):
    define(engine)
    with engine.begin() as conn:
        enqueue(conn, JOB_TYPE, {"kept": True})
        with pytest.raises(errors.InvalidPayload):
            enqueue(conn, JOB_TYPE, {"bad": {1}})
    assert rows(engine, "SELECT payload FROM job_queue") == [({"kept": True},)]


# -- idempotency --------------------------------------------------------------


def test_same_key_and_request_returns_the_existing_job_without_a_second_event(engine):
    define(engine)
    first = enqueue(engine, JOB_TYPE, {"a": 1}, idempotency_key="order-1", event_log="full")
    again = enqueue(engine, JOB_TYPE, {"a": 1}, idempotency_key="order-1", event_log="full")
    assert again.id == first.id
    assert count_jobs(engine) == 1
    assert len(events(engine, first.id)) == 1
    assert first.enqueue_request["payload"] == {"a": 1}


def test_same_key_with_a_different_request_is_a_conflict(engine):
    define(engine)
    first = enqueue(engine, JOB_TYPE, {"a": 1}, idempotency_key="order-1")
    with pytest.raises(errors.IdempotencyConflict) as caught:
        enqueue(engine, JOB_TYPE, {"a": 1}, idempotency_key="order-1", priority=5)
    assert caught.value.code == "job.idempotency_conflict"
    assert str(first.id) in caught.value.message
    assert count_jobs(engine) == 1


def test_keys_are_scoped_per_type_and_organization(engine):
    define(engine)
    define(engine, "other.job")
    ids = {
        enqueue(engine, JOB_TYPE, {}, idempotency_key="k").id,
        enqueue(engine, JOB_TYPE, {}, idempotency_key="k", organization_id="org-1").id,
        enqueue(engine, JOB_TYPE, {}, idempotency_key="k", organization_id="org-2").id,
        enqueue(engine, "other.job", {}, idempotency_key="k").id,
    }
    assert len(ids) == 4
    assert enqueue(engine, JOB_TYPE, {}, idempotency_key="k", organization_id="org-1").id in ids
    assert count_jobs(engine) == 4


def test_keys_match_jobs_in_any_status(engine):
    define(engine)
    first = enqueue(engine, JOB_TYPE, {}, idempotency_key="k")
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET status = 'SUCCEEDED' WHERE id = :id"), {"id": first.id})
    assert enqueue(engine, JOB_TYPE, {}, idempotency_key="k").id == first.id


def test_duplicate_keys_inside_one_batch_return_one_job(engine):
    define(engine)
    jobs = enqueue_many(engine, [JobSpec(JOB_TYPE, {"x": 1}, idempotency_key="k"),
                                       JobSpec(JOB_TYPE, {"x": 1}, idempotency_key="k"),
                                       JobSpec(JOB_TYPE, {"x": 2})])
    assert jobs[0].id == jobs[1].id != jobs[2].id
    assert count_jobs(engine) == 2


def test_concurrent_idempotent_enqueues_create_one_job(engine):
    define(engine)
    barrier = threading.Barrier(6)
    found, failures = [], []

    def enqueue_once():
        barrier.wait()
        try:
            found.append(enqueue(engine, JOB_TYPE, {"same": True}, idempotency_key="race").id)
        except Exception as exc:  # collected so the assertion names it
            failures.append(exc)

    threads = [threading.Thread(target=enqueue_once) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert len(set(found)) == 1 and len(found) == 6
    assert count_jobs(engine) == 1


def test_keyed_enqueue_outside_read_committed_is_refused(engine):
    define(engine)
    with engine.connect() as conn:
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(errors.EnqueueIdempotencyUnsupportedIsolation) as caught:
            enqueue(conn, JOB_TYPE, {}, idempotency_key="k")
        assert caught.value.code == "job.enqueue_idempotency_unsupported_isolation"
        conn.rollback()
    assert count_jobs(engine) == 0


def test_unkeyed_enqueue_works_under_repeatable_read(engine):
    define(engine)
    with engine.connect() as conn:
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        enqueue(conn, JOB_TYPE, {})
        conn.commit()
    assert count_jobs(engine) == 1


def test_keyed_row_without_snapshot_is_a_legacy_conflict(engine):
    define(engine)
    job = enqueue(engine, JOB_TYPE, {}, idempotency_key="old")
    with engine.begin() as conn:
        # Rows written before snapshots existed: simulate one by lifting the CHECK.
        conn.execute(text("ALTER TABLE job_queue DROP CONSTRAINT ck_job_queue_idempotency_enqueue_request"))
        conn.execute(text("UPDATE job_queue SET enqueue_request = NULL WHERE id = :id"), {"id": job.id})
    with pytest.raises(errors.LegacyIdempotencySnapshotMissing) as caught:
        enqueue(engine, JOB_TYPE, {}, idempotency_key="old")
    assert caught.value.code == "job.legacy_idempotency_snapshot_missing"


def test_snapshot_is_the_request_not_the_resolved_defaults(engine):
    define(engine, default_priority=1)
    first = enqueue(engine, JOB_TYPE, {"p": 1}, idempotency_key="k")
    sync_job_definitions(engine, [JobDefinition(JOB_TYPE, default_priority=99)])
    assert enqueue(engine, JOB_TYPE, {"p": 1}, idempotency_key="k").id == first.id
    assert first.enqueue_request == {
        "max_attempts": None, "next_run_at": None, "payload": {"p": 1}, "priority": None,
        "stage": "queued", "timeout_seconds": None,
    }


def test_snapshot_records_run_at_in_rfc3339_utc_with_microseconds(engine):
    define(engine)
    run_at = datetime(2031, 5, 6, 7, 8, 9, 123, tzinfo=timezone(timedelta(hours=2)))
    job = enqueue(engine, JOB_TYPE, {}, idempotency_key="k", run_at=run_at)
    assert job.enqueue_request["next_run_at"] == "2031-05-06T05:08:09.000123Z"


# -- definitions -----------------------------------------------------------------


def test_sync_definitions_overwrites_or_only_inserts_missing(engine):
    sync_job_definitions(engine, [JobDefinition(JOB_TYPE, max_attempts=3)])
    kept = sync_job_definitions(engine, [JobDefinition(JOB_TYPE, max_attempts=9)], overwrite=False)
    assert kept[0].max_attempts == 3
    replaced = upsert_job_definition(engine, JobDefinition(JOB_TYPE, max_attempts=9))
    assert replaced.max_attempts == 9
    assert scalar(engine, "SELECT max_attempts FROM job_definitions") == 9


def test_updated_at_moves_when_a_definition_changes(engine):
    define(engine)
    before = scalar(engine, "SELECT updated_at FROM job_definitions")
    set_job_definition_enabled(engine, JOB_TYPE, False)
    assert scalar(engine, "SELECT updated_at FROM job_definitions") > before


def test_enabling_an_unknown_type_is_not_found(engine):
    with pytest.raises(errors.DefinitionNotFoundOrDisabled):
        set_job_definition_enabled(engine, "nope", True)


# -- connection failures -----------------------------------------------------------


def test_unreachable_database_is_connection_failed_with_password_masked():
    engine = create_engine("postgresql://app:s3cr3t-pass@127.0.0.1:9/nowhere", connect_args={"connect_timeout": 1})
    try:
        with pytest.raises(ConnectionFailed) as caught:
            enqueue(engine, JOB_TYPE, {})
    finally:
        engine.dispose()
    assert caught.value.code == "db.connection_failed"
    assert "s3cr3t-pass" not in str(caught.value)
    assert "***" in str(caught.value)


def test_engine_without_url_is_a_config_error(monkeypatch):
    monkeypatch.delenv("RUNLEDGER_DATABASE_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with pytest.raises(errors.ConfigError) as caught:
        create_engine()
    assert caught.value.code == "config.invalid"


def test_non_postgres_url_is_a_config_error():
    with pytest.raises(errors.ConfigError):
        create_engine("sqlite:///x.db")


def test_database_error_is_mapped_and_chained(engine):
    define(engine)
    with engine.connect() as conn:
        conn.execute(text("REVOKE INSERT ON job_queue FROM PUBLIC"))
        conn.execute(text("CREATE ROLE rl_reader NOLOGIN"))
        conn.execute(text("GRANT SELECT ON ALL TABLES IN SCHEMA public TO rl_reader"))
        conn.execute(text("SET ROLE rl_reader"))
        with pytest.raises(PermissionDenied) as caught:
            enqueue(conn, JOB_TYPE, {})
        conn.rollback()
    assert caught.value.code == "db.permission_denied"
    assert isinstance(caught.value.__cause__, sqlalchemy.exc.DBAPIError)
