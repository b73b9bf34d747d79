"""Fixtures for the database suite beyond the shared ones in tests/conftest.py."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from runledger_sync import cli


@pytest.fixture
def run(capsys, fresh_database):
    """Run the console script in-process against the test database: (exit code, stdout, stderr)."""

    def invoke(*argv: str) -> tuple[int, str, str]:
        code = cli.main(["--database-url", fresh_database, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return invoke


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A scratch directory with a short path: an embedded server's socket path must fit in 107 bytes,
    which pytest's own temporary directories (deeper still under xdist) can exceed."""
    path = Path(tempfile.mkdtemp(prefix="rl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
