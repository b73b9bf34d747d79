"""The Flask and Django guides (docs/guides/flask.md, django.md), run as a new user runs them.

- Every python block of those pages is an excerpt of examples/flask_app/ or
  examples/django_app/, so the guides cannot drift from code that is tested here.
- Their migrate and worker commands are taken from the guides' shell blocks (marked
  flask-shell and django-shell) and
  run as subprocesses from the repository root; the views are driven through
  Flask's and Django's test clients against a real database.
- Django's settings can be configured once per process, so the Django example
  runs entirely in subprocesses (manage.py commands and a test-client script).
"""

from __future__ import annotations

import importlib
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import runledger_sync as rl
from tests.db.test_docs import DOCS, REPO, marked, page_blocks, shell_lines
from tests.support import rows, scalar, wait_until

EXAMPLES = REPO / "examples"
DJANGO_DIR = EXAMPLES / "django_app"

#: docs-test marker name -> the example file its python block is an excerpt of.
SNIPPET_FILES = {
    "flask-jobs": "examples/flask_app/jobs.py",
    "flask-app": "examples/flask_app/app.py",
    "django-settings": "examples/django_app/project/settings.py",
    "django-jobs": "examples/django_app/shop/jobs.py",
    "django-views": "examples/django_app/shop/views.py",
}

#: Short intervals, given as a user would: RUNLEDGER_<FIELD> environment variables.
FAST_WORKER_ENV = {
    "RUNLEDGER_POLL_INTERVAL_MS": "20",
    "RUNLEDGER_LEASE_TTL_SECONDS": "5",
    "RUNLEDGER_HEARTBEAT_INTERVAL_SECONDS": "0.5",
    "RUNLEDGER_REAPER_INTERVAL_SECONDS": "0.2",
}

#: A deferred constraint trigger: an inserted row of {table} for which {condition} holds
#: makes the COMMIT fail, after every statement of the transaction has run.
REFUSE_AT_COMMIT = """
CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF {condition} THEN
        RAISE EXCEPTION 'refused at commit';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER {name} AFTER INSERT ON {table}
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {name}();
"""


def refuse_at_commit(engine: Any, table: str, condition: str) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(REFUSE_AT_COMMIT.format(name=f"refuse_{table}", table=table, condition=condition))


# -- the guides ------------------------------------------------------------------------------

GUIDES = {"Flask": "guides/flask.md", "Django": "guides/django.md"}
SHELL_BLOCKS = {"Flask": "flask-shell", "Django": "django-shell"}


def marked_snippets(title: str) -> dict[str, str]:
    """The python blocks of a guide, by marker (a block without one maps from None)."""
    blocks = page_blocks(DOCS / GUIDES[title])
    return {block.marker: block.code for block in blocks if block.kind == "python"}


def shell_command(title: str, words: str) -> list[str]:
    """The one command line of the guide's marked shell block that contains ``words``, as argv."""
    lines = [line for line in shell_lines(marked(SHELL_BLOCKS[title], "sh")) if words in line]
    assert len(lines) == 1, f"expected one {title} guide command with {words!r}, got {lines}"
    return shlex.split(lines[0])


@pytest.mark.parametrize("title", ["Flask", "Django"])
def test_every_python_block_of_the_guide_is_an_excerpt_of_its_example(title):
    snippets = marked_snippets(title)
    assert None not in snippets, "a python block of this guide has no docs-test marker"
    assert snippets, "the guide shows no code"
    for name, code in snippets.items():
        assert name in SNIPPET_FILES, f"marker {name!r} names no example file in SNIPPET_FILES"
        source = (REPO / SNIPPET_FILES[name]).read_text(encoding="utf-8")
        assert code in source, f"the guide's block {name!r} is not verbatim in {SNIPPET_FILES[name]}"
    assert {name.split("-")[0] for name in snippets} == {title.lower()}


def test_every_snippet_file_is_shown_in_a_guide():
    shown = marked_snippets("Flask") | marked_snippets("Django")
    assert set(shown) == set(SNIPPET_FILES)


# -- running the examples ----------------------------------------------------------------------


def example_env(database_url: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("RUNLEDGER_", "DJANGO_", "FLASK_")) and key != "DATABASE_URL"}
    env.update(FAST_WORKER_ENV, RUNLEDGER_DATABASE_URL=database_url)
    return env


def executable(argv: list[str]) -> list[str]:
    """The guide's argv with ``flask`` / ``python`` run by this interpreter."""
    program, *arguments = argv
    if program == "flask":
        return [sys.executable, "-m", "flask", *arguments]
    assert program == "python", argv
    return [sys.executable, *arguments]


def run(argv: list[str], database_url: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, cwd=cwd, env=example_env(database_url), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{argv} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def run_worker_until(argv: list[str], database_url: str, engine: Any, job_id: Any) -> rl.JobRecord:
    """Start the guide's worker command, wait for the job to succeed, then stop it as Ctrl-C does."""
    err = worker_output_until(argv, database_url, engine, job_id)
    assert "jobs processed" in err  # the summary the worker logs as it stops
    return rl.get_job(engine, job_id)


def worker_output_until(argv: list[str], database_url: str, engine: Any, job_id: Any) -> str:
    """Run a worker command until the job succeeds, stop it as Ctrl-C does, and return what it logged."""
    process = subprocess.Popen(argv, cwd=REPO, env=example_env(database_url),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: rl.get_job(engine, job_id).status is rl.JobStatus.SUCCEEDED or process.poll() is not None,
                   timeout=30)
        assert process.poll() is None, f"the worker exited {process.returncode}: {process.communicate()}"
        process.send_signal(signal.SIGINT)
        _out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    return err


@pytest.fixture
def queue_engine() -> Iterator[Any]:
    engines: list[Any] = []

    def make(url: str) -> Any:
        engines.append(rl.create_engine(url))
        return engines[-1]

    yield make
    for engine in engines:
        engine.dispose()


# -- Flask ---------------------------------------------------------------------------------------


@pytest.fixture
def load_flask_example(monkeypatch) -> Iterator[Any]:
    """Import examples/flask_app/app.py as ``flask --app`` does, with RUNLEDGER_DATABASE_URL set."""
    pytest.importorskip("flask")
    loaded: list[ModuleType] = []

    def load(database_url: str) -> ModuleType:
        monkeypatch.setenv("RUNLEDGER_DATABASE_URL", database_url)
        monkeypatch.syspath_prepend(str(EXAMPLES))
        for name in ("flask_app.app", "flask_app.jobs", "flask_app"):
            sys.modules.pop(name, None)
        loaded.append(importlib.import_module("flask_app.app"))
        return loaded[-1]

    yield load
    for module in loaded:
        with module.app.app_context():
            module.runledger.engine.dispose()
    for name in ("flask_app.app", "flask_app.jobs", "flask_app"):
        sys.modules.pop(name, None)


def test_flask_example_signup_commits_user_and_job_then_the_worker_runs_it(empty_database, load_flask_example,
                                                                           queue_engine):
    migrated = run(executable(shell_command("Flask", "runledger migrate")), empty_database)
    assert "migrated from an empty database" in migrated.stdout
    assert "1 job definition(s) written" in migrated.stdout
    engine = queue_engine(empty_database)
    assert rl.current_revision(engine) == rl.head_revision()
    assert rows(engine, "SELECT email FROM users") == []

    example = load_flask_example(empty_database)
    client = example.app.test_client()
    response = client.post("/signup", data={"email": "ada@example.com"})

    assert response.status_code == 201, response.get_data(as_text=True)
    body = response.get_json()
    [user] = rows(engine, "SELECT id, email, welcomed_at FROM users")
    assert (user.id, user.email, user.welcomed_at) == (body["user_id"], "ada@example.com", None)
    job = rl.get_job(engine, body["job_id"])
    assert (job.job_type, job.status, job.payload) == ("email.welcome", rl.JobStatus.PENDING, {"email": "ada@example.com"})

    # The same e-mail again: the INSERT fails, the transaction rolls back, no second job.
    again = client.post("/signup", data={"email": "ada@example.com"})
    assert again.status_code == 409
    assert again.get_json() == {"error": "email already registered"}
    assert scalar(engine, "SELECT count(*) FROM users") == 1
    assert rl.count_jobs(engine) == 1

    done = run_worker_until(executable(shell_command("Flask", "runledger worker")), empty_database, engine, job.id)
    assert done.output == {"welcomed": "ada@example.com"}
    assert scalar(engine, "SELECT welcomed_at IS NOT NULL FROM users WHERE email = 'ada@example.com'") is True


def test_flask_worker_with_the_text_log_format_prints_one_line_per_finished_job(empty_database, load_flask_example,
                                                                                 queue_engine):
    run(executable(shell_command("Flask", "runledger migrate")), empty_database)
    load_flask_example(empty_database)  # creates the users table, as at startup
    engine = queue_engine(empty_database)
    job = rl.enqueue(engine, "email.welcome", {"email": "secret-ada@example.com"})
    argv = executable(shell_command("Flask", "runledger worker")) + ["--log-format", "text"]
    err = worker_output_until(argv, empty_database, engine, job.id)
    assert f"INFO runledger_sync.jobs job email.welcome {job.id} succeeded (attempt 1, " in err
    assert not [line for line in err.splitlines() if line.startswith("{")]  # no JSON line
    assert "secret-ada" not in err  # never the payload


def test_flask_example_request_whose_commit_fails_leaves_no_user_and_no_job(fresh_database, load_flask_example,
                                                                             queue_engine):
    example = load_flask_example(fresh_database)  # creates the users table, as at startup
    example.runledger.sync_definitions(example.app)  # what `flask runledger migrate` writes
    engine = queue_engine(fresh_database)
    # One commit refused for the user's row, one for the job's: whichever of the two a
    # view committed on its own would be left behind.
    refuse_at_commit(engine, "users", "NEW.email = 'refused-user@example.com'")
    refuse_at_commit(engine, "job_queue", "NEW.payload ->> 'email' = 'refused-job@example.com'")
    client = example.app.test_client()

    refused = [client.post("/signup", data={"email": f"refused-{row}@example.com"}).status_code for row in ("user", "job")]
    accepted = client.post("/signup", data={"email": "grace@example.com"})

    assert refused == [500, 500]
    assert accepted.status_code == 201, accepted.get_data(as_text=True)
    assert [row.email for row in rows(engine, "SELECT email FROM users")] == ["grace@example.com"]
    assert [job.payload for job in rl.list_jobs(engine)] == [{"email": "grace@example.com"}]


# -- Django --------------------------------------------------------------------------------------

#: Posts each form of argv[1] to /checkout/ through Django's test Client; prints [[status, json], ...].
DJANGO_CLIENT = """
import json, os, sys
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
django.setup()
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()
client = Client(raise_request_exception=False)
results = []
for form in json.loads(sys.argv[1]):
    response = client.post("/checkout/", form)
    results.append([response.status_code, response.json() if response.status_code == 201 else None])
print(json.dumps(results))
"""


def django_checkout(database_url: str, *forms: dict[str, Any]) -> list[tuple[int, Any]]:
    result = run([sys.executable, "-c", DJANGO_CLIENT, json.dumps(forms)], database_url, cwd=DJANGO_DIR)
    return [tuple(pair) for pair in json.loads(result.stdout.strip().splitlines()[-1])]


def django_migrate(database_url: str) -> None:
    migrated = run(executable(shell_command("Django", "manage.py migrate")), database_url)
    assert "Applying shop.0001_initial... OK" in migrated.stdout
    queue = run(executable(shell_command("Django", "manage.py runledger_migrate")), database_url)
    assert "migrated from an empty database" in queue.stdout


@pytest.fixture
def django_installed() -> None:
    pytest.importorskip("django")


def test_django_example_checkout_commits_order_and_job_then_the_worker_runs_it(django_installed, empty_database,
                                                                               queue_engine):
    django_migrate(empty_database)
    engine = queue_engine(empty_database)
    assert rl.current_revision(engine) == rl.head_revision()
    assert scalar(engine, "SELECT count(*) FROM job_definitions WHERE job_type = 'orders.confirm'") == 1

    [(status, body)] = django_checkout(empty_database, {"item": "book", "quantity": "2"})

    assert status == 201
    [order] = rows(engine, "SELECT id, item, quantity, status FROM shop_order")
    assert tuple(order) == (body["order_id"], "book", 2, "new")
    job = rl.get_job(engine, body["job_id"])
    assert (job.job_type, job.status, job.payload) == ("orders.confirm", rl.JobStatus.PENDING, {"order_id": order.id})

    worker = executable(shell_command("Django", "manage.py runledger_worker"))
    done = run_worker_until(worker, empty_database, engine, job.id)
    assert done.output == {"order_id": order.id, "confirmed": True}
    assert scalar(engine, "SELECT status FROM shop_order WHERE id = :id", id=order.id) == "confirmed"


def test_django_example_checkout_whose_commit_fails_leaves_no_order_and_no_job(django_installed, empty_database,
                                                                               queue_engine):
    django_migrate(empty_database)
    engine = queue_engine(empty_database)
    # One commit refused for the order's row, one for the job's (see the Flask test).
    refuse_at_commit(engine, "shop_order", "NEW.item = 'refused-order'")
    refuse_at_commit(engine, "job_queue", "EXISTS (SELECT 1 FROM shop_order WHERE id = (NEW.payload ->> 'order_id')::bigint "
                                          "AND item = 'refused-job')")

    results = django_checkout(empty_database, {"item": "refused-order"}, {"item": "refused-job"}, {"item": "pen"})

    assert [status for status, _ in results] == [500, 500, 201]
    order_id = results[2][1]["order_id"]
    assert [tuple(row) for row in rows(engine, "SELECT id, item FROM shop_order")] == [(order_id, "pen")]
    assert [job.payload for job in rl.list_jobs(engine)] == [{"order_id": order_id}]
