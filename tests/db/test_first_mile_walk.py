"""A new user's first walk through the documentation, as a test.

Each page's code blocks are taken verbatim, in the order the page gives them, and run the
way a reader runs them: saved as the files the page names, in an empty directory of the
page's own, with a Python of its own (a subprocess), against a database that nothing has
migrated. The only edit is the one a reader makes: their database's URL in place of
``postgresql://app@localhost/app``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import pytest

import runledger_sync as rl
from tests.db.test_docs import DOCS, PLACEHOLDER_URL, REPO, marked, page_blocks

STEP_SECONDS = 120


def python_blocks(page: str) -> str:
    """A page's unmarked python blocks, in order, as one script."""
    return "".join(block.code + "\n" for block in page_blocks(DOCS / page) if block.kind == "python" and not block.marker)


def env_for(url: str, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("RUNLEDGER_") and key != "DATABASE_URL"}
    return {**env, "PYTHONPATH": str(REPO), "RUNLEDGER_DATABASE_URL": url, **extra}


def run(argv: list[str], cwd: Path, env: dict[str, str], stdin: Optional[str] = None) -> str:
    result = subprocess.run(argv, cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=STEP_SECONDS)
    assert result.returncode == 0, f"{argv} exited {result.returncode}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stdout


def save(path: Path, code: str, url: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(code.replace(PLACEHOLDER_URL, url), encoding="utf-8")
    return path


def run_until(argv: list[str], cwd: Path, env: dict[str, str], done: Callable[[], bool]) -> str:
    """Start a long-running command (a worker), wait until ``done()``, then Ctrl-C it: it must drain and exit 0."""
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + STEP_SECONDS
        while not done():
            assert process.poll() is None, process.communicate()[0][-3000:]
            assert time.monotonic() < deadline, f"{argv} did not get there within {STEP_SECONDS} s"
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=STEP_SECONDS)[0]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, output[-3000:]
    return output


def succeeded(url: str, job_type: str, count: int) -> Callable[[], bool]:
    def check() -> bool:
        engine = rl.create_engine(url)
        try:
            return rl.count_jobs(engine, job_type=job_type, status=rl.JobStatus.SUCCEEDED) >= count
        finally:
            engine.dispose()

    return check


CLI = [sys.executable, "-m", "runledger_sync.cli"]


@pytest.mark.timeout(600)
def test_getting_started_walks_from_no_database_to_a_finished_job(tmp_path):
    # No PostgreSQL at hand: the page's devdb.py starts one, and prints the line to paste.
    devdb = save(tmp_path / "devdb.py", marked("dev-server", "python"), "")
    server = subprocess.Popen([sys.executable, str(devdb)], cwd=tmp_path, env=env_for(""),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        export = server.stdout.readline().strip()
        assert export.startswith("export RUNLEDGER_DATABASE_URL="), export + server.stderr.read()
        url = export.split("=", 1)[1].strip("'")
        env = env_for(url)

        save(tmp_path / "myapp" / "jobs.py", marked("jobs-module", "python"), url)
        deploy = save(tmp_path / "deploy_and_enqueue.py",
                      marked("deploy", "python") + "\n" + marked("enqueue", "python"), url)
        run([sys.executable, str(deploy)], tmp_path, env)

        worker = save(tmp_path / "worker.py", marked("deploy", "python") + "\n" + marked("run-worker", "python"), url)
        run_until([sys.executable, str(worker)], tmp_path, env, succeeded(url, "email.send", 2))

        listed = run([*CLI, "jobs", "list", "--type", "email.send"], tmp_path, env)
        assert listed.count("SUCCEEDED") == 2, listed
        run([*CLI, "stats"], tmp_path, env)
    finally:
        if server.poll() is None:
            server.communicate("\n", timeout=STEP_SECONDS)  # Enter stops the server
    assert server.returncode == 0


@pytest.mark.timeout(600)
def test_the_flask_guide_migrates_signs_up_and_runs_the_welcome_job(tmp_path, empty_database):
    url, env = empty_database, env_for(empty_database)
    # The page's two files, as examples/flask_app/ holds them (a package: the app imports flask_app.jobs).
    save(tmp_path / "flask_app" / "__init__.py", "", url)
    save(tmp_path / "flask_app" / "jobs.py", marked("flask-jobs", "python"), url)
    save(tmp_path / "flask_app" / "app.py", marked("flask-app", "python"), url)
    flask = [sys.executable, "-m", "flask", "--app", "flask_app/app.py"]

    run([*flask, "runledger", "migrate"], tmp_path, env)
    # What the page's curl does, through Flask's test client instead of a listening server.
    signup = ("from flask_app.app import app\n"
              "response = app.test_client().post('/signup', data={'email': 'ada@example.com'})\n"
              "assert response.status_code == 201, response.get_data(as_text=True)\n")
    run([sys.executable, "-c", signup], tmp_path, env)
    run_until([*flask, "runledger", "worker"], tmp_path, env, succeeded(url, "email.welcome", 1))

    listed = run([*CLI, "jobs", "list"], tmp_path, env)
    assert "email.welcome" in listed and "SUCCEEDED" in listed, listed


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", ["flow-control.md", "testing.md"])
def test_the_page_runs_as_one_script_on_a_database_nothing_has_migrated(page, tmp_path, empty_database):
    script = save(tmp_path / "walk.py", python_blocks(page), empty_database)
    run([sys.executable, str(script)], tmp_path, env_for(empty_database))


@pytest.mark.timeout(600)
def test_the_testing_guides_suite_passes_with_the_plugin(tmp_path, pg_server):
    save(tmp_path / "test_jobs.py", marked("testing-pytest-suite", "python"), "")
    env = env_for("")
    env.pop("RUNLEDGER_DATABASE_URL")
    # The page's export names a server the plugin creates its databases on: the suite's own.
    env["RUNLEDGER_TEST_DATABASE_URL"] = pg_server.url()
    output = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                  "runledger_sync.testing.pytest_plugin", "test_jobs.py"], tmp_path, env)
    assert "2 passed" in output, output
