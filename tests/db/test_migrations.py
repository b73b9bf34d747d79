"""The bundled Alembic history against a real PostgreSQL.

Each test starts from an empty database (``empty_database``), so upgrade,
downgrade, schema placement and privileges are exercised from scratch rather
than on the shared migrated template.
"""

from __future__ import annotations

import ast
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import sqlalchemy
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Engine, make_url

import runledger_sync
from runledger_sync import cli
from runledger_sync.core.records import JobDefinition
from runledger_sync.core.store_errors import ConnectionFailed, MigrationFailed, SchemaMismatch
from runledger_sync.db.schema_queues import KEY_GUESS_FUNCTION, KEY_SETTLE_FUNCTION, KEY_TRIGGER_NAMES
from runledger_sync.db.engine import create_engine
from runledger_sync.db.migrate import (
    VERSION_TABLE,
    check_schema,
    current_revision,
    downgrade,
    head_revision,
    migrate,
    migrations_directory,
)
from runledger_sync.db.schema import metadata
from runledger_sync.db.schema_batches import (
    BATCH_FINISH_TRIGGER,
    BATCH_MEMBER_ADDED_TRIGGER,
    BATCH_MEMBER_MOVED_TRIGGER,
    BATCH_RUN_ADDED_TRIGGER,
    BATCH_RUN_MOVED_TRIGGER,
)
from runledger_sync.db.schema_unique import UNIQUE_REENTRY_TRIGGER
from runledger_sync.store.driver import claim_jobs
from runledger_sync.store.enqueue.enqueue import enqueue
from runledger_sync.store.definitions import sync_job_definitions
from runledger_sync.store.attempt.ends import complete_job_success

QUEUE_TABLES = {"job_definitions", "job_queue", "job_attempts", "job_events", "job_dead_letters"}
TRIGGER_FUNCTION = "runledger_set_updated_at"
WORKFLOW_TABLES = {"workflow_runs", "workflow_steps", "workflow_step_dependencies"}
LINK_TRIGGERS = {("job_queue", "trg_job_queue_workflow_link"), ("workflow_steps", "trg_workflow_steps_job_link")}
KEY_TRIGGERS = {("job_queue", name) for name in KEY_TRIGGER_NAMES}
#: Every trigger at head: 0003 left only the schedules' updated_at one; 0004 the job/step
#: linkage triggers; 0005 the concurrency-key triggers; 0013 the unique re-entry trigger;
#: 0014 the batch member and finish triggers; 0017 a workflow run's member triggers.
BATCH_TRIGGERS = {("job_queue", BATCH_MEMBER_ADDED_TRIGGER), ("job_queue", BATCH_MEMBER_MOVED_TRIGGER),
                  ("job_batches", BATCH_FINISH_TRIGGER), ("workflow_runs", BATCH_RUN_ADDED_TRIGGER),
                  ("workflow_runs", BATCH_RUN_MOVED_TRIGGER)}
HEAD_TRIGGERS = ({("job_schedules", "trg_job_schedules_updated_at")} | LINK_TRIGGERS | KEY_TRIGGERS
                 | {("job_queue", UNIQUE_REENTRY_TRIGGER)} | BATCH_TRIGGERS)


@pytest.fixture
def empty_engine(empty_database: str) -> Iterator[Engine]:
    engine = create_engine(empty_database)
    yield engine
    engine.dispose()


def tables_in(engine: Engine, schema: str = "public") -> set[str]:
    with engine.connect() as connection:
        return set(sqlalchemy.inspect(connection).get_table_names(schema=schema))


def functions_named(engine: Engine, name: str) -> list[str]:
    with engine.connect() as connection:
        rows = connection.execute(
            sqlalchemy.text(
                "SELECT n.nspname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE p.proname = :name ORDER BY 1"
            ),
            {"name": name},
        )
        return [row[0] for row in rows]


def triggers_of(engine: Engine) -> set[tuple[str, str]]:
    with engine.connect() as connection:
        rows = connection.execute(
            sqlalchemy.text(
                "SELECT c.relname, t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                "WHERE NOT t.tgisinternal"
            )
        )
        return {(row[0], row[1]) for row in rows}


def schema_diff(engine: Engine) -> list[Any]:
    def include_name(name: Any, type_: str, parent_names: Any) -> bool:
        return not (type_ == "table" and name == VERSION_TABLE)

    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"compare_type": True, "include_name": include_name}
        )
        return list(compare_metadata(context, metadata))


def set_version(engine: Engine, revision: str) -> None:
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text(f"UPDATE {VERSION_TABLE} SET version_num = :rev"), {"rev": revision})


# -- upgrade, compare, downgrade -------------------------------------------------


def test_upgrade_to_head_on_empty_database_creates_the_queue_tables(empty_engine):
    assert tables_in(empty_engine) == set()
    assert current_revision(empty_engine) is None

    migrate(empty_engine)

    assert QUEUE_TABLES <= tables_in(empty_engine)
    assert current_revision(empty_engine) == head_revision()
    assert functions_named(empty_engine, TRIGGER_FUNCTION) == ["public"]
    # 0003: the hot tables' statements stamp updated_at themselves; only schedules keep a trigger.
    assert triggers_of(empty_engine) == HEAD_TRIGGERS


def test_migrated_schema_matches_the_sqlalchemy_metadata(empty_engine):
    migrate(empty_engine)

    assert schema_diff(empty_engine) == []


def test_schema_comparison_detects_drift(empty_engine):
    # Guards the test above: an empty diff must come from a matching schema, not
    # from a comparison that looks at nothing.
    migrate(empty_engine)
    with empty_engine.begin() as connection:
        connection.exec_driver_sql("DROP INDEX idx_job_queue_claim")
        connection.exec_driver_sql("ALTER TABLE job_events ALTER COLUMN stage TYPE varchar(20)")

    diff = repr(schema_diff(empty_engine))

    assert "idx_job_queue_claim" in diff
    assert "modify_type" in diff and "stage" in diff


def test_downgrade_to_base_removes_tables_and_trigger_function(empty_engine):
    migrate(empty_engine)

    downgrade(empty_engine, "base")

    assert tables_in(empty_engine) & QUEUE_TABLES == set()
    assert functions_named(empty_engine, TRIGGER_FUNCTION) == []
    assert current_revision(empty_engine) is None


def test_upgrade_after_downgrade_rebuilds_the_schema(empty_engine):
    migrate(empty_engine)
    downgrade(empty_engine)

    migrate(empty_engine)

    assert QUEUE_TABLES <= tables_in(empty_engine)
    assert current_revision(empty_engine) == head_revision()
    assert schema_diff(empty_engine) == []


def test_migrate_twice_is_a_no_op(empty_engine):
    migrate(empty_engine)
    with empty_engine.begin() as connection:
        connection.execute(sqlalchemy.text("INSERT INTO job_definitions (job_type) VALUES ('kept')"))

    migrate(empty_engine)

    assert current_revision(empty_engine) == head_revision()
    with empty_engine.connect() as connection:
        assert connection.execute(sqlalchemy.text("SELECT job_type FROM job_definitions")).scalars().all() == ["kept"]
        assert connection.execute(sqlalchemy.text(f"SELECT count(*) FROM {VERSION_TABLE}")).scalar_one() == 1


def test_two_threads_migrating_at_once_both_succeed(empty_database):
    engines = [create_engine(empty_database) for _ in range(2)]
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def run(engine: Engine) -> None:
        try:
            barrier.wait(timeout=10)
            migrate(engine)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    # Daemon threads and one overall deadline: the race can deadlock (one thread
    # waits on the advisory lock while the other runs its DDL through the first
    # thread's connection), and a hung migrate must fail this test, not the run.
    threads = [threading.Thread(target=run, args=(engine,), daemon=True) for engine in engines]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 20
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        assert not any(thread.is_alive() for thread in threads), "migrate() hung"
        assert errors == []
        assert current_revision(engines[0]) == head_revision()
        with engines[0].connect() as connection:
            assert connection.execute(sqlalchemy.text(f"SELECT count(*) FROM {VERSION_TABLE}")).scalar_one() == 1
    finally:
        for engine in engines:
            engine.dispose()


def migration_lock_key() -> int:
    """The advisory-lock key env.py takes, read from the bundled env.py itself."""
    tree = ast.parse((migrations_directory() / "env.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "MIGRATION_LOCK_KEY" for target in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError("env.py defines no MIGRATION_LOCK_KEY")


def test_migrate_waits_for_the_migration_advisory_lock(empty_database):
    holder = create_engine(empty_database)
    engine = create_engine(empty_database)
    finished = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            migrate(engine)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            finished.set()

    try:
        with holder.connect() as connection:
            connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": migration_lock_key()})
            thread = threading.Thread(target=run)
            thread.start()
            assert not finished.wait(1.0), "migrate did not wait for the advisory lock"
            connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": migration_lock_key()})
            connection.commit()
        assert finished.wait(30)
        thread.join(timeout=5)
        assert errors == []
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()
        holder.dispose()


_MIGRATE_IN_A_PROCESS = """
import sys
from runledger_sync.db.engine import create_engine
from runledger_sync.db.migrate import migrate
engine = create_engine(sys.argv[1])
sys.stdin.read()  # start line: both processes are past their imports
migrate(engine)
engine.dispose()
"""


def test_two_processes_migrating_at_once_both_succeed(empty_database):
    root = str(Path(runledger_sync.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _MIGRATE_IN_A_PROCESS, empty_database],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True,
        )
        for _ in range(2)
    ]
    results = []
    try:
        # Closing stdin releases both at (nearly) the same moment.
        for process in processes:
            process.stdin.close()
        for process in processes:
            err = process.stderr.read()
            process.wait(timeout=90)
            results.append((process.returncode, err.strip().splitlines()[-1:] if process.returncode else []))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
            process.stderr.close()
    assert results == [(0, []), (0, [])]
    engine = create_engine(empty_database)
    try:
        assert current_revision(engine) == head_revision()
        assert schema_diff(engine) == []
    finally:
        engine.dispose()


def test_version_table_is_runledger_alembic_version(empty_engine):
    migrate(empty_engine)

    tables = tables_in(empty_engine)
    assert VERSION_TABLE == "runledger_alembic_version"
    assert VERSION_TABLE in tables
    assert "alembic_version" not in tables
    with empty_engine.connect() as connection:
        versions = connection.execute(sqlalchemy.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    assert versions == [head_revision()]


# -- check_schema ------------------------------------------------------------------


def test_check_schema_on_empty_database_reports_behind(empty_engine):
    with pytest.raises(SchemaMismatch) as caught:
        check_schema(empty_engine)

    assert caught.value.code == "db.schema_mismatch"
    assert "runledger-sync migrate" in caught.value.message
    assert caught.value.details == {"current": None, "expected": head_revision()}


def test_check_schema_passes_at_head(empty_engine):
    migrate(empty_engine)

    assert check_schema(empty_engine) is None


def test_check_schema_on_unknown_revision_reports_ahead(empty_engine):
    migrate(empty_engine)
    set_version(empty_engine, "9999_from_the_future")

    with pytest.raises(SchemaMismatch) as caught:
        check_schema(empty_engine)

    assert caught.value.code == "db.schema_mismatch"
    assert "upgrade the library" in caught.value.message
    assert caught.value.details["current"] == "9999_from_the_future"


# -- the updated_at trigger ----------------------------------------------------------


def test_updated_at_trigger_bumps_job_schedules_updated_at(empty_engine):
    migrate(empty_engine)
    with empty_engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO job_definitions (job_type) VALUES ('t.touch'); "
            "INSERT INTO job_schedules (id, name, job_type, cron_expr, next_fire_at) "
            "VALUES (gen_random_uuid(), 'touch', 't.touch', '0 * * * * *', now())"
        )
        # Back-date the row so the trigger's now() is unambiguously later.
        connection.exec_driver_sql("ALTER TABLE job_schedules DISABLE TRIGGER trg_job_schedules_updated_at")
        connection.exec_driver_sql("UPDATE job_schedules SET updated_at = '2000-01-01T00:00:00Z'")
        connection.exec_driver_sql("ALTER TABLE job_schedules ENABLE TRIGGER trg_job_schedules_updated_at")

    with empty_engine.begin() as connection:
        # Even an explicit old value is overwritten: the trigger owns the column.
        connection.exec_driver_sql("UPDATE job_schedules SET updated_at = '2001-01-01T00:00:00Z', name = name")
        now = connection.exec_driver_sql("SELECT now()").scalar_one()

    with empty_engine.connect() as connection:
        created, updated = connection.exec_driver_sql("SELECT created_at, updated_at FROM job_schedules").one()
    assert updated == now
    assert updated >= created


# -- revision 0003: hot-path storage ---------------------------------------------------

LISTING_INDEXES_0002 = {"idx_job_queue_org_status_created", "idx_job_queue_type_status_created"}
LISTING_INDEXES_0003 = {"idx_job_queue_resting_status", "idx_job_queue_resting_type", "idx_job_queue_resting_org"}


def job_queue_state(engine: Engine) -> tuple[set[str], list[str] | None, set[tuple[str, str]]]:
    """job_queue's index names, its storage parameters, and the user triggers of the database."""
    with engine.connect() as connection:
        indexes = set(connection.execute(sqlalchemy.text(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'job_queue'")).scalars())
        options = connection.execute(sqlalchemy.text(
            "SELECT reloptions FROM pg_class WHERE relname = 'job_queue'")).scalar_one()
    return indexes, options, triggers_of(engine)


def test_0003_downgrade_restores_triggers_and_listing_indexes_and_upgrade_reapplies(empty_engine):
    migrate(empty_engine)
    indexes, options, triggers = job_queue_state(empty_engine)
    assert LISTING_INDEXES_0003 <= indexes and not indexes & LISTING_INDEXES_0002
    assert options == ["fillfactor=70"]
    assert ("job_queue", "trg_job_queue_updated_at") not in triggers

    downgrade(empty_engine, "0002")

    indexes, options, triggers = job_queue_state(empty_engine)
    assert LISTING_INDEXES_0002 <= indexes and not indexes & LISTING_INDEXES_0003
    assert options is None
    assert {("job_definitions", "trg_job_definitions_updated_at"), ("job_queue", "trg_job_queue_updated_at"),
            ("job_schedules", "trg_job_schedules_updated_at")} == triggers
    assert current_revision(empty_engine) == "0002"

    migrate(empty_engine)

    assert job_queue_state(empty_engine) == (
        indexes - LISTING_INDEXES_0002 | LISTING_INDEXES_0003
        | {"uq_job_queue_workflow_step_id", "idx_job_queue_key_live", "idx_job_queue_finished",
           "idx_job_queue_idempotency_key_prefix", "uq_job_queue_unique_org", "uq_job_queue_unique_global",
           "idx_job_queue_meta", "idx_job_queue_batch"},
        ["fillfactor=70"], HEAD_TRIGGERS,
    )
    assert schema_diff(empty_engine) == []


def test_metadata_create_all_builds_the_storage_parameters_the_migrations_set(empty_database, empty_engine):
    # compare_metadata() does not look at storage parameters: compare them here.
    migrate(empty_engine)
    other = create_engine(empty_database, schema="built_by_metadata")
    try:
        with empty_engine.begin() as connection:
            connection.exec_driver_sql("CREATE SCHEMA built_by_metadata")
        with other.begin() as connection:
            metadata.create_all(connection)
        with empty_engine.connect() as connection:
            options = dict(connection.execute(sqlalchemy.text(
                "SELECT n.nspname || '.' || c.relname, c.reloptions FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relname = 'job_queue'")).all())
    finally:
        other.dispose()
    assert options == {"public.job_queue": ["fillfactor=70"], "built_by_metadata.job_queue": ["fillfactor=70"]}


# -- revision 0004: workflows ------------------------------------------------------------


def job_queue_columns(engine: Engine) -> set[str]:
    with engine.connect() as connection:
        return set(connection.execute(sqlalchemy.text(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'job_queue'")).scalars())


def test_0004_downgrade_removes_the_workflow_schema_and_upgrade_rebuilds_it(empty_engine):
    migrate(empty_engine)
    assert WORKFLOW_TABLES <= tables_in(empty_engine)
    assert "workflow_step_id" in job_queue_columns(empty_engine)

    downgrade(empty_engine, "0003")

    assert tables_in(empty_engine) & WORKFLOW_TABLES == set()
    assert "workflow_step_id" not in job_queue_columns(empty_engine)
    assert triggers_of(empty_engine) & LINK_TRIGGERS == set()
    assert functions_named(empty_engine, "runledger_check_workflow_link") == []
    assert current_revision(empty_engine) == "0003"

    migrate(empty_engine)

    assert WORKFLOW_TABLES <= tables_in(empty_engine)
    assert LINK_TRIGGERS <= triggers_of(empty_engine)
    assert schema_diff(empty_engine) == []


def test_0004_keeps_jobs_enqueued_before_it(empty_engine):
    downgrade_target = "0003"
    migrate(empty_engine)
    downgrade(empty_engine, downgrade_target)
    with empty_engine.begin() as connection:
        connection.execute(sqlalchemy.text("INSERT INTO job_definitions (job_type) VALUES ('kept')"))
        connection.execute(sqlalchemy.text(
            "INSERT INTO job_queue (id, job_type, max_attempts) VALUES (gen_random_uuid(), 'kept', 3)"))

    migrate(empty_engine)

    with empty_engine.connect() as connection:
        rows = connection.execute(sqlalchemy.text("SELECT job_type, workflow_step_id FROM job_queue")).all()
    assert [tuple(row) for row in rows] == [("kept", None)]


# -- revision 0005: flow control ----------------------------------------------------------

FLOW_TABLES = {"job_queues", "job_queue_rate_claims", "job_workers"}
FLOW_COLUMNS = {"queue", "execution_resource_key", "blocked_by_key"}
KEY_TRIGGER_FUNCTION = KEY_GUESS_FUNCTION
KEY_AHEAD_FUNCTION = KEY_SETTLE_FUNCTION


def claim_index_definition(engine: Engine) -> str:
    with engine.connect() as connection:
        return connection.execute(sqlalchemy.text(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'idx_job_queue_claim'")).scalar_one()


def insert_jobs_as_0004_would(engine: Engine, statuses: list[str]) -> None:
    """Jobs written by code of revision 0004, which knows no queues: plain SQL, as that code's columns."""
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text("INSERT INTO job_definitions (job_type) VALUES ('kept')"))
        for n, status in enumerate(statuses):
            connection.execute(sqlalchemy.text(
                "INSERT INTO job_queue (id, job_type, max_attempts, status, payload, finished_at) "
                "VALUES (gen_random_uuid(), 'kept', 3, :status, CAST(:payload AS jsonb), "
                "CASE WHEN :status IN ('PENDING', 'LEASED') THEN NULL ELSE now() END)"),
                {"status": status, "payload": f'{{"n": {n}}}'})


def test_0005_downgrade_removes_the_flow_control_schema_and_upgrade_rebuilds_it(empty_engine):
    migrate(empty_engine)
    assert FLOW_TABLES <= tables_in(empty_engine)
    assert FLOW_COLUMNS <= job_queue_columns(empty_engine)
    assert KEY_TRIGGERS <= triggers_of(empty_engine)
    assert "(queue, priority DESC" in claim_index_definition(empty_engine)

    downgrade(empty_engine, "0004")

    assert tables_in(empty_engine) & FLOW_TABLES == set()
    assert job_queue_columns(empty_engine) & FLOW_COLUMNS == set()
    assert triggers_of(empty_engine) & KEY_TRIGGERS == set()
    assert functions_named(empty_engine, KEY_TRIGGER_FUNCTION) == []
    assert functions_named(empty_engine, KEY_AHEAD_FUNCTION) == []
    # The claim index of 0004 is back: led by the status, every PENDING row in it.
    assert "(status, priority DESC" in claim_index_definition(empty_engine)
    assert claim_index_definition(empty_engine).endswith("WHERE (status = 'PENDING'::text)")
    assert current_revision(empty_engine) == "0004"

    migrate(empty_engine)

    assert FLOW_TABLES <= tables_in(empty_engine)
    assert KEY_TRIGGERS <= triggers_of(empty_engine)
    assert functions_named(empty_engine, KEY_TRIGGER_FUNCTION) == ["public"]
    assert functions_named(empty_engine, KEY_AHEAD_FUNCTION) == ["public"]
    assert schema_diff(empty_engine) == []


def test_0005_puts_jobs_enqueued_before_it_in_the_default_queue_and_they_are_claimable(empty_engine):
    migrate(empty_engine, "0004")
    insert_jobs_as_0004_would(empty_engine, ["PENDING", "PENDING", "SUCCEEDED"])

    migrate(empty_engine)

    with empty_engine.connect() as connection:
        jobs = connection.execute(sqlalchemy.text(
            "SELECT status, queue, execution_resource_key, blocked_by_key FROM job_queue ORDER BY payload->>'n'")).all()
        definition_queue = connection.execute(sqlalchemy.text("SELECT queue FROM job_definitions")).scalar_one()
        queues = connection.execute(sqlalchemy.text("SELECT name, paused, key_limit FROM job_queues")).all()
    assert [tuple(job) for job in jobs] == [
        ("PENDING", "default", None, False), ("PENDING", "default", None, False), ("SUCCEEDED", "default", None, False)]
    assert definition_queue == "default"
    assert [tuple(queue) for queue in queues] == [("default", False, 1)]
    claimed = claim_jobs(empty_engine, worker_id="w", lease_ttl_seconds=30, limit=5)
    assert sorted(job.payload["n"] for job in claimed) == [0, 1]
    assert {job.queue for job in claimed} == {"default"}


def test_0005_round_trip_keeps_every_job_and_drops_queues_and_keys(empty_engine):
    migrate(empty_engine)
    sync_job_definitions(empty_engine, [JobDefinition("kept", queue="mail")])
    runledger_sync.configure_queue(empty_engine, "mail", global_limit=2, rate_limit=runledger_sync.RateLimit(5))
    runledger_sync.pause_queue(empty_engine, "mail")
    head = enqueue(empty_engine, "kept", {"n": 0}, concurrency_key="customer:1")
    held_back = enqueue(empty_engine, "kept", {"n": 1}, concurrency_key="customer:1")
    plain = enqueue(empty_engine, "kept", {"n": 2}, queue="default")
    with empty_engine.connect() as connection:
        assert connection.execute(sqlalchemy.text(
            "SELECT blocked_by_key FROM job_queue WHERE id = :id"), {"id": held_back.id}).scalar_one() is True

    # Down: every job is kept, now plain PENDING jobs that 0004's claim takes, the
    # held-back one too; the queue settings, assignments and keys are dropped.
    downgrade(empty_engine, "0004")

    with empty_engine.connect() as connection:
        kept = connection.execute(sqlalchemy.text("SELECT id, status, payload FROM job_queue ORDER BY payload->>'n'")).all()
    assert [tuple(row) for row in kept] == [
        (head.id, "PENDING", {"n": 0}), (held_back.id, "PENDING", {"n": 1}), (plain.id, "PENDING", {"n": 2})]

    # Up again: the jobs are back in the default queue, without keys, none held back, none paused.
    migrate(empty_engine)

    jobs = [runledger_sync.get_job(empty_engine, job.id) for job in (head, held_back, plain)]
    assert [(job.queue, job.concurrency_key, job.status.value) for job in jobs] == [("default", None, "PENDING")] * 3
    assert [queue.name for queue in runledger_sync.list_queues(empty_engine)] == ["default"]
    assert claim_jobs(empty_engine, worker_id="w", lease_ttl_seconds=30, limit=5) != []
    with empty_engine.connect() as connection:
        assert connection.execute(sqlalchemy.text("SELECT count(*) FROM job_queue WHERE status = 'LEASED'")).scalar() == 3
        assert connection.execute(sqlalchemy.text("SELECT queue FROM job_definitions")).scalar_one() == "default"


# -- a schema of its own -------------------------------------------------------------


def test_tables_can_live_in_a_non_public_schema(empty_database):
    admin = create_engine(empty_database)
    with admin.begin() as connection:
        connection.exec_driver_sql('CREATE SCHEMA "rl_custom"')
    engine = create_engine(empty_database, schema="rl_custom")
    try:
        migrate(engine)
        check_schema(engine)
        sync_job_definitions(engine, [JobDefinition("custom.job")])
        job = enqueue(engine, "custom.job", {"where": "rl_custom"})

        assert QUEUE_TABLES <= tables_in(admin, "rl_custom")
        assert VERSION_TABLE in tables_in(admin, "rl_custom")
        assert tables_in(admin, "public") == set()
        assert functions_named(admin, TRIGGER_FUNCTION) == ["rl_custom"]
        with admin.connect() as connection:
            rows = connection.execute(sqlalchemy.text("SELECT id, payload FROM rl_custom.job_queue")).all()
        assert [(row.id, row.payload) for row in rows] == [(job.id, {"where": "rl_custom"})]
        assert functions_named(admin, KEY_TRIGGER_FUNCTION) == functions_named(admin, KEY_AHEAD_FUNCTION) == ["rl_custom"]
        keys_take_turns(engine)
        # The queue settings are written where the tables are too.
        runledger_sync.configure_queue(engine, "default", key_limit=2)
        runledger_sync.pause_queue(engine, "default")
        assert runledger_sync.get_queue(engine, "default").paused
        # The default-schema engine sees no runledger schema at all.
        assert current_revision(admin) is None
    finally:
        engine.dispose()
        admin.dispose()


def keys_take_turns(engine: Engine, job_type: str = "keyed.turns") -> None:
    """The key trigger works where the tables are: the second job of a key waits for the first to end."""
    sync_job_definitions(engine, [JobDefinition(job_type)])
    first = enqueue(engine, job_type, {"turn": 1}, concurrency_key="k")
    second = enqueue(engine, job_type, {"turn": 2}, concurrency_key="k")
    [claimed] = claim_jobs(engine, worker_id="w", lease_ttl_seconds=30, limit=5, job_types=[job_type])
    assert claimed.id == first.id
    complete_job_success(engine, job_id=claimed.id, run_number=claimed.run_number, attempt=claimed.attempt, worker_id="w")
    assert [job.id for job in claim_jobs(engine, worker_id="w", lease_ttl_seconds=30, limit=5, job_types=[job_type])] == [
        second.id]


# -- privileges ------------------------------------------------------------------------


@pytest.fixture
def unprivileged_url(empty_database: str) -> Iterator[str]:
    """A URL for a new LOGIN role that may connect but may not CREATE in the database."""
    role = f"rl_nocreate_{uuid.uuid4().hex[:10]}"
    password = "rl-test-password"
    admin = create_engine(empty_database, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        # PostgreSQL < 15 lets PUBLIC create in schema public; take that away here.
        connection.exec_driver_sql("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    url = make_url(empty_database).set(username=role, password=password).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(
                f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"
            )
            connection.exec_driver_sql(f"DROP ROLE IF EXISTS {role}")
        admin.dispose()


def test_migrate_without_create_privilege_raises_migration_failed(unprivileged_url):
    engine = create_engine(unprivileged_url)
    try:
        with pytest.raises(MigrationFailed) as caught:
            migrate(engine)
        assert caught.value.code == "db.migration_failed"
        assert "permission denied" in caught.value.message
        assert "rl-test-password" not in caught.value.message
        assert current_revision(engine) is None
    finally:
        engine.dispose()


# -- unreachable server ------------------------------------------------------------------


def unreachable_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"postgresql://nobody@127.0.0.1:{port}/nothing?connect_timeout=3"


def test_check_schema_on_an_unreachable_server_raises_connection_failed():
    engine = create_engine(unreachable_url())
    try:
        with pytest.raises(ConnectionFailed) as caught:
            check_schema(engine)
        assert caught.value.code == "db.connection_failed"
    finally:
        engine.dispose()


def test_migrate_on_an_unreachable_server_raises_a_coded_error():
    engine = create_engine(unreachable_url())
    try:
        with pytest.raises((MigrationFailed, ConnectionFailed)):
            migrate(engine)
    finally:
        engine.dispose()


# -- the console script on a real database -------------------------------------------------


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_check_schema_fails_on_an_empty_database(capsys, empty_database):
    code, out, err = run_cli(capsys, "--database-url", empty_database, "check-schema")

    assert code == 1
    assert out == ""
    lines = err.splitlines()
    assert lines[0].startswith("error: db.schema_mismatch: the database has no runledger schema")
    assert lines[1].startswith("hint: ") and "migrate" in lines[1]
    assert len(lines) == 2


def test_cli_migrate_then_check_schema(capsys, empty_database):
    head = head_revision()

    assert run_cli(capsys, "--database-url", empty_database, "migrate") == (
        0, f"schema at {head} (migrated from an empty database)\n", ""
    )
    assert run_cli(capsys, "--database-url", empty_database, "migrate") == (
        0, f"schema at {head} (already up to date)\n", ""
    )
    assert run_cli(capsys, "check-schema", "--database-url", empty_database) == (
        0, f"schema at {head} (up to date)\n", ""
    )
    engine = create_engine(empty_database)
    try:
        assert current_revision(engine) == head
    finally:
        engine.dispose()


def test_cli_check_schema_reports_a_database_ahead(capsys, empty_engine, empty_database):
    migrate(empty_engine)
    set_version(empty_engine, "9999_from_the_future")

    code, _, err = run_cli(capsys, "--database-url", empty_database, "check-schema")

    assert code == 1
    assert err.startswith("error: db.schema_mismatch: the database is at 9999_from_the_future")


def test_cli_uses_the_schema_option(capsys, empty_database, monkeypatch):
    admin = create_engine(empty_database)
    with admin.begin() as connection:
        connection.exec_driver_sql("CREATE SCHEMA cli_schema")
    try:
        monkeypatch.setenv("RUNLEDGER_DATABASE_URL", empty_database)
        assert run_cli(capsys, "migrate", "--schema", "cli_schema")[0] == 0
        assert run_cli(capsys, "--schema", "cli_schema", "check-schema")[0] == 0
        assert QUEUE_TABLES <= tables_in(admin, "cli_schema")
        assert tables_in(admin, "public") == set()
        # Without --schema the search path (public) is checked, and it is empty.
        assert run_cli(capsys, "check-schema")[0] == 1
    finally:
        admin.dispose()


def test_cli_migration_failure_is_one_line_with_the_password_masked(capsys, unprivileged_url):
    code, out, err = run_cli(capsys, "--database-url", unprivileged_url, "migrate")

    assert code == 1
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("error: db.migration_failed: ")
    assert "permission denied" in lines[0]
    assert lines[1].startswith("hint: ") and "CREATE" in lines[1]
    assert "rl-test-password" not in err
    assert "Traceback" not in err


# -- the offline script (migrate --sql) -----------------------------------------------------------------


def run_script(engine: Engine, script: str) -> None:
    """Run a migration script as psql would: as it is, its own BEGIN and COMMIT included."""
    raw = engine.raw_connection()
    try:
        raw.driver_connection.autocommit = True
        with raw.cursor() as cursor:
            cursor.execute(script)
    finally:
        raw.close()


def a_job_goes_through(engine: Engine) -> None:
    sync_job_definitions(engine, [JobDefinition(job_type="script.check")])
    job = enqueue(engine, "script.check", {"n": 1})
    assert runledger_sync.get_job(engine, job.id).status is runledger_sync.JobStatus.PENDING
    keys_take_turns(engine)


def test_migrate_sql_prints_a_script_that_builds_the_schema_migrate_builds(empty_engine, capsys, monkeypatch):
    for name in ("RUNLEDGER_DATABASE_URL", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)

    assert cli.main(["migrate", "--sql"]) == 0  # no database named: none is needed
    script = capsys.readouterr().out

    assert script.startswith("BEGIN;") and "CREATE TABLE job_queue" in script
    assert tables_in(empty_engine) == set()
    run_script(empty_engine, script)
    check_schema(empty_engine)
    assert current_revision(empty_engine) == head_revision()
    assert schema_diff(empty_engine) == []
    assert functions_named(empty_engine, TRIGGER_FUNCTION) == ["public"]
    assert triggers_of(empty_engine) == HEAD_TRIGGERS
    a_job_goes_through(empty_engine)
    migrate(empty_engine)  # nothing left to do
    assert current_revision(empty_engine) == head_revision()


def test_migration_sql_scripts_a_schema_of_its_own_and_a_range(empty_database, empty_engine):
    with empty_engine.begin() as connection:
        connection.exec_driver_sql("CREATE SCHEMA jobs")
    jobs = create_engine(empty_database, schema="jobs")
    try:
        migrate(jobs, "0003")
        script = runledger_sync.migration_sql("0003:head", schema="jobs")

        assert "-- Running upgrade 0003 -> 0004" in script and "-> 0001" not in script
        run_script(empty_engine, script)
        check_schema(jobs)
        a_job_goes_through(jobs)
        assert tables_in(empty_engine, "public") == set()
    finally:
        jobs.dispose()


def test_migrate_sql_refuses_app_and_an_unknown_revision(capsys):
    assert cli.main(["migrate", "--sql", "--app", "tests.cli_app:registry"]) == 2
    assert "error: config.invalid: --sql writes a script and touches no database" in capsys.readouterr().err
    with pytest.raises(MigrationFailed, match="Can't locate revision identified by 'nope'"):
        runledger_sync.migration_sql("nope")


def test_migrate_sql_takes_the_schema_as_every_command_does(capsys, monkeypatch):
    monkeypatch.setenv("RUNLEDGER_SCHEMA", "from_env")
    assert cli.main(["migrate", "--sql"]) == 0
    assert "SET LOCAL search_path TO from_env;" in capsys.readouterr().out
    assert cli.main(["migrate", "--sql", "--schema", "Given"]) == 0
    out = capsys.readouterr().out
    assert 'SET LOCAL search_path TO "Given";' in out and 'CREATE TABLE "Given".runledger_alembic_version' in out
