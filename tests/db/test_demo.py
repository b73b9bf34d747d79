"""The demo (``runledger-sync demo``) runs its few hundred jobs to the outcomes it promises."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys

import pytest

from runledger_sync import cli, demo
from runledger_sync.db.engine import create_engine
from runledger_sync.logging import ROOT_LOGGER_NAME
from tests.support import rows, scalar

EXPECTED_JOBS = demo.QUICK_JOBS + demo.SLOW_JOBS + 3


@pytest.mark.timeout(120)
def test_demo_settles_every_job_as_promised_and_prints_progress_summary_and_commands(engine, fresh_database):
    out = io.StringIO()
    assert demo.run_demo(fresh_database, out=out) == 0
    text = out.getvalue()

    outcomes = {(job_type, status, attempt): count for job_type, status, attempt, count in rows(
        engine, "SELECT job_type, status, attempt, count(*) FROM job_queue GROUP BY 1, 2, 3")}
    assert outcomes == {
        ("demo.greet", "SUCCEEDED", 1): demo.QUICK_JOBS,
        ("demo.resize", "SUCCEEDED", 1): demo.SLOW_JOBS,
        ("demo.flaky", "SUCCEEDED", 2): 1,
        ("demo.broken", "DEAD_LETTERED", 1): 1,
        ("demo.stuck", "DEAD_LETTERED", 2): 1,
    }
    assert sum(outcomes.values()) == EXPECTED_JOBS >= 200
    dead_codes = sorted(code for (code,) in rows(engine, "SELECT error_code FROM job_dead_letters"))
    assert dead_codes == ["demo.bad_input", "job.timeout_exceeded"]

    progress = [line for line in text.splitlines() if line.startswith("[")]
    assert progress[-1].endswith(f"{EXPECTED_JOBS}/{EXPECTED_JOBS}  done {EXPECTED_JOBS - 2}  retrying 0  dead 2")
    assert "demo.stuck   DEAD_LETTERED         2     1  job.timeout_exceeded" in text
    assert "2 dead letters:" in text
    stuck = scalar(engine, "SELECT job_id FROM job_dead_letters WHERE job_type = 'demo.stuck'")
    assert f"jobs show {stuck}" in text
    assert text.rstrip().endswith("demo finished as expected")


def test_demo_inspection_commands_it_prints_work(fresh_database, capsys):
    out = io.StringIO()
    assert demo.run_demo(fresh_database, out=out) == 0
    commands = [line.split("'", 2)[2].split() for line in out.getvalue().splitlines()
                if line.startswith("  runledger-sync --database-url")]
    assert [argv[:2] for argv in commands] == [["dead-letters", "list"], ["jobs", "show"], ["dead-letters", "replay"]]
    capsys.readouterr()
    for argv in commands:
        assert cli.main(["--database-url", fresh_database, *argv]) == 0
    printed = capsys.readouterr().out
    assert "demo.stuck" in printed and "1 dead-lettered job(s) would be requeued (dry run)" in printed


def _demo_env(short_tmp) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("RUNLEDGER_") and key != "DATABASE_URL"}
    env["TMPDIR"] = str(short_tmp)  # its data directory and log, away from any other demo
    return env


@pytest.mark.timeout(180)
def test_runledger_sync_demo_without_a_url_starts_its_own_embedded_server_and_removes_its_directory(short_tmp):
    result = subprocess.run([sys.executable, "-m", "runledger_sync.cli", "demo"], env=_demo_env(short_tmp),
                            capture_output=True, text=True, timeout=170)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "starting embedded PostgreSQL" in result.stdout
    assert result.stdout.rstrip().endswith("demo finished as expected")
    # Its directory (data and log) was its own, and is gone at the end.
    assert f"go to {short_tmp}/runledger-demo-" in result.stdout
    assert list(short_tmp.glob("runledger-demo-*")) == []


@pytest.mark.timeout(180)
def test_demo_ignores_an_inherited_database_url_and_leaves_that_database_untouched(pg_server, short_tmp):
    name = f"rl_demo_untouched_{os.getpid()}"
    url = pg_server.create_database(name, drop_existing=True)
    try:
        env = {**_demo_env(short_tmp), "RUNLEDGER_DATABASE_URL": url}
        result = subprocess.run([sys.executable, "-m", "runledger_sync.cli", "demo"], env=env,
                                capture_output=True, text=True, timeout=170)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        assert result.stdout.splitlines()[0] == "ignoring RUNLEDGER_DATABASE_URL; pass --database-url to use it"
        assert "starting embedded PostgreSQL" in result.stdout
        engine = create_engine(url)
        try:
            assert scalar(engine, "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN "
                                  "('pg_catalog', 'information_schema')") == 0
        finally:
            engine.dispose()
    finally:
        pg_server.drop_database(name)


def test_demo_leaves_no_logging_handler_on_its_closed_log_file(fresh_database):
    before = list(logging.getLogger(ROOT_LOGGER_NAME).handlers)
    assert demo.run_demo(fresh_database, out=io.StringIO()) == 0
    assert logging.getLogger(ROOT_LOGGER_NAME).handlers == before
