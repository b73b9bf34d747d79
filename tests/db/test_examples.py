"""The examples run as a user would run them: examples/script.py and examples/alembic_host/."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

import runledger_sync as rl
from runledger_sync import cli
from runledger_sync.db.migrate import HOST_VERSION_TABLE_ENV, VERSION_TABLE
from tests.support import rows, scalar, wait_until

REPO = Path(__file__).resolve().parent.parent.parent
SCRIPT = REPO / "examples" / "script.py"
ALEMBIC_HOST_INI = REPO / "examples" / "alembic_host" / "alembic.ini"


def _script(database_url: str, *argv: str) -> subprocess.Popen:
    env = {key: value for key, value in os.environ.items() if not key.startswith("RUNLEDGER_")}
    env["RUNLEDGER_DATABASE_URL"] = database_url
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.Popen([sys.executable, str(SCRIPT), *argv], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen, timeout: float = 60) -> tuple[str, str]:
    try:
        return process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_script_runs_every_job_and_exits_0_when_idle(engine, fresh_database):
    process = _script(fresh_database, "--exit-when-idle", "--greetings", "3", "--slow-seconds", "0.2")
    out, err = _finish(process)

    assert process.returncode == 0, err
    statuses = rows(engine, "SELECT job_type, status FROM job_queue ORDER BY job_type")
    assert [tuple(row) for row in statuses] == [("example.greet", "SUCCEEDED")] * 3 + [("example.slow", "SUCCEEDED")]
    assert "queue is idle; stopping" in out
    assert "counts: SUCCEEDED=4" in out


def test_script_drains_the_running_job_on_sigint(engine, fresh_database):
    process = _script(fresh_database, "--greetings", "0", "--slow-seconds", "2")
    try:
        slow = wait_until(lambda: _leased_slow_job(engine) or process.poll() is not None, timeout=60)
        assert process.poll() is None, process.communicate()[1]
        process.send_signal(signal.SIGINT)
        out, err = _finish(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()

    assert process.returncode == 0, err
    job = rl.get_job(engine, slow)
    assert job.status is rl.JobStatus.SUCCEEDED
    assert job.output == {"slept_seconds": 2.0}
    assert "shutdown signal received; draining" in err
    assert "counts: SUCCEEDED=1" in out


def _leased_slow_job(engine):
    return scalar(engine, "SELECT id FROM job_queue WHERE job_type = 'example.slow' AND status = 'LEASED' "
                          "AND progress_done IS NOT NULL")


def _full_history(config: Config) -> ScriptDirectory:
    """The script directory as alembic.ini lists it: the app's versions and runledger's."""
    return ScriptDirectory.from_config(config)


def _applied_revisions(engine: sqlalchemy.Engine, script: ScriptDirectory) -> set[str]:
    with engine.connect() as conn:
        heads = MigrationContext.configure(conn).get_current_heads()
    return {revision.revision for revision in script.revision_map.iterate_revisions(heads, "base")}


def test_alembic_host_upgrades_both_histories_and_downgrades_them(empty_database):
    config = _host_config(empty_database)
    engine = sqlalchemy.create_engine(empty_database, poolclass=sqlalchemy.pool.NullPool)
    try:
        command.upgrade(config, "head")

        tables = set(sqlalchemy.inspect(engine).get_table_names())
        assert {"app_orders", "job_queue", "job_definitions", "job_events", "alembic_version"} <= tables
        # One version table tracks both histories; ours is not created on this path.
        assert VERSION_TABLE not in tables
        # One head: app_0001 builds on runledger's 0001, app_0002 merges its 0002,
        # app_0003 and app_0004 its 0003 and 0004, app_0005 its 0005 to 0008, app_0006
        # its 0009, app_0007 its 0010, app_0008 its 0011, app_0009 its 0012, app_0010 its
        # 0013, app_0011 its 0014 to 0017, so Alembic stores only app_0011.
        script = _full_history(config)
        assert script.get_heads() == ["app_0011"]
        with engine.connect() as conn:
            stored = {row[0] for row in conn.exec_driver_sql("SELECT version_num FROM alembic_version")}
        assert stored == {"app_0011"}
        assert _applied_revisions(engine, script) == {
            "app_0011", "app_0010", "app_0009", "app_0008", "app_0007", "app_0006", "app_0005", "app_0004", "app_0003", "app_0002",
            "app_0001", "0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008", "0009", "0010", "0011",
            "0012", "0013", "0014", "0015", "0016", "0017"}
        # The app's foreign key into the queue works.
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO job_definitions (job_type) VALUES ('app.ship')")
            job_id = conn.exec_driver_sql("INSERT INTO job_queue (id, job_type, max_attempts) "
                                          "VALUES (gen_random_uuid(), 'app.ship', 1) RETURNING id").scalar()
            conn.exec_driver_sql("INSERT INTO app_orders (reference, fulfilment_job_id) VALUES ('A-1', %(id)s)",
                                 {"id": job_id})

        command.downgrade(config, "base")

        tables = set(sqlalchemy.inspect(engine).get_table_names())
        assert not tables & {"app_orders", "job_queue", "job_definitions", "job_attempts", "job_events",
                             "job_dead_letters"}
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM alembic_version").scalar() == 0
    finally:
        engine.dispose()


def _host_config(database_url: str) -> Config:
    config = Config(str(ALEMBIC_HOST_INI))
    config.set_main_option("sqlalchemy.url", database_url)
    config.attributes["configure_logger"] = False  # keep the test process's logging as it is
    return config


def _stored(engine: sqlalchemy.Engine) -> set[str]:
    with engine.connect() as conn:
        return {row[0] for row in conn.exec_driver_sql("SELECT version_num FROM alembic_version")}


def test_check_schema_finds_our_revision_in_the_host_version_table(empty_database, monkeypatch, capsys):
    monkeypatch.delenv(HOST_VERSION_TABLE_ENV, raising=False)
    config = _host_config(empty_database)
    engine = rl.create_engine(empty_database)
    try:
        with pytest.raises(rl.SchemaMismatch) as before:
            rl.check_schema(engine)
        assert before.value.code == "db.schema_mismatch"
        assert before.value.details["current"] is None

        # Only our revision: the host table stores our own revision id (rule 3).
        command.upgrade(config, rl.head_revision())
        assert _stored(engine) == {rl.head_revision()}
        assert rl.current_revision(engine) == rl.head_revision()
        rl.check_schema(engine)

        # Both histories: only app_0011 is stored, ours is its ancestor (rule 4).
        command.upgrade(config, "head")
        assert _stored(engine) == {"app_0011"}
        assert rl.current_revision(engine) == rl.head_revision()
        assert rl.check_schema(engine) is None
        assert cli.main(["--database-url", empty_database, "check-schema"]) == 0
        assert f"schema at {rl.head_revision()} (up to date)" in capsys.readouterr().out

        # Another host table name, by argument or environment.
        assert rl.current_revision(engine, version_table="no_such_version_table") is None
        monkeypatch.setenv(HOST_VERSION_TABLE_ENV, "no_such_version_table")
        with pytest.raises(rl.SchemaMismatch):
            rl.check_schema(engine)
        assert rl.current_revision(engine, version_table="alembic_version") == rl.head_revision()
        monkeypatch.delenv(HOST_VERSION_TABLE_ENV)

        # Host revisions only and our tables differ from this version's schema: mismatch.
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP INDEX idx_job_queue_claim")
        assert rl.current_revision(engine) is None
        with pytest.raises(rl.SchemaMismatch) as drifted:
            rl.check_schema(engine)
        assert "app_0011" in drifted.value.message and "idx_job_queue_claim" in drifted.value.message
        assert "alembic upgrade head" in drifted.value.message
        assert VERSION_TABLE not in set(sqlalchemy.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_our_own_version_table_wins_over_the_host_table(empty_database):
    engine = rl.create_engine(empty_database)
    try:
        rl.migrate(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
            conn.exec_driver_sql("INSERT INTO alembic_version VALUES ('app_9999')")
        assert rl.current_revision(engine) == rl.head_revision()
        rl.check_schema(engine)
    finally:
        engine.dispose()


def test_host_version_table_in_a_named_schema(empty_database):
    # As a host would leave it with --schema: our tables and the host's version
    # table in schema "app", our own version table absent.
    plain = sqlalchemy.create_engine(empty_database, poolclass=sqlalchemy.pool.NullPool)
    engine = rl.create_engine(empty_database, schema="app")
    try:
        with plain.begin() as conn:
            conn.exec_driver_sql("CREATE SCHEMA app")
        rl.migrate(engine)
        with plain.begin() as conn:
            conn.exec_driver_sql(f"ALTER TABLE app.{VERSION_TABLE} RENAME TO alembic_version")
            conn.exec_driver_sql("UPDATE app.alembic_version SET version_num = 'app_0001'")

        assert rl.current_revision(engine) == rl.head_revision()
        rl.check_schema(engine)
        with plain.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE app.job_events ALTER COLUMN stage TYPE varchar(20)")
        with pytest.raises(rl.SchemaMismatch, match="stage"):
            rl.check_schema(engine)
    finally:
        engine.dispose()
        plain.dispose()
