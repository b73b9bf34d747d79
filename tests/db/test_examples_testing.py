"""examples/user_project: an application's own test suite, using the pytest plugin and runledger_sync.testing, run as its author would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from runledger_sync.testing.databases import TEST_URL_VARIABLE

REPO = Path(__file__).resolve().parent.parent.parent
PROJECT = REPO / "examples" / "user_project"


def test_the_example_project_s_tests_pass():
    env = {key: value for key, value in os.environ.items() if not key.startswith(("RUNLEDGER_", "PYTEST_"))}
    if os.environ.get(TEST_URL_VARIABLE):
        env[TEST_URL_VARIABLE] = os.environ[TEST_URL_VARIABLE]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    # Installed, the package's entry point loads the plugin by itself; the checkout
    # may not be installed, so it is named here (under the entry point's own name,
    # which is a no-op when the entry point already loaded it).
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "runledger_sync.testing.pytest_plugin", "-p", "no:cacheprovider"],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=300,
    )

    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert f"rootdir: {PROJECT}" in completed.stdout
    assert "5 passed" in completed.stdout.splitlines()[-1]
