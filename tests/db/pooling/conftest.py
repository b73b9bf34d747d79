"""A real PgBouncer (transaction pooling, pool size 4) in front of the test PostgreSQL, once per run.

PgBouncer comes from the system packages (``.ci/run`` installs it). Under CI
(``CI=true``) a missing PgBouncer fails these tests; elsewhere they are skipped
and say why. PgBouncer refuses to run as root, so as root it runs as the owner
of the embedded server's socket directory (the only user that may reach it),
or as ``postgres`` or ``nobody`` for a server reached over TCP.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy.engine import make_url

PGBOUNCER_PATHS = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")
POOL_SIZE = 4
START_TIMEOUT_SECONDS = 15.0


class PgBouncer:
    """One pgbouncer process and how to reach a database through it."""

    def __init__(self, process: subprocess.Popen, port: int, directory: Path, pool_mode: str) -> None:
        self.process = process
        self.port = port
        self.directory = directory
        self.pool_mode = pool_mode

    def url(self, direct_url: str) -> str:
        """The URL of ``direct_url``'s database, through this PgBouncer."""
        database = make_url(direct_url).database
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{database}"

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""


def find_pgbouncer() -> str | None:
    return shutil.which("pgbouncer") or next((path for path in PGBOUNCER_PATHS if os.access(path, os.X_OK)), None)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _backend(direct_url: str) -> tuple[str, int]:
    url = make_url(direct_url)
    host = url.query.get("host") or url.host or "127.0.0.1"
    port = int(url.query.get("port") or url.port or 5432)
    return str(host), port


def _run_as(host: str) -> str | None:
    """The user pgbouncer switches to when we are root (it refuses to run as root)."""
    if os.geteuid() != 0:
        return None
    if host.startswith("/"):
        owner = os.stat(host).st_uid
        if owner != 0:
            return pwd.getpwuid(owner).pw_name
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    pytest.fail("running as root, and no unprivileged user (postgres, nobody) to run pgbouncer as")


def start_pgbouncer(executable: str, direct_url: str, pool_mode: str) -> PgBouncer:
    host, backend_port = _backend(direct_url)
    port = _free_port()
    directory = Path(tempfile.mkdtemp(prefix=f"rl-pgbouncer-{pool_mode}-"))
    user = _run_as(host)
    # Any database name is passed through to the server as postgres; no password.
    (directory / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={host} port={backend_port} user=postgres\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        "auth_type = any\n"
        f"pool_mode = {pool_mode}\ndefault_pool_size = {POOL_SIZE}\nmax_client_conn = 500\n"
        f"logfile = {directory / 'pgbouncer.log'}\npidfile = {directory / 'pgbouncer.pid'}\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
    )
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(directory, entry.pw_uid, entry.pw_gid)
        os.chown(directory / "pgbouncer.ini", entry.pw_uid, entry.pw_gid)
    command = [executable, *(["-u", user] if user else []), str(directory / "pgbouncer.ini")]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    bouncer = PgBouncer(process, port, directory, pool_mode)
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            stop_pgbouncer(bouncer)
            pytest.fail(f"pgbouncer exited with {process.returncode}: {process.stderr.read()}\n{bouncer.log()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return bouncer
        except OSError:
            time.sleep(0.05)
    stop_pgbouncer(bouncer)
    pytest.fail(f"pgbouncer did not listen on port {port} within {START_TIMEOUT_SECONDS} s\n{bouncer.log()}")


def stop_pgbouncer(bouncer: PgBouncer) -> None:
    if bouncer.process.poll() is None:
        bouncer.process.terminate()
        try:
            bouncer.process.wait(10)
        except subprocess.TimeoutExpired:
            bouncer.process.kill()
            bouncer.process.wait(10)
    if bouncer.process.stderr is not None:
        bouncer.process.stderr.close()
    shutil.rmtree(bouncer.directory, ignore_errors=True)


@pytest.fixture(scope="session")
def pgbouncer_executable() -> str:
    executable = find_pgbouncer()
    if executable is None:
        reason = "pgbouncer is not installed (apt-get install -y pgbouncer; .ci/run installs it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}: the PgBouncer tests must run in CI")
        pytest.skip(reason)
    return executable


@pytest.fixture(scope="session")
def pgbouncer(pgbouncer_executable, pg_server) -> Iterator[PgBouncer]:
    """PgBouncer in transaction pooling mode, pool size 4, in front of the test server."""
    bouncer = start_pgbouncer(pgbouncer_executable, pg_server.url(), "transaction")
    try:
        yield bouncer
    finally:
        stop_pgbouncer(bouncer)
