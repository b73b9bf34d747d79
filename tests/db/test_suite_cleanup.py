"""The suite's own embedded server does not outlive a run, even one that is interrupted.

A CI timeout sends SIGTERM, a developer presses Ctrl-C (SIGINT): either way the server
stops and its directory is removed, as at the end of a clean run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.embedded_server_subject import REPORT_VARIABLE

REPO = Path(__file__).resolve().parents[2]
SERVER_START_SECONDS = 90


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _gone_within(pid: int, seconds: float) -> bool:
    # The server removes its pid file (which ends pg_ctl's wait) a moment before its last exit.
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _wait_for_file(path: Path, process: subprocess.Popen) -> str:
    deadline = time.monotonic() + SERVER_START_SECONDS
    while not path.exists() or not path.read_text(encoding="utf-8"):
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, "the embedded server did not come up"
        time.sleep(0.05)
    return path.read_text(encoding="utf-8")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_interrupted_run_stops_the_embedded_server_and_removes_its_directory(signum, short_tmp):
    report = short_tmp / "report"
    scratch = short_tmp / "tmp"
    scratch.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "RUNLEDGER_TEST_DATABASE_URL"}
    env.update({REPORT_VARIABLE: str(report), "TMPDIR": str(scratch), "PYTHONPATH": str(REPO)})
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/embedded_server_subject.py"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    postmaster = None
    try:
        data_dir = Path(_wait_for_file(report, process))
        postmaster = int((data_dir / "postmaster.pid").read_text(encoding="utf-8").split()[0])
        assert _alive(postmaster)

        process.send_signal(signum)
        output = process.communicate(timeout=120)[0]

        assert process.returncode != 0, output  # interrupted, not passed
        assert _gone_within(postmaster, 30), output
        assert not data_dir.exists()
        assert [path.name for path in scratch.iterdir() if path.name.startswith("rl-test-pg-")] == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if postmaster is not None and _alive(postmaster):  # the failure above; leave no server behind
            os.kill(postmaster, signal.SIGQUIT)


@pytest.mark.timeout(180)
def test_a_clean_run_leaves_no_directory_behind(short_tmp):
    scratch = short_tmp / "tmp"
    scratch.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "RUNLEDGER_TEST_DATABASE_URL"}
    env.update({"TMPDIR": str(scratch), "PYTHONPATH": str(REPO)})
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/embedded_server_subject.py"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=170)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert [path.name for path in scratch.iterdir() if path.name.startswith("rl-test-pg-")] == []
