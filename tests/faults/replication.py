"""A primary and a streaming standby on this machine, built with PostgreSQL's own programs.

``initdb`` makes the primary, ``pg_basebackup -R`` clones the standby from it
(streaming directly, or through a TCP relay that can hold the stream back), and
``pg_ctl`` starts, kills (``stop -m immediate``, a crash: no shutdown checkpoint, no
last WAL sent) and promotes them. Both listen on 127.0.0.1 on free ports, with their
sockets and data in one scratch directory. Run as root, the servers run as the
``postgres`` user (PostgreSQL refuses root). :func:`binaries` says why a machine
cannot run them, for a skip.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import sqlalchemy

from tests.faults.harness import TcpProxy

#: ``synchronous_standby_names`` names the standby by the application_name it connects with.
STANDBY_NAME = "standby1"
SERVER_USER = "postgres"


def binaries() -> tuple[Optional[Path], str]:
    """The directory of initdb, pg_basebackup, pg_ctl (newest version first), or None and why not."""
    for directory in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version, reverse=True):
        if all(os.access(os.path.join(directory, name), os.X_OK) for name in ("initdb", "pg_basebackup", "pg_ctl")):
            if os.geteuid() == 0 and not _server_user():
                return None, f"running as root and there is no {SERVER_USER!r} user to run PostgreSQL as"
            return Path(directory), ""
    return None, "PostgreSQL's server programs (initdb, pg_basebackup, pg_ctl under /usr/lib/postgresql/*/bin) are not installed"


def _version(directory: str) -> float:
    try:
        return float(Path(directory).parent.name)
    except ValueError:
        return 0.0


def _server_user() -> Optional[pwd.struct_passwd]:
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        return None


def primary_settings(synchronous: bool) -> list[str]:
    """The primary's replication settings: the deployment guide's, synchronous or not."""
    if synchronous:
        # on: a commit returns once the standby has flushed it (remote_apply: once it is visible there).
        return [f"synchronous_standby_names = 'FIRST 1 ({STANDBY_NAME})'", "synchronous_commit = on"]
    return ["synchronous_standby_names = ''", "synchronous_commit = on"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ReplicatedPair:
    """A primary and one streaming standby; ``synchronous`` makes every commit wait for the standby's flush."""

    def __init__(self, bindir: Path, *, synchronous: bool, relayed: bool = False) -> None:
        """``relayed``: the standby streams through a TCP relay, which :meth:`hold_replication` can stall."""
        self.bindir = bindir
        self.synchronous = synchronous
        self.relay: Optional[TcpProxy] = None
        self._relayed = relayed
        self.scratch = Path(tempfile.mkdtemp(prefix="rl-failover-", dir="/tmp"))
        self.primary_dir = self.scratch / "primary"
        self.standby_dir = self.scratch / "standby"
        self.primary_port = free_port()
        self.standby_port = free_port()
        self._user = _server_user() if os.geteuid() == 0 else None
        if self._user is not None:
            os.chown(self.scratch, self._user.pw_uid, self._user.pw_gid)

    # -- URLs -------------------------------------------------------------------------

    def multi_host_url(self, database: str) -> str:
        """libpq's netloc form: both servers, the writable one chosen at each connection."""
        return (f"postgresql://{SERVER_USER}@127.0.0.1:{self.primary_port},127.0.0.1:{self.standby_port}/{database}"
                "?target_session_attrs=read-write&connect_timeout=2")

    def multi_host_query_url(self, database: str) -> str:
        """The same servers in the query form plain SQLAlchemy parses too."""
        return (f"postgresql://{SERVER_USER}@/{database}?host=127.0.0.1,127.0.0.1"
                f"&port={self.primary_port},{self.standby_port}&target_session_attrs=read-write&connect_timeout=2")

    def url(self, port: int, database: str = "postgres") -> str:
        return f"postgresql+psycopg2://{SERVER_USER}@127.0.0.1:{port}/{database}?connect_timeout=2"

    # -- life -------------------------------------------------------------------------

    def start(self) -> "ReplicatedPair":
        self._run("initdb", "-D", str(self.primary_dir), "-U", SERVER_USER, "--auth=trust", "--no-sync",
                  "--no-instructions")
        self._configure(self.primary_dir, self.primary_port, [
            "wal_level = replica", "max_wal_senders = 4", "max_replication_slots = 4", "wal_keep_size = '256MB'",
            *primary_settings(self.synchronous),
        ])
        self._ctl("start", self.primary_dir)
        self._run("pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary_port), "-U", SERVER_USER,
                  "-D", str(self.standby_dir), "-R", "-X", "stream", "--checkpoint=fast", "--no-sync")
        if self._relayed:
            self.relay = TcpProxy(self.url(self.primary_port))
        upstream = self.relay.port if self.relay is not None else self.primary_port
        self._configure(self.standby_dir, self.standby_port, [
            "hot_standby = on",
            f"primary_conninfo = 'host=127.0.0.1 port={upstream} user={SERVER_USER}"
            f" application_name={STANDBY_NAME}'",
            # Promoted, it takes writes at once; with no standby of its own it must not wait for one.
            "synchronous_standby_names = ''",
        ])
        self._ctl("start", self.standby_dir)
        self.wait_streaming()
        return self

    def wait_streaming(self, timeout: float = 30.0) -> None:
        """Wait until the primary streams to the standby (as its synchronous standby, when synchronous)."""
        wanted = "sync" if self.synchronous else "async"
        engine = sqlalchemy.create_engine(self.url(self.primary_port), poolclass=sqlalchemy.pool.NullPool)
        deadline = time.monotonic() + timeout
        try:
            while True:
                with engine.connect() as conn:
                    states = conn.exec_driver_sql(
                        "SELECT sync_state FROM pg_stat_replication WHERE application_name = %(n)s"
                        " AND state = 'streaming'", {"n": STANDBY_NAME}).scalars().all()
                if wanted in states:
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"the standby is not streaming ({wanted}) after {timeout} s: {states}")
                time.sleep(0.1)
        finally:
            engine.dispose()

    def kill_primary(self) -> None:
        """``pg_ctl stop -m immediate``: the primary's processes quit at once, as in a crash.

        WAL the relay held back (:meth:`hold_replication`) is dropped: the standby never gets it.
        """
        self._ctl("stop", self.primary_dir, "-m", "immediate")
        if self.relay is not None:
            self.relay.sever()

    def hold_replication(self) -> None:
        """Stall the stream to the standby, as a slow or congested network between them does."""
        assert self.relay is not None, "build the pair with relayed=True"
        self.relay.cut()

    def promote_standby(self) -> None:
        """``pg_ctl promote``, returning once the standby takes writes."""
        self._ctl("promote", self.standby_dir)

    def stop(self) -> None:
        if self.relay is not None:
            self.relay.close()
        for directory in (self.primary_dir, self.standby_dir):
            if (directory / "postmaster.pid").exists():
                try:
                    self._ctl("stop", directory, "-m", "immediate")
                except subprocess.CalledProcessError:
                    pass
        shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self) -> "ReplicatedPair":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- helpers ----------------------------------------------------------------------

    def _configure(self, data_dir: Path, port: int, lines: list[str]) -> None:
        common = [
            f"port = {port}", "listen_addresses = '127.0.0.1'", f"unix_socket_directories = '{self.scratch}'",
            "max_connections = 100", "shared_buffers = '32MB'", "fsync = off", "full_page_writes = off",
            "logging_collector = off",
        ]
        with open(data_dir / "postgresql.auto.conf", "a", encoding="utf-8") as conf:
            conf.write("\n".join(common + lines) + "\n")

    def _ctl(self, action: str, data_dir: Path, *extra: str) -> None:
        self._run("pg_ctl", action, "-D", str(data_dir), "-w", "-t", "60", "-l", str(data_dir.with_suffix(".log")),
                  *extra)

    def _run(self, program: str, *args: str) -> None:
        options: dict[str, Any] = {}
        if self._user is not None:
            options = {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}
        subprocess.run([str(self.bindir / program), *args], check=True, capture_output=True, text=True, timeout=120,
                       cwd=str(self.scratch), **options)

    def log_tail(self, which: str = "standby", lines: int = 20) -> str:
        path = (self.standby_dir if which == "standby" else self.primary_dir).with_suffix(".log")
        try:
            return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
        except OSError:
            return ""
