"""Shared fixtures: one PostgreSQL per run, a migrated template, a fresh clone per test.

The embedded server (pgserver) is used unless RUNLEDGER_TEST_DATABASE_URL names
a server; on that server the suite creates and drops its own databases.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import tempfile
from types import FrameType
from typing import Iterator, Optional

import pytest
import sqlalchemy

from runledger_sync.db.embedded import EmbeddedPostgres
from runledger_sync.db.engine import create_engine
from runledger_sync.db.migrate import migrate
from runledger_sync.testing.databases import TEST_URL_VARIABLE, ExternalServer
_clone_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[object]:
    external = os.environ.get(TEST_URL_VARIABLE, "").strip()
    if external:
        yield ExternalServer(external)
        return
    # SIGTERM (a CI timeout) becomes the KeyboardInterrupt that SIGINT already is: pytest then
    # tears the session down, so the finally below stops the server and removes its directory
    # instead of leaving a running PostgreSQL and its data behind.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    scratch = tempfile.mkdtemp(prefix="rl-test-pg-")
    server = EmbeddedPostgres(os.path.join(scratch, "data"), delete_on_stop=True)
    try:
        yield server.start()
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: Optional[FrameType]) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def template_database(pg_server) -> str:
    """A database migrated to head once per run; every test database is cloned from it."""
    name = f"rl_template_{os.getpid()}"
    url = pg_server.create_database(name, drop_existing=True)
    engine = create_engine(url)
    migrate(engine)
    engine.dispose()
    yield name
    pg_server.drop_database(name)


@pytest.fixture
def fresh_database(pg_server, template_database) -> Iterator[str]:
    """The URL of a new database cloned from the migrated template, dropped after the test."""
    name = f"rl_test_{os.getpid()}_{next(_clone_numbers)}"
    url = pg_server.create_database(name, template=template_database)
    yield url
    pg_server.drop_database(name)


@pytest.fixture
def engine(fresh_database) -> Iterator[sqlalchemy.Engine]:
    """An engine on a fresh migrated database: use it when commits, threads or SKIP LOCKED matter."""
    engine = create_engine(fresh_database)
    yield engine
    engine.dispose()


@pytest.fixture
def empty_database(pg_server) -> Iterator[str]:
    """The URL of a new database with no schema at all (for migration tests)."""
    name = f"rl_empty_{os.getpid()}_{next(_clone_numbers)}"
    url = pg_server.create_database(name)
    yield url
    pg_server.drop_database(name)


@pytest.fixture(autouse=True)
def _encryption_left_as_found() -> Iterator[None]:
    """Put the process's encryption keys back after each test.

    ``configure_encryption`` is process-wide (so is the CLI's and ``JobsConfig.from_env``'s
    reading of the environment): keys one test set would otherwise seal the next test's
    jobs, which a worker process without them then never runs.
    """
    from runledger_sync.core.encryption import active_encryption, configure_encryption

    before = active_encryption()
    yield
    configure_encryption(before)
