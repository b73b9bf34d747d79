"""The Makefile's first-mile targets do what the README says, read from `make -n` (nothing runs)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def planned(target: str, tmp_path: Path) -> list[str]:
    """The commands `make TARGET` would run on a fresh clone (its virtualenv not built yet)."""
    result = subprocess.run(["make", "--no-print-directory", "-n", target, f"VENV={tmp_path / 'venv'}", "PYTHON=python3"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def installs(commands: list[str]) -> list[str]:
    return [match for line in commands for match in re.findall(r"pip install --quiet -e '(\.\[[\w,-]+\])'", line)]


def test_make_demo_installs_only_the_embedded_extra(tmp_path):
    commands = planned("demo", tmp_path)
    assert installs(commands) == [".[embedded]"]
    assert commands[-1].endswith("runledger-sync demo")


def test_make_test_installs_the_dev_extra_and_says_how_long_it_takes_first(tmp_path):
    commands = planned("test", tmp_path)
    assert installs(commands) == [".[dev]"]
    announce = [line for line in commands if line.startswith("echo ")]
    assert len(announce) == 1 and "minutes" in announce[0]
    assert commands.index(announce[0]) < next(i for i, line in enumerate(commands) if "-m pytest" in line)


def test_demo_and_test_installs_have_stamps_of_their_own(tmp_path):
    demo_stamp = [line for line in planned("demo", tmp_path) if line.startswith("touch ")]
    test_stamp = [line for line in planned("test", tmp_path) if line.startswith("touch ")]
    assert len(demo_stamp) == len(test_stamp) == 1 and demo_stamp != test_stamp


def test_make_test_quick_runs_the_unit_and_sql_layer_tests_on_two_processes(tmp_path):
    [pytest_line] = [line for line in planned("test-quick", tmp_path) if "-m pytest" in line]
    assert pytest_line.split("-m pytest", 1)[1].split()[:4] == ["-n", "2", "tests/unit", "tests/db/store"]


def test_make_docs_serve_listens_on_localhost_only(tmp_path):
    [serve] = [line for line in planned("docs-serve", tmp_path) if "mkdocs serve" in line]
    assert "--dev-addr 127.0.0.1:" in serve


def test_the_readme_names_the_inner_loop_and_how_to_view_the_docs():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "`make test-quick`" in readme and "`make docs-serve`" in readme
