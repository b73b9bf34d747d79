"""The FastAPI example (examples/fastapi_app/, docs/guides/asyncio.md), driven through FastAPI's test client.

Its signup endpoint enqueues with ``aio.enqueue`` in the transaction of its own
INSERT, against a real database: the user and the job commit together or not at
all; the (synchronous) worker runs the job, and the status endpoint's
``?wait=`` returns once the job has ended.
"""

from __future__ import annotations

import importlib
import shlex
import signal
import subprocess
import sys
import threading
from types import ModuleType
from typing import Any, Iterator

import pytest

import runledger_sync as rl
from tests.db.test_docs import DOCS, REPO, marked, page_blocks, shell_lines
from tests.db.test_examples_web import example_env, refuse_at_commit
from tests.handlers import fast_config
from tests.support import rows, run_worker_until, scalar, wait_until

pytest.importorskip("fastapi")
pytest.importorskip("httpx2")  # what starlette's test client runs on

from fastapi.testclient import TestClient  # noqa: E402 - after the skip

EXAMPLES = REPO / "examples"
MODULES = ("fastapi_app.app", "fastapi_app.jobs", "fastapi_app")
#: docs-test marker name -> the example file its python block is an excerpt of.
SNIPPET_FILES = {"fastapi-jobs": "examples/fastapi_app/jobs.py", "fastapi-app": "examples/fastapi_app/app.py"}


def load(database_url: str, monkeypatch: Any) -> ModuleType:
    """Import examples/fastapi_app/app.py as uvicorn does from examples/, with RUNLEDGER_DATABASE_URL set."""
    monkeypatch.setenv("RUNLEDGER_DATABASE_URL", database_url)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    for name in MODULES:
        sys.modules.pop(name, None)
    return importlib.import_module("fastapi_app.app")


def unload() -> None:
    jobs = sys.modules.get("fastapi_app.jobs")
    if jobs is not None:
        jobs.engine().dispose()
    for name in MODULES:
        sys.modules.pop(name, None)


@pytest.fixture
def example(fresh_database, monkeypatch) -> Iterator[ModuleType]:
    """The example app on a migrated database, its job definitions written."""
    module = load(fresh_database, monkeypatch)
    jobs = importlib.import_module("fastapi_app.jobs")
    jobs.registry.sync_definitions(jobs.engine())   # what `runledger-sync migrate --app ...` writes
    try:
        yield module
    finally:
        unload()


def guide_command(words: str) -> list[str]:
    """The one line of the guide's fastapi-shell block containing ``words``, as argv run by this interpreter."""
    lines = [line for line in shell_lines(marked("fastapi-shell", "sh")) if words in line]
    assert len(lines) == 1, lines
    program, *arguments = shlex.split(lines[0])
    assert program == "runledger-sync"
    return [sys.executable, "-m", "runledger_sync.cli", *arguments]


def test_the_guides_commands_migrate_and_run_the_worker_from_examples(empty_database, monkeypatch):
    assert "cd examples" in shell_lines(marked("fastapi-shell", "sh"))  # the commands below run there
    migrated = subprocess.run(guide_command("runledger-sync migrate"), cwd=EXAMPLES, env=example_env(empty_database),
                              capture_output=True, text=True, timeout=60)
    assert migrated.returncode == 0, migrated.stderr
    assert "1 job definition(s) and 0 schedule(s) written" in migrated.stdout
    engine = rl.create_engine(empty_database)
    try:
        run_the_signup_through_the_worker(engine, empty_database, monkeypatch)
    finally:
        engine.dispose()


def run_the_signup_through_the_worker(engine: Any, database_url: str, monkeypatch: Any) -> None:
    try:
        with TestClient(load(database_url, monkeypatch).app) as client:
            response = client.post("/signup", json={"email": "ada@example.com"})
            assert response.status_code == 201, response.text
    finally:
        unload()
    job_id = response.json()["job_id"]
    worker = subprocess.Popen(guide_command("runledger-sync worker"), cwd=EXAMPLES, env=example_env(database_url),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: rl.get_job(engine, job_id).status is rl.JobStatus.SUCCEEDED or worker.poll() is not None,
                   timeout=30)
        assert worker.poll() is None, worker.communicate()
        worker.send_signal(signal.SIGINT)
        _out, err = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, err
    assert rl.get_job(engine, job_id).output == {"welcomed": "ada@example.com"}
    assert scalar(engine, "SELECT welcomed_at IS NOT NULL FROM users") is True


def test_every_python_block_of_the_guide_that_names_the_example_is_an_excerpt_of_it():
    snippets = {block.marker: block.code for block in page_blocks(DOCS / "guides/asyncio.md")
                if block.kind == "python" and block.marker and block.marker.startswith("fastapi-")}
    assert set(snippets) == set(SNIPPET_FILES)
    for name, code in snippets.items():
        assert code in (REPO / SNIPPET_FILES[name]).read_text(encoding="utf-8"), name


def test_signup_commits_user_and_job_together_then_the_worker_runs_it(example, engine):
    registry = sys.modules["fastapi_app.jobs"].registry
    with TestClient(example.app) as client:  # runs the app's lifespan: its table, then disposing its engine
        response = client.post("/signup", json={"email": "ada@example.com"})
        assert response.status_code == 201, response.text
        body = response.json()
        [user] = rows(engine, "SELECT id, email, welcomed_at FROM users")
        assert (user.id, user.email, user.welcomed_at) == (body["user_id"], "ada@example.com", None)
        job = rl.get_job(engine, body["job_id"])
        assert (job.job_type, job.status, job.payload) == ("email.welcome", rl.JobStatus.PENDING,
                                                           {"email": "ada@example.com"})
        assert client.get(f"/jobs/{job.id}").json() == {"status": "PENDING", "output": None}

        # The same e-mail again: the INSERT fails, the transaction rolls back, no second job.
        again = client.post("/signup", json={"email": "ada@example.com"})
        assert again.status_code == 409
        assert again.json() == {"detail": "email already registered"}
        assert scalar(engine, "SELECT count(*) FROM users") == 1
        assert rl.count_jobs(engine) == 1

        # A request waits for the end while the worker runs the job.
        waited: list[Any] = []
        waiter = threading.Thread(target=lambda: waited.append(client.get(f"/jobs/{job.id}", params={"wait": 30})))
        waiter.start()
        run_worker_until(engine, registry, fast_config(), lambda: waited)
        waiter.join(10)
        assert waited[0].json() == {"status": "SUCCEEDED", "output": {"welcomed": "ada@example.com"}}
        assert client.get("/jobs/018f0000-0000-7000-8000-000000000000").status_code == 404
        assert client.get(f"/jobs/{job.id}", params={"wait": 3600}).status_code == 422
    assert scalar(engine, "SELECT welcomed_at IS NOT NULL FROM users WHERE email = 'ada@example.com'") is True


def test_a_request_whose_commit_fails_leaves_no_user_and_no_job(example, engine):
    with TestClient(example.app, raise_server_exceptions=False) as client:
        # One commit refused for the user's row, one for the job's: whichever of the two
        # an endpoint committed on its own would be left behind.
        refuse_at_commit(engine, "users", "NEW.email = 'refused-user@example.com'")
        refuse_at_commit(engine, "job_queue", "NEW.payload ->> 'email' = 'refused-job@example.com'")
        refused = [client.post("/signup", json={"email": f"refused-{row}@example.com"}).status_code
                   for row in ("user", "job")]
        accepted = client.post("/signup", json={"email": "grace@example.com"})

    assert refused == [500, 500]
    assert accepted.status_code == 201, accepted.text
    assert [row.email for row in rows(engine, "SELECT email FROM users")] == ["grace@example.com"]
    assert [job.payload for job in rl.list_jobs(engine)] == [{"email": "grace@example.com"}]
