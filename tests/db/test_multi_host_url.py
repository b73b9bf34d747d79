"""libpq multi-host URLs reach the queue through every engine runledger-sync builds.

Each URL names two servers: first one nobody listens on (a refused connection, as a
primary that is down gives), then the test server, reached through a TCP proxy so
the netloc form (``h1:p1,h2:p2``) works with the embedded server's Unix socket too.
libpq tries them in order; ``target_session_attrs=read-write`` keeps a writable one.
"""

from __future__ import annotations

import socket
from typing import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

import runledger_sync as rl
from runledger_sync import cli
from runledger_sync.db.engine import mask_url, normalize_url
from runledger_sync.runtime.supervisor.processes import EngineSpec
from tests.faults.harness import TcpProxy

READ_WRITE = "target_session_attrs=read-write"


def free_port() -> int:
    """A port nothing listens on: bound once to pick it, then closed (connections to it are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def servers(fresh_database) -> Iterator[dict]:
    proxy = TcpProxy(fresh_database)
    parsed = make_url(fresh_database)
    yield {"user": parsed.username, "database": parsed.database, "down": free_port(), "up": proxy.port}
    proxy.close()


def spellings(s: dict) -> dict[str, str]:
    user, db, down, up = s["user"], s["database"], s["down"], s["up"]
    return {
        "netloc": f"postgresql://{user}@127.0.0.1:{down},127.0.0.1:{up}/{db}?{READ_WRITE}",
        "repeated host": f"postgresql://{user}@/{db}?host=127.0.0.1:{down}&host=127.0.0.1:{up}&{READ_WRITE}",
        "host and port lists": f"postgresql://{user}@/{db}?host=127.0.0.1,127.0.0.1&port={down},{up}&{READ_WRITE}",
    }


@pytest.mark.parametrize("form", ["netloc", "repeated host", "host and port lists"])
def test_rl_create_engine_connects_to_the_first_server_that_answers(servers, form):
    engine = rl.create_engine(spellings(servers)[form])
    try:
        assert engine.url.query["host"] == "127.0.0.1,127.0.0.1"
        assert engine.url.query["port"] == f"{servers['down']},{servers['up']}"
        with engine.connect() as conn:
            assert conn.execute(text("SELECT current_database()")).scalar() == servers["database"]
            assert conn.execute(text("SHOW transaction_read_only")).scalar() == "off"
    finally:
        engine.dispose()


def test_the_cli_works_on_a_multi_host_url(servers, capsys):
    code = cli.main(["--database-url", spellings(servers)["netloc"], "migrate"])
    assert code == 0, capsys.readouterr()
    code = cli.main(["--database-url", spellings(servers)["netloc"], "jobs", "list"])
    assert code == 0, capsys.readouterr()


def test_worker_processes_rebuild_the_engine_from_its_multi_host_url(servers):
    parent = rl.create_engine(spellings(servers)["netloc"])
    child = EngineSpec.of(parent).build()
    try:
        assert child.url.query == parent.url.query
        with child.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1
    finally:
        parent.dispose()
        child.dispose()


def test_flask_builds_its_engine_from_a_multi_host_url(servers):
    flask = pytest.importorskip("flask")
    from runledger_sync.contrib import flask as rl_flask

    app = flask.Flask("failover_app")
    app.config.update(RUNLEDGER_DATABASE_URL=spellings(servers)["netloc"])
    ext = rl_flask.Runledger(app, rl.JobRegistry())
    with app.app_context():
        with ext.engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1


def test_django_builds_its_engine_from_a_databases_entry_with_several_hosts(servers):
    pytest.importorskip("django")
    from runledger_sync.contrib.django.settings import database_url

    url = database_url({
        "ENGINE": "django.db.backends.postgresql", "NAME": servers["database"], "USER": servers["user"],
        "HOST": "127.0.0.1,127.0.0.1", "PORT": f"{servers['down']},{servers['up']}",
        "OPTIONS": {"target_session_attrs": "read-write"},
    })
    engine = rl.create_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()


@pytest.mark.parametrize("url, host, port", [
    ("postgresql://u@h1:5432,h2:5433/app", "h1,h2", "5432,5433"),
    ("postgresql://u@h1,h2:5433/app", "h1,h2", ",5433"),
    ("postgresql://u@[::1]:5432,[2001:db8::2]:5433/app", "::1,2001:db8::2", "5432,5433"),
    ("postgresql://u@/app?host=[::1]:5432&host=h2", "::1,h2", "5432,"),
    ("postgresql://u@h1,h2/app", "h1,h2", None),
    ("postgresql://u@%2Frun%2Fa,%2Frun%2Fb:5433/app", "/run/a,/run/b", ",5433"),
])
def test_every_spelling_of_several_servers_becomes_libpqs_lists(url, host, port):
    parsed = normalize_url(url)
    assert parsed.query["host"] == host
    assert parsed.query.get("port") == port
    assert (parsed.database, parsed.username, parsed.drivername) == ("app", "u", "postgresql+psycopg2")


def test_servers_named_twice_are_refused_with_the_url_masked():
    with pytest.raises(rl.ConfigError) as refused:
        normalize_url("postgresql://u:hunter2@h1:1,h2:2/app?host=h3")
    assert "hunter2" not in str(refused.value) and "twice" in str(refused.value)


def test_a_multi_host_urls_password_is_masked():
    masked = mask_url("postgresql://u:hunter2@h1:5432,h2:5432/app?target_session_attrs=read-write")
    assert masked == "postgresql://u:***@h1:5432,h2:5432/app?target_session_attrs=read-write"
