"""Supervisor(processes=N) refuses, with config.invalid and before any process starts, what cannot work."""

from __future__ import annotations

import sys
import types

import pytest

import runledger_sync as rl
from tests import cli_app

#: Never connected to: building a Supervisor must not touch the database.
URL = "postgresql://app:hunter2@localhost:1/never"


@pytest.fixture
def engine():
    made = rl.create_engine(URL)
    yield made
    made.dispose()


def refusal(engine, registry=cli_app.registry, **options) -> rl.ConfigError:
    with pytest.raises(rl.ConfigError) as caught:
        rl.Supervisor(engine, registry, rl.JobsConfig(), **options)
    assert caught.value.code == "config.invalid"
    assert "hunter2" not in str(caught.value)
    return caught.value


@pytest.mark.parametrize("processes", [0, -1, True, 1.5, "2", None])
def test_processes_must_be_an_int_of_at_least_one(engine, processes):
    error = refusal(engine, processes=processes, app="tests.cli_app:registry")
    assert str(error) == f"config.invalid: processes must be an integer >= 1, got {processes!r}"


def test_one_process_needs_no_app_and_starts_no_child(engine):
    supervisor = rl.Supervisor(engine, cli_app.registry, rl.JobsConfig(), processes=1)
    assert supervisor.processes == 1 and not supervisor.running


def test_several_processes_need_an_app_to_import_the_registry_from(engine):
    assert "needs app='module:attribute'" in str(refusal(engine, processes=2))


@pytest.mark.parametrize(("app", "expected"), [
    ("tests.cli_app", "app must look like 'module:attribute'"),
    ("no_such_module:registry", "app module 'no_such_module' could not be imported"),
    ("tests.cli_app:nothing", "'tests.cli_app' has no attribute 'nothing'"),
    ("tests.cli_app:rl", "must name a JobRegistry, got module"),
])
def test_an_app_that_does_not_name_a_registry_is_refused(engine, app, expected):
    assert expected in str(refusal(engine, processes=2, app=app))


def test_an_app_naming_a_registry_with_other_types_is_refused(engine):
    other = rl.JobRegistry()
    other.job("other.type")(lambda ctx, payload: None)
    error = refusal(engine, registry=other, processes=2, app="tests.cli_app:registry")
    assert "registers ['cli.echo'], but the registry given registers ['other.type']" in str(error)


def test_a_registry_in_an_interactive_sessions_main_is_refused(engine, monkeypatch):
    interactive = types.ModuleType("__main__")
    interactive.registry = cli_app.registry
    monkeypatch.setitem(sys.modules, "__main__", interactive)
    assert "which a worker process cannot import" in str(refusal(engine, processes=2, app="__main__:registry"))


def test_engine_options_that_cannot_reach_a_child_are_refused(engine):
    unpicklable = engine.execution_options(runledger_test_hook=lambda: None)
    assert "execution options cannot be sent" in str(refusal(unpicklable, processes=2, app="tests.cli_app:registry"))


def test_the_password_reaches_children_only_inside_the_pickled_spec_never_its_repr(engine):
    supervisor = rl.Supervisor(engine.execution_options(schema_translate_map={None: "jobs"}), cli_app.registry,
                               rl.JobsConfig(), processes=2, app="tests.cli_app:registry")
    spec = supervisor._group.engine_spec
    assert "hunter2" in spec.url and "hunter2" not in repr(spec)
    assert spec.execution_options["schema_translate_map"] == {None: "jobs"}
    # The engine's pool-mode policy goes too (pickled as its mode), so a child prepares as the parent does.
    assert spec.execution_options["runledger_connection_policy"].mode is rl.PoolMode.SESSION
    rebuilt = spec.build()
    try:
        assert rebuilt.url == engine.url and rebuilt.get_execution_options()["schema_translate_map"] == {None: "jobs"}
        assert rebuilt.pool.size() == engine.pool.size()
    finally:
        rebuilt.dispose()
