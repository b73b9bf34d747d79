"""An embedded PostgreSQL server (pgserver) for the demo and the tests.

It listens on a Unix socket only, inside a data directory you can name, and
works when run as root (pgserver then runs the server as a dedicated user).
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Optional

import sqlalchemy

from runledger_sync.core.errors import ConfigError, extra_install_hint
from runledger_sync.core.store_errors import ConnectionFailed

DEFAULT_DATA_DIR = Path(tempfile.gettempdir()) / "runledger-embedded"
#: How long an immediate stop waits for the server's processes to end.
_IMMEDIATE_STOP_SECONDS = 30
#: How long a start that outlived pgserver's own 10 s wait may still take to say ready.
STARTUP_GRACE_SECONDS = 60


def _load_pgserver() -> Any:
    # pgserver's platformdirs warns at import time when XDG_RUNTIME_DIR is unset
    # (containers, CI); the fallback it picks works, so the warning is noise.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import pgserver
        except ImportError as exc:
            raise ConfigError(
                [f"embedded postgres needs pgserver: {extra_install_hint('embedded')}"]
            ) from exc
    return pgserver


class EmbeddedPostgres:
    """A PostgreSQL server that lives in one data directory.

    Example:
        ``with EmbeddedPostgres("/tmp/rl-demo") as pg: engine = rl.create_engine(pg.url())``
    """

    def __init__(self, data_dir: str | Path | None = None, *, delete_on_stop: bool = False) -> None:
        self.data_dir = Path(data_dir) if data_dir is not None else DEFAULT_DATA_DIR
        self.delete_on_stop = delete_on_stop
        self._server: Any = None

    def start(self) -> "EmbeddedPostgres":
        """Start the server (or join the one already running in this data directory)."""
        if self._server is not None:
            return self
        pgserver = _load_pgserver()
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        cleanup_mode = "delete" if self.delete_on_stop else "stop"
        try:
            self._server = pgserver.get_server(self.data_dir, cleanup_mode=cleanup_mode)
        except Exception as exc:  # pgserver raises subprocess and OS errors
            # pgserver gives pg_ctl 10 s; on a loaded machine (or after a crash, with WAL
            # to replay) the server may still be coming up. Once it says ready, join it.
            if not self._becomes_ready(STARTUP_GRACE_SECONDS):
                raise ConnectionFailed(f"embedded postgres failed to start in {self.data_dir}: {exc}") from exc
            try:
                self._server = pgserver.get_server(self.data_dir, cleanup_mode=cleanup_mode)
            except Exception as again:
                raise ConnectionFailed(f"embedded postgres failed to start in {self.data_dir}: {again}") from again
        return self

    def _becomes_ready(self, within_seconds: float) -> bool:
        """Whether the server starting in this data directory reports itself ready in time."""
        deadline = time.monotonic() + within_seconds
        pid_file = self.data_dir / "postmaster.pid"
        while time.monotonic() < deadline:
            try:
                lines = pid_file.read_text().splitlines()
            except OSError:
                return False  # no server is starting: nothing to wait for
            # Line 8 of postmaster.pid is the server's status ("starting", "ready", ...).
            if len(lines) >= 8 and lines[7].strip() == "ready":
                return True
            time.sleep(0.2)
        return False

    def stop(self, *, immediate: bool = False) -> None:
        """Stop the server once no other process in this data directory uses it.

        Args:
            immediate: stop it at once, as a crash would (``pg_ctl -m immediate``):
                no shutdown checkpoint, so the next start recovers from the WAL, and
                a commit that did not wait for the disk may be gone.
        """
        if self._server is None:
            return
        server, self._server = self._server, None
        if immediate:
            # What pg_ctl -m immediate sends. Signalled here rather than through pg_ctl,
            # which runs as the server's own user and may not reach the data directory.
            _quit_and_wait(server.get_postmaster_info().pid)
        server.cleanup()

    def url(self, database: str = "postgres") -> str:
        """Return a SQLAlchemy URL for ``database`` on this server."""
        if self._server is None:
            raise ConnectionFailed("embedded postgres is not running; call start() first")
        info = self._server.get_postmaster_info()
        port = f"&port={info.port}" if info.port else ""
        return f"postgresql+psycopg2://postgres@/{database}?host={info.socket_dir}{port}"

    def create_database(self, name: str, *, template: Optional[str] = None, drop_existing: bool = False) -> str:
        """Create a database (optionally cloned from ``template``) and return its URL."""
        create_database_on(self.url(), name, template=template, drop_existing=drop_existing)
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, closing its connections first."""
        drop_database_on(self.url(), name)

    def __enter__(self) -> "EmbeddedPostgres":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def create_database_on(
    admin_url: Any, name: str, *, template: Optional[str] = None, drop_existing: bool = False,
) -> None:
    """Create database ``name`` (a copy of ``template`` when given) on the server of ``admin_url``.

    The names are quoted identifiers (CREATE DATABASE takes no bound parameters).
    """
    admin = sqlalchemy.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sqlalchemy.pool.NullPool)
    quote = admin.dialect.identifier_preparer.quote
    try:
        with admin.connect() as conn:
            if drop_existing:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quote(name)} WITH (FORCE)")
            clause = f" TEMPLATE {quote(template)}" if template else ""
            conn.exec_driver_sql(f"CREATE DATABASE {quote(name)}{clause}")
    finally:
        admin.dispose()


def drop_database_on(admin_url: Any, name: str) -> None:
    """Drop database ``name`` on the server of ``admin_url``, closing its connections first."""
    admin = sqlalchemy.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sqlalchemy.pool.NullPool)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {admin.dialect.identifier_preparer.quote(name)} WITH (FORCE)")
    finally:
        admin.dispose()


def _quit_and_wait(pid: int) -> None:
    """Send the postmaster SIGQUIT (an immediate shutdown) and wait until it is gone.

    It is not this process's child (pg_ctl started it), so it is watched, not reaped.
    """
    os.kill(pid, signal.SIGQUIT)
    deadline = time.monotonic() + _IMMEDIATE_STOP_SECONDS
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise ConnectionFailed(f"the embedded PostgreSQL (pid {pid}) did not stop within {_IMMEDIATE_STOP_SECONDS} s")
