"""pytest fixtures for applications that use runledger-sync: a fresh migrated PostgreSQL database per test.

Installing runledger-sync registers this module as a pytest plugin (entry
point ``pytest11``, named after the module, so ``-p
runledger_sync.testing.pytest_plugin`` loads it where the package is not
installed and ``-p no:runledger_sync.testing.pytest_plugin`` turns it off).

``runledger_url``
    The URL of a database of its own for the test, cloned from a template
    migrated to head once per session, and dropped after the test. The server
    is the one ``RUNLEDGER_TEST_DATABASE_URL`` names, or else an embedded
    PostgreSQL (the ``embedded`` extra), started the first time a test asks for
    a database: a session that uses neither fixture starts nothing.
``runledger_engine``
    An engine on that database (``rl.create_engine(runledger_url)``), disposed
    after the test.
"""

from __future__ import annotations

from typing import Iterator

import pytest
from sqlalchemy.engine import Engine

from runledger_sync.db.engine import create_engine
from runledger_sync.testing.databases import TemplateDatabases


@pytest.fixture(scope="session")
def _runledger_databases() -> Iterator[TemplateDatabases]:
    databases = TemplateDatabases.from_env()
    try:
        yield databases
    finally:
        databases.close()


@pytest.fixture
def runledger_url(_runledger_databases: TemplateDatabases) -> Iterator[str]:
    """The URL of a fresh database migrated to head, for this test alone."""
    yield from _runledger_databases.fresh()


@pytest.fixture
def runledger_engine(runledger_url: str) -> Iterator[Engine]:
    """An engine on this test's fresh database (``runledger_url``)."""
    engine = create_engine(runledger_url)
    try:
        yield engine
    finally:
        engine.dispose()
