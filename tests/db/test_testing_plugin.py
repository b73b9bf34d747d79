"""The pytest plugin's fixtures, run by an inner pytest session in this process (pytester)."""

from __future__ import annotations

import configparser
import os
from pathlib import Path

import sqlalchemy

from runledger_sync.testing.databases import DATABASE_PREFIX, TEST_URL_VARIABLE
from tests.db.test_docs import marked

pytest_plugins = ["pytester"]

PLUGIN = "runledger_sync.testing.pytest_plugin"

USES_THE_FIXTURES = '''
import runledger_sync as rl

def make_registry(engine):
    registry = rl.JobRegistry()
    registry.job("email.send")(lambda ctx, payload: None)
    registry.sync_definitions(engine)
    return registry

def test_the_database_is_migrated_to_head(runledger_engine):
    assert rl.current_revision(runledger_engine) == rl.head_revision()
    make_registry(runledger_engine)
    rl.enqueue(runledger_engine, "email.send", {"to": "a@b.c"})

def test_each_test_has_a_database_of_its_own(runledger_engine):
    assert rl.list_jobs(runledger_engine) == []

def test_the_engine_is_on_the_url(runledger_url, runledger_engine):
    assert runledger_engine.url.database == rl.create_engine(runledger_url).url.database
    assert runledger_engine.url.database.startswith("runledger_test_")
'''


def databases_of_this_process(pg_server) -> list[str]:
    admin = sqlalchemy.create_engine(pg_server.url(), poolclass=sqlalchemy.pool.NullPool)
    try:
        with admin.connect() as conn:
            names = conn.execute(sqlalchemy.text("SELECT datname FROM pg_database")).scalars().all()
    finally:
        admin.dispose()
    return [n for n in names if n.startswith(DATABASE_PREFIX) and f"_{os.getpid()}" in n]


def test_the_fixtures_give_each_test_a_fresh_migrated_database_and_drop_them_after(pytester, monkeypatch, pg_server):
    monkeypatch.setenv(TEST_URL_VARIABLE, pg_server.url())
    pytester.makepyfile(test_app=USES_THE_FIXTURES)

    result = pytester.runpytest_inprocess("-p", PLUGIN, "-p", "no:cacheprovider")

    result.assert_outcomes(passed=3)
    assert databases_of_this_process(pg_server) == []


def test_a_session_that_uses_no_fixture_starts_and_reaches_no_server(pytester, monkeypatch):
    # A server that cannot answer: the run passes only if nothing tries to reach it.
    monkeypatch.setenv(TEST_URL_VARIABLE, "postgresql://nobody@127.0.0.1:1/none")
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")

    result = pytester.runpytest_inprocess("-p", PLUGIN, "-p", "no:cacheprovider")

    result.assert_outcomes(passed=1)


def test_a_server_that_cannot_be_reached_fails_the_tests_that_ask_for_a_database(pytester, monkeypatch):
    monkeypatch.setenv(TEST_URL_VARIABLE, "postgresql://nobody@127.0.0.1:1/none")
    pytester.makepyfile(test_db="def test_db(runledger_engine):\n    pass\n")

    result = pytester.runpytest_inprocess("-p", PLUGIN, "-p", "no:cacheprovider")

    result.assert_outcomes(errors=1)


def test_the_plugin_is_registered_as_a_pytest11_entry_point_named_after_its_module():
    # Named after the module, `-p runledger_sync.testing.pytest_plugin` finds the entry point and
    # never registers the module twice; this suite turns it off and loads it where it tests it.
    config = configparser.ConfigParser()
    config.read(Path(__file__).resolve().parents[2] / "setup.cfg")
    entry_points = config["options.entry_points"]["pytest11"].strip().splitlines()
    assert entry_points == [f"{PLUGIN} = {PLUGIN}"]
    assert f"-p no:{PLUGIN}" in config["tool:pytest"]["addopts"]



def test_the_documented_test_suite_passes_with_the_plugin(pytester, monkeypatch, pg_server):
    monkeypatch.setenv(TEST_URL_VARIABLE, pg_server.url())
    pytester.makepyfile(test_documented=marked("testing-pytest-suite", "python"))

    result = pytester.runpytest_inprocess("-p", PLUGIN, "-p", "no:cacheprovider")

    result.assert_outcomes(passed=2)
