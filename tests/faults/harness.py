"""Machinery the fault scenarios share: worker processes, a TCP proxy that can cut the network, queries.

Nothing here fakes the queue: workers are real processes running
:mod:`tests.faults.fault_worker`, and every figure is read back from the
database's own rows (``job_queue``, ``job_attempts``, ``job_events``) and the
handlers' side tables.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

import sqlalchemy
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tests.faults.fault_worker import SIDE_TABLES_DDL, WorkerSettings

REPO_ROOT = Path(__file__).resolve().parents[2]


# -- worker processes ------------------------------------------------------------------


class WorkerProcess:
    """One ``fault_worker`` child; its stdout events and stderr log lines are collected by threads."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.fault_worker", settings.to_json()],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO_ROOT),
        )
        self.events: list[dict] = []
        self.log_lines: list[str] = []
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.events, True), daemon=True),
            threading.Thread(target=self._read, args=(self.process.stderr, self.log_lines, False), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @property
    def worker_id(self) -> str:
        return self.settings.worker_id

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self, stream: Any, into: list, parse: bool) -> None:
        for line in stream:
            if parse:
                try:
                    item: Any = json.loads(line)
                except ValueError:
                    continue
            else:
                item = line
            with self._changed:
                into.append(item)
                self._changed.notify_all()

    def wait_event(self, predicate: Callable[[dict], bool], timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for event in self.events:
                    if predicate(event):
                        return event
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.process.poll() is not None and not self._readers[0].is_alive():
                    raise AssertionError(
                        f"worker {self.worker_id} did not report the expected event within {timeout} s; "
                        f"exit={self.process.poll()} events={self.events[-5:]} log tail={self.log_tail()}"
                    )
                self._changed.wait(min(remaining, 0.1))

    def wait_ready(self, timeout: float = 30.0) -> None:
        self.wait_event(lambda event: event.get("event") == "ready", timeout)

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 10) -> str:
        with self._changed:
            return "".join(self.log_lines[-lines:])

    def logged(self, message: str) -> int:
        count = 0
        with self._changed:
            for line in self.log_lines:
                try:
                    if json.loads(line).get("message") == message:
                        count += 1
                except ValueError:
                    continue
        return count

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self, timeout: float = 15.0) -> Optional[int]:
        """Drain with SIGTERM, then SIGKILL if that takes longer than ``timeout``; return the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        for reader in self._readers:
            reader.join(5)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        return self.process.returncode


class WorkerFleet:
    """Every worker process a scenario started, so all of them are stopped however it ends."""

    def __init__(self) -> None:
        self.started: list[WorkerProcess] = []
        self._generation = 0

    def start(self, settings: WorkerSettings, *, ready: bool = True) -> WorkerProcess:
        self._generation += 1
        worker = WorkerProcess(replace(settings, worker_id=f"{settings.worker_id}-g{self._generation}"))
        self.started.append(worker)
        if ready:
            worker.wait_ready()
        return worker

    def stop_all(self) -> None:
        for worker in self.started:
            if worker.alive():
                worker.process.send_signal(signal.SIGTERM)
        for worker in self.started:
            worker.stop()

    def __enter__(self) -> "WorkerFleet":
        return self

    def __exit__(self, *exc_info: object) -> None:
        for worker in self.started:
            if worker.alive() and exc_info[0] is not None:
                worker.kill()  # a failed scenario does not wait for drains
        self.stop_all()


# -- the database ----------------------------------------------------------------------


class Db:
    """Plain queries on the scenario database, always with bound parameters."""

    def __init__(self, engine: sqlalchemy.Engine) -> None:
        self.engine = engine

    def rows(self, sql: str, **params: Any) -> list[Any]:
        with self.engine.connect() as conn:
            return conn.execute(text(sql), params).all()

    def scalar(self, sql: str, **params: Any) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(text(sql), params).scalar()

    def execute(self, sql: str, **params: Any) -> None:
        with self.engine.begin() as conn:
            conn.execute(text(sql), params)

    def now(self) -> Any:
        return self.scalar("SELECT clock_timestamp()")

    def create_side_tables(self) -> None:
        with self.engine.begin() as conn:
            for ddl in SIDE_TABLES_DDL:
                conn.execute(text(ddl))

    def status_counts(self) -> dict[str, int]:
        return dict(self.rows("SELECT status, count(*) FROM job_queue GROUP BY status"))

    def count_status(self, status: str, job_type: Optional[str] = None) -> int:
        return self.scalar(
            "SELECT count(*) FROM job_queue WHERE status = :s AND (CAST(:t AS text) IS NULL OR job_type = :t)",
            s=status, t=job_type,
        )

    def unfinished(self, job_type: Optional[str] = None) -> int:
        return self.scalar(
            "SELECT count(*) FROM job_queue WHERE status IN ('PENDING', 'LEASED')"
            " AND (CAST(:t AS text) IS NULL OR job_type = :t)",
            t=job_type,
        )

    def duplicate_effects(self) -> int:
        """Effects beyond the first per job: allowed (delivery is at least once), but reported."""
        return self.scalar(
            "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM fault_effects GROUP BY job_id) e"
        )

    def jobs_without_effect(self, job_type: str) -> int:
        return self.scalar(
            "SELECT count(*) FROM job_queue q WHERE q.job_type = :t"
            " AND NOT EXISTS (SELECT 1 FROM fault_effects e WHERE e.job_id = q.id)",
            t=job_type,
        )

    def duplicate_completions(self) -> int:
        """Outcomes written more than once for one job: SUCCEEDED events, or successful attempt rows."""
        events = self.scalar(
            "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM job_events"
            " WHERE event_type IN ('SUCCEEDED', 'DEAD_LETTERED') GROUP BY job_id, run_number) e"
        )
        attempts = self.scalar(
            "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM job_attempts"
            " WHERE finished_at IS NOT NULL AND outcome IS NULL GROUP BY job_id, run_number) a"
        )
        # Each attempt ends once: a FAILED event per finished failed attempt, never two.
        failures = self.scalar(
            "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM job_events"
            " WHERE event_type = 'FAILED' GROUP BY job_id, run_number, attempt) f"
        )
        return int(events) + int(attempts) + int(failures)

    def overlapping_live_claims(self) -> int:
        """Pairs of attempts of one job, by different workers, whose lease periods overlap.

        An attempt's lease runs from ``leased_at`` to ``finished_at`` (its outcome, or
        the reaper's LEASE_EXPIRED); one never finished counts as still live.
        """
        return self.scalar(
            "SELECT count(*) FROM job_attempts a JOIN job_attempts b"
            " ON a.job_id = b.job_id AND a.id < b.id AND a.worker_id <> b.worker_id"
            " WHERE a.leased_at < coalesce(b.finished_at, 'infinity')"
            " AND b.leased_at < coalesce(a.finished_at, 'infinity')"
        )

    def success_rows_per_job_ok(self) -> bool:
        """Every SUCCEEDED job row has exactly one successful attempt row in its run."""
        return self.scalar(
            "SELECT count(*) FROM job_queue q WHERE q.status = 'SUCCEEDED' AND (SELECT count(*) FROM job_attempts a"
            " WHERE a.job_id = q.id AND a.run_number = q.run_number AND a.finished_at IS NOT NULL"
            " AND a.outcome IS NULL) <> 1"
        ) == 0

    def backend_pids(self, exclude_own: bool = True) -> list[int]:
        return [row[0] for row in self.rows(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND backend_type = 'client backend' AND (NOT :ex OR pid <> pg_backend_pid())",
            ex=exclude_own,
        )]


def max_overlap(intervals: list[tuple[Any, Any]]) -> int:
    """The most intervals open at one instant (an end and a start at the same instant do not overlap)."""
    points = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
                    key=lambda point: (point[0], point[1]))
    open_now = peak = 0
    for _, step in points:
        open_now += step
        peak = max(peak, open_now)
    return peak


# -- a TCP proxy that can cut the network ------------------------------------------------


def upstream_address(url: str) -> tuple[int, Any]:
    """The (family, address) a libpq URL connects to: its unix socket file or its TCP host and port."""
    parsed = make_url(url)
    host = parsed.query.get("host") or parsed.host or "localhost"
    if isinstance(host, tuple):
        host = host[0]
    port = parsed.port or int(parsed.query.get("port") or 5432)
    if host.startswith("/"):
        return socket.AF_UNIX, os.path.join(host, f".s.PGSQL.{port}")
    return socket.AF_INET, (host, port)


class TcpProxy:
    """Forward 127.0.0.1:<port> to a PostgreSQL server; :meth:`cut` black-holes every byte until :meth:`heal`.

    A cut holds data back instead of dropping it, like a partition TCP rides out:
    nothing arrives while it lasts, and everything arrives, late, after it heals.
    New connections are accepted during a cut but reach the server only after it.
    :meth:`refuse` is the other kind of outage, a server that is down: every open
    connection is reset and new ones are closed at once, until :meth:`heal`.
    """

    def __init__(self, upstream_url: str) -> None:
        self.family, self.address = upstream_address(upstream_url)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        self._closing = threading.Event()
        self._refusing = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.connections = 0
        self._acceptor = threading.Thread(target=self._accept, name="fault-proxy-accept", daemon=True)
        self._acceptor.start()

    def url_for(self, url: str) -> str:
        parsed = make_url(url)
        query = {key: value for key, value in parsed.query.items() if key not in ("host", "port")}
        return parsed.set(host="127.0.0.1", port=self.port, query=query).render_as_string(hide_password=False)

    def cut(self) -> None:
        self._open.clear()

    def refuse(self) -> None:
        self._refusing.set()
        self._close_all()

    def refuse_new(self) -> None:
        """A server with no connection slot left: open connections go on, new ones are closed at once."""
        self._refusing.set()

    def heal(self) -> None:
        self._refusing.clear()
        self._open.set()

    @property
    def is_cut(self) -> bool:
        return not self._open.is_set()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self._open.wait()
        if self._refusing.is_set():
            client.close()
            return
        server = socket.socket(self.family, socket.SOCK_STREAM)
        try:
            server.connect(self.address)
        except OSError:
            client.close()
            return
        with self._lock:
            self._sockets += [client, server]
            self.connections += 1
        for source, target in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                while not self._open.wait(0.1):
                    if self._closing.is_set():
                        return
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def sever(self) -> None:
        """Close every connection at once, dropping whatever a :meth:`cut` held back (it never arrives)."""
        self._closing.set()
        self._close_all()
        self._open.set()

    def close(self) -> None:
        self._closing.set()
        self._open.set()
        self.listener.close()
        self._close_all()

    def _close_all(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
