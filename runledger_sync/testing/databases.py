"""Databases for tests: one PostgreSQL server per session, a template migrated once, a fresh clone per test.

Cloning a migrated template (``CREATE DATABASE ... TEMPLATE``) costs a few tens
of milliseconds, against a second or more to migrate each database afresh, and
keeps every test's database apart from the others'. The server is the one
``RUNLEDGER_TEST_DATABASE_URL`` names, on which databases are created and
dropped, or else an embedded one (the ``embedded`` extra) that lives as long as
the session.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Optional, Protocol


from runledger_sync.core.errors import ConfigError
from runledger_sync.db.embedded import EmbeddedPostgres, create_database_on, drop_database_on
from runledger_sync.db.engine import create_engine, normalize_url
from runledger_sync.db.migrate import migrate

#: The server tests create their databases on; unset, an embedded server is started.
TEST_URL_VARIABLE = "RUNLEDGER_TEST_DATABASE_URL"
#: Prefix of the databases made here (a project's own suite may make others beside them).
DATABASE_PREFIX = "runledger_test"


class Server(Protocol):
    """A server on which databases are created (optionally from a template) and dropped."""

    def create_database(self, name: str, *, template: Optional[str] = None, drop_existing: bool = False) -> str: ...

    def drop_database(self, name: str) -> None: ...


class ExternalServer:
    """A PostgreSQL server given by URL, on which tests create their own databases."""

    def __init__(self, url: str) -> None:
        self._url = normalize_url(url)

    def url(self, database: str = "postgres") -> str:
        """The URL of ``database`` on this server (password included: the caller connects with it)."""
        return self._url.set(database=database).render_as_string(hide_password=False)

    def create_database(self, name: str, *, template: Optional[str] = None, drop_existing: bool = False) -> str:
        """Create ``name`` (a copy of ``template`` when given) and return its URL."""
        create_database_on(self._url, name, template=template, drop_existing=drop_existing)
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop ``name``, closing its connections first."""
        drop_database_on(self._url, name)


class TemplateDatabases:
    """A session's databases: :meth:`fresh` clones the migrated template; :meth:`close` drops it and stops the server.

    Args:
        url: the server to create databases on; None starts an embedded one in a
            temporary directory, removed on :meth:`close`.
    """

    __test__ = False  # a class named for tests, not a test class

    def __init__(self, url: Optional[str] = None) -> None:
        self._numbers = itertools.count(1)
        self._embedded: Optional[EmbeddedPostgres] = None
        self._data_dir: Optional[str] = None
        self.server: Server
        if url:
            self.server = ExternalServer(url)
        else:
            self._data_dir = tempfile.mkdtemp(prefix="runledger-test-pg-")
            try:
                self.server = self._embedded = EmbeddedPostgres(Path(self._data_dir) / "data", delete_on_stop=True).start()
            except ConfigError as error:
                shutil.rmtree(self._data_dir, ignore_errors=True)
                raise ConfigError([f"{TEST_URL_VARIABLE} is unset, so tests need an embedded server: "
                                   f"{'; '.join(error.problems)}; or set {TEST_URL_VARIABLE} to a server's URL"]) from error
        self.template = f"{DATABASE_PREFIX}_template_{os.getpid()}"
        engine = create_engine(self.server.create_database(self.template, drop_existing=True))
        try:
            migrate(engine)
        finally:
            engine.dispose()

    @classmethod
    def from_env(cls) -> "TemplateDatabases":
        """On the server ``RUNLEDGER_TEST_DATABASE_URL`` names, or an embedded one when it is unset or blank."""
        return cls(os.environ.get(TEST_URL_VARIABLE, "").strip() or None)

    def fresh(self) -> Iterator[str]:
        """Yield the URL of a new database cloned from the template; drop it when resumed."""
        name = f"{DATABASE_PREFIX}_{os.getpid()}_{next(self._numbers)}"
        url = self.server.create_database(name, template=self.template)
        try:
            yield url
        finally:
            self.server.drop_database(name)

    def close(self) -> None:
        """Drop the template, and stop the embedded server if one was started."""
        try:
            self.server.drop_database(self.template)
        finally:
            if self._embedded is not None:
                self._embedded.stop()
            if self._data_dir is not None:
                shutil.rmtree(self._data_dir, ignore_errors=True)
