"""Fixtures for the database suite beyond the shared ones in tests/conftest.py."""

from __future__ import annotations

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
