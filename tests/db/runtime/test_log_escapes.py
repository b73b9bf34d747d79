"""A handler's exception text cannot forge a log record or drive a terminal, in either log format.

A real worker runs a handler that raises with a newline, a made-up record and
escape sequences in its message; the text log and the JSON log it printed are
then read back.
"""

from __future__ import annotations

import io
import json
import logging
import re
import threading
from typing import Any

import runledger_sync as rl
from runledger_sync.logging import _json_formatter
from tests.handlers import fast_config
from tests.support import configured_logging

JOB_TYPE = "reports.hostile"
FORGED = '{"level":"ERROR","logger":"runledger_sync.runtime.worker.loop","message":"forged"}'
HOSTILE = f"ok\n{FORGED}\x1b[31m\r\n2026-01-01 00:00:00,000 ERROR runledger_sync.x forged\x9b2J"
RECORD_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def run_hostile_job(engine: Any) -> tuple[str, str]:
    """Run one job whose handler raises HOSTILE; return the text log and the JSON log the worker printed."""
    dead_lettered = threading.Event()
    registry = rl.JobRegistry()

    @registry.job(JOB_TYPE, max_attempts=1, on_dead_letter=lambda ctx, payload, info: dead_lettered.set())
    def hostile(ctx: rl.JobContext, payload: dict) -> None:
        raise ValueError(HOSTILE)

    registry.sync_definitions(engine)
    rl.enqueue(engine, JOB_TYPE, {})
    text, json_lines = io.StringIO(), io.StringIO()
    shutdown = threading.Event()
    worker = threading.Thread(target=rl.run_worker_loop, args=(engine, registry, fast_config(), shutdown), daemon=True)
    with configured_logging(level="DEBUG", stream=text, json=False) as logger:
        json_handler = logging.StreamHandler(json_lines)
        json_handler.setFormatter(_json_formatter())
        logger.addHandler(json_handler)
        try:
            worker.start()
            assert dead_lettered.wait(20)
        finally:
            shutdown.set()
            worker.join(30)
    assert not worker.is_alive()
    return text.getvalue(), json_lines.getvalue()


def test_a_handlers_exception_text_is_one_escaped_line_in_the_text_log_and_valid_json_in_the_json_log(engine):
    text, json_lines = run_hostile_job(engine)

    lines = text.splitlines()
    assert "\x1b" not in text and "\r" not in text and "\x9b" not in text
    # Every line is a record's own, or an indented line continuing the record above it.
    assert all(RECORD_LINE.match(line) or line.startswith("  ") for line in lines), lines
    [panic] = [index for index, line in enumerate(lines) if RECORD_LINE.match(line) and "job handler raised ValueError" in line]
    continuation = []
    for line in lines[panic + 1:]:
        if RECORD_LINE.match(line):
            break
        continuation.append(line)
    assert "  Traceback (most recent call last):" in continuation
    [message] = [line for line in continuation if line.startswith("  ValueError")]
    assert message == "  ValueError: ok\\x0a" + FORGED + "\\x1b[31m\\x0d\\x0a2026-01-01 00:00:00,000 ERROR " \
                      "runledger_sync.x forged\\x9b2J"
    assert not any(line.startswith((FORGED, "2026-01-01 00:00:00,000")) for line in lines), \
        "a line of the message printed as a record of its own"

    records = [json.loads(line) for line in json_lines.splitlines()]   # every line is one JSON object
    assert "\x1b" not in json_lines and "\x9b" not in json_lines
    assert not any(record.get("message") == "forged" for record in records)
    [panic_record] = [record for record in records if record["message"].startswith("job handler raised ValueError")]
    assert f"ValueError: {HOSTILE}" in panic_record["exc_info"]
