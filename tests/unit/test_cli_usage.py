"""The console script's argument parsing, exit codes and error lines (no database needed)."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import subprocess
import sys
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from uuid import UUID

import pytest

import runledger_sync
from runledger_sync import cli

ENV_VARIABLES = ("RUNLEDGER_DATABASE_URL", "DATABASE_URL", "RUNLEDGER_SCHEMA")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in ENV_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def restore_logging():
    logger = logging.getLogger("runledger_sync")
    handlers, level = list(logger.handlers), logger.level
    yield
    for handler in list(logger.handlers):
        if handler not in handlers:
            logger.removeHandler(handler)
            handler.close()
    logger.setLevel(level)


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


# -- help and usage ------------------------------------------------------------------


def test_help_exits_zero_and_lists_the_commands(capsys):
    code, out, err = run(capsys, "--help")

    assert code == cli.EXIT_OK == 0
    assert "migrate" in out and "check-schema" in out
    assert "--database-url" in out and "--schema" in out and "--debug" in out
    assert err == ""


@pytest.mark.parametrize("name", ["migrate", "check-schema"])
def test_each_command_has_help(capsys, name):
    code, out, _ = run(capsys, name, "--help")

    assert code == 0
    assert out.startswith(f"usage: runledger-sync {name}")


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["--no-such-option", "migrate"],
        ["migrate", "--no-such-option"],
        ["migrate", "extra-positional"],
        ["--database-url"],
    ],
    ids=["no-command", "unknown-command", "unknown-global-option", "unknown-command-option", "extra-argument",
         "option-without-value"],
)
def test_bad_usage_exits_two(capsys, argv):
    code, out, err = run(capsys, *argv)

    assert code == cli.EXIT_USAGE == 2
    assert out == ""
    assert "usage: runledger-sync" in err
    assert "Traceback" not in err


def test_registered_commands_are_migrate_and_check_schema():
    assert {"migrate", "check-schema"} <= set(cli.COMMANDS)
    assert all(entry.help for entry in cli.COMMANDS.values())


def test_a_command_name_cannot_be_registered_twice():
    with pytest.raises(ValueError, match="registered twice"):
        cli.command("migrate", help="again")(lambda args: 0)
    assert cli.COMMANDS["migrate"].run is not None


# -- failures: one error line, one hint, no traceback ------------------------------------


@pytest.mark.parametrize("name", ["migrate", "check-schema"])
def test_missing_database_url_is_config_invalid_and_exits_two(capsys, name):
    code, out, err = run(capsys, name)

    assert code == cli.EXIT_USAGE == 2
    assert out == ""
    lines = error_lines(err)
    assert len(lines) == 2
    assert lines[0].startswith("error: config.invalid: ")
    assert "RUNLEDGER_DATABASE_URL" in lines[0]
    assert lines[1].startswith("hint: ") and "--database-url" in lines[1]
    assert "Traceback" not in err


def test_database_url_comes_from_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "mysql://app:env-s3cret@db.example/app")

    code, _, err = run(capsys, "check-schema")

    assert code == 2
    first = error_lines(err)[0]
    assert first.startswith("error: config.invalid: database url must be a postgresql:// URL")
    assert "env-s3cret" not in err and "***" in first


def test_runledger_database_url_wins_over_database_url(capsys, monkeypatch):
    monkeypatch.setenv("RUNLEDGER_DATABASE_URL", "mysql://first@db.example/app")
    monkeypatch.setenv("DATABASE_URL", "sqlite:///second.db")

    _, _, err = run(capsys, "migrate")

    assert "mysql://first@db.example/app" in err
    assert "sqlite" not in err


@pytest.mark.parametrize("where", ["before", "after"])
def test_global_options_are_accepted_before_or_after_the_command(capsys, where):
    options = ["--database-url", "mysql://u:opt-s3cret@h/d"]
    argv = options + ["migrate"] if where == "before" else ["migrate"] + options

    code, _, err = run(capsys, *argv)

    assert code == 2
    assert "postgresql:// URL, got mysql://u:***@h/d" in error_lines(err)[0]
    assert "opt-s3cret" not in err


def test_unreachable_server_fails_with_one_line_and_masks_the_password(capsys):
    url = f"postgresql://someone:pw-s3cret@127.0.0.1:{closed_port()}/nothing?connect_timeout=3"

    code, out, err = run(capsys, "--database-url", url, "check-schema")

    assert code == 1
    assert out == ""
    lines = error_lines(err)
    assert len(lines) == 2, err
    assert lines[0].startswith("error: ")
    assert "refused" in lines[0].lower() or "connect" in lines[0].lower()
    assert lines[1].startswith("hint: ")
    assert "pw-s3cret" not in err
    assert "Traceback" not in err


def test_debug_prints_the_traceback_too(capsys, restore_logging):
    code, _, err = run(capsys, "--debug", "migrate")

    assert code == 2
    assert "Traceback (most recent call last)" in err
    assert "ConfigError" in err
    assert "error: config.invalid: " in err


def test_debug_after_the_command_is_honoured(capsys, restore_logging):
    code, _, err = run(capsys, "check-schema", "--debug")

    assert code == 2
    assert "Traceback (most recent call last)" in err


def test_redact_masks_the_url_and_leaves_the_rest_of_the_text_as_it_was():
    url = "postgresql://user:p%40ss@host/db"

    text = cli._redact(f"failed for {url} (normalized: postgresql+psycopg2://user:p%40ss@host/db)", url)

    assert text == "failed for postgresql://user:***@host/db (normalized: postgresql+psycopg2://user:***@host/db)"
    assert cli._redact("nothing to hide", None) == "nothing to hide"


@pytest.mark.parametrize(("user", "password"), [("app", "o"), ("postgres", "postgres"), ("app", "p%40ss")])
def test_redact_never_searches_the_text_for_the_password(user, password):
    url = f"postgresql://{user}:{password}@127.0.0.1:5432/postgres"
    message = (f"database connection failed (postgresql+psycopg2://{user}:***@127.0.0.1:5432/postgres): "
               f'connection to server at "127.0.0.1", port 5432 failed: FATAL: role "{user}" does not exist')

    assert cli._redact(message, url) == message
    assert cli._redact(f"{message} ({url})", url) == f"{message} (postgresql://{user}:***@127.0.0.1:5432/postgres)"


@pytest.mark.parametrize("url", ["postgresql://u:s3cret@h/db?sslmode=require&password=s3cret",
                                 "postgresql://u@h/db?password=s3cret"], ids=["both", "query-only"])
def test_mask_url_hides_a_password_given_as_a_query_parameter(url):
    masked = runledger_sync.mask_url(url)

    assert "s3cret" not in masked
    assert "password=***" in masked and masked.startswith("postgresql://u")
    assert "s3cret" not in runledger_sync.mask_urls_in(f"connecting to {url}, then giving up")


def test_the_module_runs_as_a_script_with_the_same_exit_codes(tmp_path):
    root = Path(runledger_sync.__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))

    def script(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "runledger_sync.cli", *argv],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )

    usage = script("frobnicate")
    missing = script("migrate")

    assert usage.returncode == 2
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: config.invalid: ")
    assert "Traceback" not in missing.stderr


# -- the operator commands: usage errors are caught before any database is needed -----------


OPERATOR_COMMANDS = ["enqueue", "jobs list", "jobs show", "jobs retry", "jobs cancel", "dead-letters list",
                     "dead-letters replay", "stats", "schedules list", "schedules show", "schedules pause",
                     "schedules resume", "schedules trigger", "schedules delete", "workflows list", "workflows show",
                     "workflows cancel", "workflows complete-external", "queues list", "queues show", "queues pause",
                     "queues resume", "queues set", "batches list", "batches show"]


@pytest.mark.parametrize("name", OPERATOR_COMMANDS + ["jobs", "dead-letters", "schedules", "workflows", "queues",
                                                      "batches"])
def test_each_operator_command_has_help(capsys, name):
    code, out, _ = run(capsys, *name.split(), "--help")

    assert code == 0
    assert out.startswith(f"usage: runledger-sync {name}")


def test_operator_commands_are_registered_under_their_groups():
    assert set(OPERATOR_COMMANDS) <= set(cli.COMMANDS)
    assert set(cli.GROUPS) == {"jobs", "dead-letters", "schedules", "workflows", "queues", "operations", "encryption", "batches"}


def test_a_nested_command_needs_its_group():
    with pytest.raises(ValueError, match="command_group"):
        cli.command("nothing here", help="orphan")(lambda args: 0)
    assert "nothing here" not in cli.COMMANDS


@pytest.mark.parametrize(
    "argv",
    [
        ["jobs"],
        ["jobs", "frobnicate"],
        ["dead-letters"],
        ["enqueue"],
        ["enqueue", "email.send"],
        ["enqueue", "email.send", "{}", "--priority", "high"],
        ["enqueue", "email.send", "{}", "--delay-seconds", "soon"],
        ["jobs", "list", "--status", "RUNNING"],
        ["jobs", "list", "--limit", "many"],
        ["jobs", "show"],
        ["jobs", "retry"],
        ["jobs", "cancel", "a", "b"],
        ["dead-letters", "replay", "--dry-run", "yes"],
        ["stats", "extra"],
        ["queues"],
        ["queues", "show"],
        ["queues", "pause", "a", "b"],
        ["queues", "set"],
    ],
    ids=lambda argv: " ".join(argv),
)
def test_operator_bad_usage_exits_two_with_the_usage_line(capsys, argv):
    code, out, err = run(capsys, *argv)

    assert code == 2
    assert out == ""
    assert "usage: runledger-sync" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("payload", ["{to: 1}", "", "[1, 2", "nan-ish"])
def test_enqueue_bad_json_is_invalid_payload_exit_two(capsys, payload):
    code, out, err = run(capsys, "enqueue", "email.send", payload)

    assert code == 2
    assert out == ""
    lines = error_lines(err)
    assert len(lines) == 2
    assert lines[0].startswith("error: job.invalid_payload: the JSON argument must be valid JSON (")
    assert lines[1].startswith("hint: ") and "JSON" in lines[1]


@pytest.mark.parametrize("action", ["show", "retry", "cancel"])
def test_a_bad_job_id_is_exit_two_with_its_code(capsys, action):
    code, out, err = run(capsys, "jobs", action, "not-a-uuid")

    assert code == 2
    assert out == ""
    lines = error_lines(err)
    assert lines[0] == ("error: job.invalid_argument: ID must be a job id (a UUID such as "
                        "0190c6c2-5f1e-7000-8000-000000000000), got 'not-a-uuid'")
    assert lines[1] == "hint: copy the id from `runledger-sync jobs list`"


@pytest.mark.parametrize("action", ["list", "replay"])
def test_a_bad_since_is_exit_two_with_its_code(capsys, action):
    code, _, err = run(capsys, "dead-letters", action, "--since", "yesterday")

    assert code == 2
    assert error_lines(err)[0].startswith("error: job.invalid_argument: --since must be an ISO 8601 time")


def test_a_valid_operator_command_without_a_url_is_config_invalid(capsys):
    code, _, err = run(capsys, "jobs", "show", "00000000-0000-7000-8000-000000000000")

    assert code == 2
    assert error_lines(err)[0].startswith("error: config.invalid: ")


def test_plain_turns_records_into_json_ready_data():
    @dataclasses.dataclass
    class Row:
        id: UUID
        status: runledger_sync.JobStatus
        at: datetime
        pct: Decimal
        nested: dict

    row = Row(UUID(int=1), runledger_sync.JobStatus.PENDING, datetime(2026, 1, 2, tzinfo=timezone.utc),
              Decimal("12.50"), {"k": [UUID(int=2)]})

    assert cli._plain(row) == {
        "id": "00000000-0000-0000-0000-000000000001", "status": "PENDING", "at": "2026-01-02T00:00:00+00:00",
        "pct": 12.5, "nested": {"k": ["00000000-0000-0000-0000-000000000002"]},
    }



def test_every_hint_names_a_code_the_library_raises():
    classes, codes = [runledger_sync.RunledgerError], set()
    while classes:
        cls = classes.pop()
        codes.add(cls.code)
        classes.extend(cls.__subclasses__())
    assert "workflow.release_conflict" in codes  # the walk reached the leaves
    assert sorted(set(cli.HINTS) - codes) == []
