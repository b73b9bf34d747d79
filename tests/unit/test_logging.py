"""JSON log lines carry the per-job fields; configuring twice installs one handler."""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import re
import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from runledger_sync.logging import (
    JOB_LINES_LOGGER_NAME,
    ROOT_LOGGER_NAME,
    configure_logging,
    get_logger,
    job_log_fields,
)

JOB_ID = uuid.UUID("0190b6c2-5d3e-7a41-9f2b-3c4d5e6f7a8b")
ORG_ID = uuid.UUID("0190b6c2-0000-7000-8000-000000000001")


@pytest.fixture(autouse=True)
def restore_package_logger():
    # configure_logging() changes a process-wide logger; put it back for other tests.
    logger = logging.getLogger(ROOT_LOGGER_NAME)
    handlers, level = list(logger.handlers), logger.level
    job_lines = logging.getLogger(JOB_LINES_LOGGER_NAME).level
    yield
    for handler in list(logger.handlers):
        if handler not in handlers:
            logger.removeHandler(handler)
            handler.close()
    logger.setLevel(level)
    logging.getLogger(JOB_LINES_LOGGER_NAME).setLevel(job_lines)


def fields() -> dict:
    return job_log_fields(
        job_id=JOB_ID,
        job_type="email.send",
        run_number=2,
        attempt=3,
        organization_id=ORG_ID,
        worker_id="worker-1",
    )


def test_job_log_fields_are_strings_for_ids():
    assert fields() == {
        "job_id": "0190b6c2-5d3e-7a41-9f2b-3c4d5e6f7a8b",
        "job_type": "email.send",
        "run_number": 2,
        "attempt": 3,
        "organization_id": "0190b6c2-0000-7000-8000-000000000001",
        "worker_id": "worker-1",
    }


def test_global_job_has_null_organization():
    assert (
        job_log_fields(
            job_id=JOB_ID, job_type="t", run_number=1, attempt=1, organization_id=None, worker_id="w"
        )["organization_id"]
        is None
    )


def test_job_log_fields_are_keyword_only_and_take_no_payload():
    params = inspect.signature(job_log_fields).parameters
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    assert list(params) == ["job_id", "job_type", "run_number", "attempt", "organization_id", "worker_id"]


def test_job_log_fields_do_not_clash_with_log_record_attributes():
    # logging raises KeyError when extra= overwrites a LogRecord attribute.
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    assert not set(fields()) & set(vars(record))


def test_json_line_has_timestamp_level_logger_message_and_job_fields():
    stream = io.StringIO()
    configure_logging(level="DEBUG", stream=stream)
    get_logger("runtime.worker").info("job %s claimed", "x", extra=fields())
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["message"] == "job x claimed"
    assert record["level"] == "INFO"
    assert record["logger"] == "runledger_sync.runtime.worker"
    assert record["timestamp"].startswith("20")
    for key, value in fields().items():
        assert record[key] == value


def test_level_filters_lower_records():
    stream = io.StringIO()
    configure_logging(level="WARNING", stream=stream)
    log = get_logger("x")
    log.info("dropped")
    log.warning("kept")
    assert [json.loads(line)["message"] for line in stream.getvalue().splitlines()] == ["kept"]


def test_configuring_twice_keeps_one_handler_writing_to_the_latest_stream():
    logger = logging.getLogger(ROOT_LOGGER_NAME)
    before = len(logger.handlers)
    first, second = io.StringIO(), io.StringIO()
    configure_logging(stream=first)
    configure_logging(stream=second)
    assert len(logger.handlers) == before + 1
    get_logger("x").warning("once")
    assert first.getvalue() == ""
    assert [json.loads(line)["message"] for line in second.getvalue().splitlines()] == ["once"]


def test_without_a_stream_lines_go_to_the_stderr_of_the_moment(monkeypatch):
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging()
    first.close()  # as a test runner closes the stderr it had lent
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    get_logger("x").warning("after the swap")
    assert [json.loads(line)["message"] for line in second.getvalue().splitlines()] == ["after the swap"]


def test_configure_keeps_handlers_it_did_not_install():
    logger = logging.getLogger(ROOT_LOGGER_NAME)
    foreign = logging.NullHandler()
    logger.addHandler(foreign)
    try:
        configure_logging(stream=io.StringIO())
        configure_logging(stream=io.StringIO())
        assert foreign in logger.handlers
    finally:
        logger.removeHandler(foreign)


def test_text_mode_prints_plain_lines():
    stream = io.StringIO()
    configure_logging(stream=stream, json=False)
    get_logger("x").error("plain")
    line = stream.getvalue().strip()
    assert line.endswith("ERROR runledger_sync.x plain")
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


def test_exception_is_rendered_in_the_json_line():
    stream = io.StringIO()
    configure_logging(stream=stream)
    try:
        raise ValueError("boom")
    except ValueError:
        get_logger("x").exception("handler raised", extra=fields())
    record = json.loads(stream.getvalue())
    assert "ValueError: boom" in record["exc_info"]
    assert record["job_id"] == str(JOB_ID)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("worker", "runledger_sync.worker"),
        ("runtime.worker", "runledger_sync.runtime.worker"),
        ("runledger_sync.store.attempt.ends", "runledger_sync.store.attempt.ends"),
        ("runledger_sync", "runledger_sync"),
        ("runledger_syncer", "runledger_sync.runledger_syncer"),
    ],
)
def test_get_logger_lives_under_the_package_logger(name, expected):
    assert get_logger(name).name == expected


def test_configure_unless_configured_respects_an_existing_handler():
    from runledger_sync.logging import ROOT_LOGGER_NAME, configure_logging_unless_configured

    with bare_logging():
        installed = configure_logging_unless_configured()
        ours = logging.getLogger(ROOT_LOGGER_NAME)
        assert installed is not None and installed in ours.handlers
        assert configure_logging_unless_configured() is None
        assert ours.handlers.count(installed) == 1


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@contextlib.contextmanager
def bare_logging() -> Iterator[None]:
    """No handler on our logger or the root logger in the block (pytest's own, added around the test body, put back after)."""
    ours, root = logging.getLogger(ROOT_LOGGER_NAME), logging.getLogger()
    saved, root_saved = list(ours.handlers), list(root.handlers)
    for handler in saved:
        ours.removeHandler(handler)
    for handler in root_saved:
        root.removeHandler(handler)
    try:
        yield
    finally:
        for handler in list(ours.handlers):
            ours.removeHandler(handler)
        for handler in saved:
            ours.addHandler(handler)
        for handler in root_saved:
            root.addHandler(handler)


@pytest.mark.parametrize(("variable", "text"), [(None, True), ("json", False), ("text", True)])
def test_configure_unless_configured_picks_the_format_as_the_cli_worker_does(monkeypatch, variable, text):
    # `flask runledger worker` and `manage.py runledger_worker` set logging up this way: in a
    # terminal a newcomer should see each job run, as `runledger-sync worker` shows it.
    from runledger_sync.logging import configure_logging_unless_configured

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    if variable is None:
        monkeypatch.delenv("RUNLEDGER_LOG_FORMAT", raising=False)
    else:
        monkeypatch.setenv("RUNLEDGER_LOG_FORMAT", variable)
    with bare_logging():
        assert configure_logging_unless_configured() is not None
        logging.getLogger(JOB_LINES_LOGGER_NAME).info("job email.send 0190 succeeded (attempt 1, 3 ms)")
        get_logger("runtime.worker").info("worker started")

    lines = terminal.getvalue().splitlines()
    if text:
        assert [line.split(" ", 3)[2:] for line in lines] == [
            ["INFO", "runledger_sync.jobs job email.send 0190 succeeded (attempt 1, 3 ms)"],
            ["INFO", "runledger_sync.runtime.worker worker started"],
        ]
    else:
        assert [json.loads(line)["message"] for line in lines] == ["worker started"]


def test_configure_unless_configured_refuses_an_unknown_format_variable(monkeypatch):
    import runledger_sync as rl
    from runledger_sync.logging import configure_logging_unless_configured

    monkeypatch.setenv("RUNLEDGER_LOG_FORMAT", "xml")
    with bare_logging(), pytest.raises(rl.ConfigError, match="RUNLEDGER_LOG_FORMAT must be one of text, json, got 'xml'"):
        configure_logging_unless_configured()


def test_job_lines_are_off_until_asked_for_and_on_in_text_mode_only():
    # The library's default, in a process nothing else configured: a summary a minute, no job lines.
    default = subprocess.run(
        [sys.executable, "-c", "import logging, runledger_sync.logging as rl_logging; "
                               "print(logging.getLogger(rl_logging.JOB_LINES_LOGGER_NAME).isEnabledFor(logging.INFO))"],
        capture_output=True, text=True, check=True)
    assert default.stdout.strip() == "False"
    jobs = logging.getLogger(JOB_LINES_LOGGER_NAME)
    configure_logging(stream=io.StringIO(), json=True)
    assert not jobs.isEnabledFor(logging.INFO)
    configure_logging(stream=io.StringIO(), json=False)
    assert jobs.isEnabledFor(logging.INFO)
    configure_logging(stream=io.StringIO(), json=False, level="WARNING")
    assert not jobs.isEnabledFor(logging.INFO)
    configure_logging(stream=io.StringIO(), json=True, job_lines=True)
    assert jobs.isEnabledFor(logging.INFO)


def test_text_mode_adds_the_extra_fields_as_key_value_pairs():
    stream = io.StringIO()
    configure_logging(stream=stream, json=False)
    get_logger("x").warning("claim failed", extra=fields() | {"error": "connection refused"})
    line = stream.getvalue().strip()
    assert 'WARNING runledger_sync.x claim failed job_id=0190b6c2-5d3e-7a41-9f2b-3c4d5e6f7a8b job_type=email.send' in line
    assert line.endswith('worker_id=worker-1 error="connection refused"')


def test_the_log_format_is_the_option_then_the_variable_then_json_off_a_terminal(monkeypatch):
    from runledger_sync.core.errors import ConfigError
    from runledger_sync.logging import resolve_log_format

    monkeypatch.setenv("RUNLEDGER_LOG_FORMAT", "Text")
    assert resolve_log_format("json") == "json"
    assert resolve_log_format(None) == "text"
    monkeypatch.setenv("RUNLEDGER_LOG_FORMAT", "xml")
    with pytest.raises(ConfigError, match="RUNLEDGER_LOG_FORMAT must be one of text, json, got 'xml'"):
        resolve_log_format(None)
    monkeypatch.delenv("RUNLEDGER_LOG_FORMAT")
    monkeypatch.setattr("sys.stderr", io.StringIO())  # not a terminal: a log collector reads it
    assert resolve_log_format(None) == "json"


#: A record line of the text format starts with its time and level; anything else continues one.
RECORD_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
HOSTILE = 'ok\n2026-01-01 00:00:00,000 ERROR runledger_sync.x {"level":"ERROR","message":"forged"}\x1b[31m\r\x9b2J\x7f'


def hostile_failure() -> ValueError:
    try:
        raise ValueError(HOSTILE)
    except ValueError as error:
        error.add_note("note\nwith a second line\x1b[0m")
        return error


def test_text_mode_prints_one_record_as_one_line_whatever_its_message_and_fields_hold():
    stream = io.StringIO()
    configure_logging(stream=stream, json=False)
    get_logger("x").warning("claim %s failed", HOSTILE, extra={"error": HOSTILE, "job_type": "a\x1bb"})
    [line] = stream.getvalue().splitlines()
    assert RECORD_LINE.match(line)
    assert "\x1b" not in line and "\r" not in line and "\x9b" not in line and "\x7f" not in line
    assert "claim ok\\x0a2026-01-01 00:00:00,000 ERROR" in line
    assert "\\x1b[31m\\x0d\\x9b2J\\x7f failed" in line
    assert "job_type=a\\x1bb" in line
    assert 'error="ok\\n2026-01-01' in line    # quoted as JSON text: JSON's own escapes


def test_text_mode_prints_a_traceback_as_indented_lines_whose_user_text_is_escaped():
    stream = io.StringIO()
    configure_logging(stream=stream, json=False)
    get_logger("x").error("job handler panicked", exc_info=hostile_failure(), stack_info=True)
    output = stream.getvalue()
    first, *rest = output.splitlines()
    assert RECORD_LINE.match(first) and first.endswith("job handler panicked")
    assert rest and all(line.startswith("  ") for line in rest)   # no line of it reads as a record of its own
    assert not any(RECORD_LINE.match(line) for line in rest)
    assert "\x1b" not in output and "\r" not in output and "\x9b" not in output
    assert "  Traceback (most recent call last):" in rest
    assert any(line.startswith("    File ") and "in hostile_failure" in line for line in rest)
    [message] = [line for line in rest if line.startswith("  ValueError")]
    assert message == "  ValueError: ok\\x0a2026-01-01 00:00:00,000 ERROR runledger_sync.x " \
                      '{"level":"ERROR","message":"forged"}\\x1b[31m\\x0d\\x9b2J\\x7f'
    assert "  note\\x0awith a second line\\x1b[0m" in rest
    assert "  Stack (most recent call last):" in rest


def test_json_mode_keeps_one_valid_json_object_per_line_with_the_text_as_given():
    stream = io.StringIO()
    configure_logging(stream=stream)
    get_logger("x").error("claim %s failed", HOSTILE, exc_info=hostile_failure(), extra={"error": HOSTILE})
    [line] = stream.getvalue().splitlines()
    assert "\x1b" not in line and "\x9b" not in line
    record = json.loads(line)
    assert record["message"] == f"claim {HOSTILE} failed" and record["error"] == HOSTILE
    assert f"ValueError: {HOSTILE}" in record["exc_info"]
