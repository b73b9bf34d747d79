"""A plain ``postgresql://`` URL, as a newcomer writes it, works everywhere; a driver we cannot use says so.

SQLAlchemy 2.1 reads ``postgresql://`` as psycopg (3), 2.0 as psycopg2. Both
drivers are installed with runledger-sync: every engine runledger-sync builds
connects with psycopg2, and the application's own engine (Flask-SQLAlchemy's)
gets psycopg 3. Each check runs in a fresh interpreter, as a user's process
would, with no ``RUNLEDGER_*`` variable inherited.
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy.engine import make_url

import runledger_sync as rl

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture
def plain_url(empty_database) -> str:
    """The test database's URL with no driver named: ``postgresql://user@host:port/db``."""
    return make_url(empty_database).set(drivername="postgresql").render_as_string(hide_password=False)


def run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {key: value for key, value in os.environ.items()
             if not key.startswith(("RUNLEDGER_", "FLASK_", "PYTHON")) and key != "DATABASE_URL"}
    clean.update(PYTHONPATH=str(REPO), **env)
    return subprocess.run(argv, cwd=cwd, env=clean, capture_output=True, text=True, timeout=120)


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def test_installing_runledger_sync_installs_the_driver_a_plain_url_means():
    setup = configparser.ConfigParser(inline_comment_prefixes=("#",))
    setup.read(REPO / "setup.cfg")
    requirements = [line.strip() for line in setup["options"]["install_requires"].splitlines() if line.strip()]

    assert any(line.startswith("psycopg[binary]>=3") for line in requirements), requirements
    assert any(line.startswith("psycopg2-binary") for line in requirements), requirements


SCRIPT = '''
import sys, threading
import sqlalchemy
import runledger_sync as rl

url = sys.argv[1]
engine = rl.create_engine(url)
rl.migrate(engine)
registry = rl.JobRegistry()
ran = []

@registry.job("plain.hello")
def hello(ctx, payload):
    ran.append(payload["n"])

registry.sync_definitions(engine)
job = rl.enqueue(engine, "plain.hello", {"n": 1})
# The application's own engine, built by SQLAlchemy from the same plain URL.
own = sqlalchemy.create_engine(url)
with own.begin() as connection:
    rl.enqueue(connection, "plain.hello", {"n": 2})
stop = threading.Event()
worker = threading.Thread(target=rl.run_worker_loop, args=(engine, registry, rl.JobsConfig(poll_interval_ms=100), stop))
worker.start()
deadline = threading.Event()
for _ in range(300):
    if len(ran) == 2:
        break
    deadline.wait(0.1)
stop.set()
worker.join(30)
print(engine.url.get_driver_name(), own.url.get_driver_name(), sorted(ran), rl.get_job(engine, job.id).status.value)
'''


def test_a_plain_url_runs_create_engine_enqueue_and_a_worker(plain_url, tmp_path):
    (tmp_path / "plain.py").write_text(SCRIPT, encoding="utf-8")

    out = ok(run([sys.executable, "plain.py", plain_url], tmp_path))

    expected_own = sqlalchemy.create_engine(plain_url).url.get_driver_name()  # psycopg on SQLAlchemy 2.1
    assert out.strip() == f"psycopg2 {expected_own} [1, 2] SUCCEEDED"


def test_a_plain_url_works_for_the_console_script(plain_url, tmp_path):
    assert ok(run([str(BIN / "runledger-sync"), "migrate"], tmp_path, RUNLEDGER_DATABASE_URL=plain_url)) == (
        f"schema at {rl.head_revision()} (migrated from an empty database)\n")
    assert "PENDING" in ok(run([str(BIN / "runledger-sync"), "--database-url", plain_url, "stats"], tmp_path))


FLASK_APP = '''
import os
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
import runledger_sync as rl
from runledger_sync.contrib.flask import Runledger

registry = rl.JobRegistry()


@registry.job("flask.hello")
def hello(ctx, payload):
    return None


app = Flask(__name__)
app.config["SQLALCHEMY_DATABASE_URI"] = os.environ["APP_DATABASE_URL"]
if "QUEUE_DATABASE_URL" in os.environ:
    app.config["RUNLEDGER_DATABASE_URL"] = os.environ["QUEUE_DATABASE_URL"]
db = SQLAlchemy(app)
runledger = Runledger(app, registry)


@app.cli.command("enqueue-in-session")
def enqueue_in_session():
    """Enqueue inside Flask-SQLAlchemy's own session, on its own (psycopg 3) connection."""
    job = runledger.enqueue("flask.hello", {}, connection=db.session.connection())
    db.session.commit()
    print(db.engine.url.get_driver_name(), runledger.engine.url.get_driver_name(), job.id)
'''


@pytest.fixture
def flask_app(tmp_path) -> Path:
    (tmp_path / "plainapp.py").write_text(textwrap.dedent(FLASK_APP), encoding="utf-8")
    return tmp_path


def test_a_plain_url_works_for_flask_sqlalchemy_and_the_flask_cli_group(flask_app, plain_url, empty_database):
    def flask(*argv: str) -> subprocess.CompletedProcess:
        return run([str(BIN / "flask"), "--app", "plainapp", *argv], flask_app, APP_DATABASE_URL=plain_url)

    assert ok(flask("runledger", "migrate")) == (
        f"schema at {rl.head_revision()} (migrated from an empty database); 1 job definition(s) written\n")
    own_driver, queue_driver, job_id = ok(flask("enqueue-in-session")).split()

    assert (own_driver, queue_driver) == (sqlalchemy.create_engine(plain_url).url.get_driver_name(), "psycopg2")
    engine = rl.create_engine(empty_database)
    try:
        job = rl.get_job(engine, job_id)
        assert job is not None and job.job_type == "flask.hello" and job.status is rl.JobStatus.PENDING
    finally:
        engine.dispose()


@pytest.mark.parametrize("driver", ["asyncpg", "pg8000"])
def test_a_driver_the_queue_cannot_use_is_named_under_flask_not_hidden_as_no_such_command(
    flask_app, plain_url, driver
):
    queue_url = make_url(plain_url).set(drivername=f"postgresql+{driver}").render_as_string(hide_password=False)

    result = run([str(BIN / "flask"), "--app", "plainapp", "runledger", "migrate"], flask_app,
                 APP_DATABASE_URL=plain_url, QUEUE_DATABASE_URL=queue_url)

    assert result.returncode != 0
    assert "No such command" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"runledger_sync.core.errors.ConfigError: config.invalid: database url names the driver "
                           f"'{driver}'"), result.stderr
    assert "write postgresql://" in last


@pytest.mark.parametrize("spelling", ["postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2"])
def test_every_psycopg_spelling_gives_a_psycopg2_engine_that_connects(empty_database, spelling):
    url = make_url(empty_database).set(drivername="postgresql").render_as_string(hide_password=False)
    url = spelling + url[len("postgresql"):]
    engine = rl.create_engine(url)
    try:
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT 1").scalar_one() == 1
        assert engine.url.drivername == "postgresql+psycopg2"
        assert engine.url.render_as_string(hide_password=False).split("://", 1)[1] == url.split("://", 1)[1]
    finally:
        engine.dispose()
