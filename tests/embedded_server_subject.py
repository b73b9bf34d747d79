"""A test run in a subprocess by tests/db/test_suite_cleanup.py, never by the suite itself.

It starts the session's embedded server. Given a report file, it writes the server's data
directory there and then waits to be interrupted (the signal, not this test, ends the run);
without one it passes at once (a clean run).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

REPORT_VARIABLE = "RUNLEDGER_SUBJECT_REPORT"


def test_hold_the_embedded_server_until_interrupted(pg_server):
    report = os.environ.get(REPORT_VARIABLE)
    if report:
        Path(report).write_text(str(pg_server.data_dir), encoding="utf-8")
        threading.Event().wait(100)
