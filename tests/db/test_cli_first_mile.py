"""The console script on a database nobody migrated yet, and ``migrate --app`` writing a registry's rows.

Each test runs ``cli.main([...])`` in-process on a database of its own and
checks what it printed and the rows the database holds afterwards.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest
import sqlalchemy

import runledger_sync as rl
from runledger_sync import cli
from runledger_sync.cli import HINTS

MODULE = "first_mile_jobs"
REGISTRY_SOURCE = '''
import runledger_sync as rl

registry = rl.JobRegistry()


@registry.job("mail.send", max_attempts=4, priority=50)
def send(ctx, payload):
    return None


@registry.job("report.build")
def build(ctx, payload):
    return None


registry.schedule("nightly-report", job_type="report.build", cron="0 3 * * *", payload={"kind": "nightly"}, timezone="UTC")
'''


@pytest.fixture
def console(capsys, empty_database):
    def invoke(*argv: str) -> tuple[int, str, str]:
        code = cli.main(["--database-url", empty_database, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return invoke


@pytest.fixture
def plain_engine(empty_database) -> Iterator[sqlalchemy.Engine]:
    engine = sqlalchemy.create_engine(empty_database, poolclass=sqlalchemy.pool.NullPool)
    yield engine
    engine.dispose()


@pytest.fixture
def app_dir(tmp_path, monkeypatch) -> Path:
    """A directory holding the app's registry module, as the current directory (where --app imports from)."""
    (tmp_path / f"{MODULE}.py").write_text(textwrap.dedent(REGISTRY_SOURCE), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop(MODULE, None)


def test_the_hint_for_a_schema_mismatch_names_the_migrate_command():
    assert "run `runledger-sync migrate`" in HINTS["db.schema_mismatch"]


@pytest.mark.parametrize("argv", [["jobs", "list"], ["stats"], ["enqueue", "mail.send", "{}"],
                                  ["jobs", "show", "00000000-0000-7000-8000-000000000000"],
                                  ["dead-letters", "list"], ["schedules", "list"]],
                         ids=lambda argv: " ".join(argv))
def test_a_command_on_a_database_never_migrated_says_to_migrate(console, plain_engine, argv):
    code, out, err = console(*argv)

    assert code == 1, out + err
    error, hint = err.splitlines()
    assert error.startswith("error: db.schema_mismatch: the job tables are missing"), err
    assert "runledger-sync migrate" in error
    assert hint == f"hint: {HINTS['db.schema_mismatch']}"
    assert "Traceback" not in err and out == ""
    assert sqlalchemy.inspect(plain_engine).get_table_names() == []  # nothing was created on the way


def test_migrate_with_app_writes_the_registrys_definitions_and_schedules(console, plain_engine, app_dir):
    code, out, err = console("migrate", "--app", f"{MODULE}:registry")

    assert code == 0, err
    assert out == f"schema at {rl.head_revision()} (migrated from an empty database); " \
                  "2 job definition(s) and 1 schedule(s) written\n"
    with plain_engine.connect() as conn:
        definitions = conn.exec_driver_sql(
            "SELECT job_type, max_attempts, default_priority FROM job_definitions ORDER BY job_type").all()
        schedules = conn.exec_driver_sql(
            "SELECT name, job_type, cron_expr, timezone, payload_template::text FROM job_schedules").all()
    assert [tuple(row) for row in definitions] == [("mail.send", 4, 50), ("report.build", 8, 100)]
    assert [tuple(row) for row in schedules] == [
        ("nightly-report", "report.build", "0 3 * * *", "UTC", '{"kind": "nightly"}')]

    # Run again: the schema is up to date and the rows are written once, not twice.
    code, out, err = console("migrate", "--app", f"{MODULE}:registry")
    assert code == 0, err
    assert out.startswith(f"schema at {rl.head_revision()} (already up to date); 2 job definition(s)")
    with plain_engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM job_schedules").scalar_one() == 1


def test_migrate_with_a_bad_app_refuses_before_touching_the_database(console, plain_engine, app_dir):
    code, out, err = console("migrate", "--app", f"{MODULE}:nothing_here")

    assert code == 2
    error, hint = err.splitlines()
    assert error.startswith("error: config.invalid: --app ") and "nothing_here" in error
    assert hint.startswith("hint: --app takes module:attribute")
    assert sqlalchemy.inspect(plain_engine).get_table_names() == []


def test_migrate_without_app_writes_no_definitions(console, plain_engine):
    code, out, err = console("migrate")

    assert code == 0, err
    assert out == f"schema at {rl.head_revision()} (migrated from an empty database)\n"
    with plain_engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM job_definitions").scalar_one() == 0


def test_enqueue_before_the_definitions_exist_points_at_migrate_app_which_fixes_it(console, app_dir):
    assert console("migrate")[0] == 0

    code, out, err = console("enqueue", "mail.send", "{}")

    assert code == 1
    error, hint = err.splitlines()
    assert error.startswith("error: job.definition_not_found_or_disabled: ")
    assert "runledger-sync migrate --app module:registry" in hint
    assert console("migrate", "--app", f"{MODULE}:registry")[0] == 0
    code, out, err = console("enqueue", "mail.send", "{}")
    assert code == 0, err
    assert len(out.strip()) == 36  # the new job's id
