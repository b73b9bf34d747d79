"""`runledger-sync worker` started before its database answers: it waits (and says so), then works."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Iterator

import pytest
from sqlalchemy.engine import make_url

import runledger_sync as rl
from tests.faults.harness import upstream_address
from tests.support import scalar, wait_until

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRET = "wait-secret-5f2c"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LateProxy:
    """A TCP proxy to the real server on ``port``, which accepts nothing until :meth:`open` (the port is closed)."""

    def __init__(self, target: tuple[int, Any]) -> None:
        self.family, self.target = target
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._pipes: list[threading.Thread] = []

    def open(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.socket(self.family, socket.SOCK_STREAM)
            upstream.connect(self.target)
            self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                pipe = threading.Thread(target=self._pipe, args=(source, sink), daemon=True)
                self._pipes.append(pipe)
                pipe.start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed.set()
        if self._listener is not None:
            self._listener.close()
        for end in self._sockets:
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for pipe in self._pipes:
            pipe.join(5)
        for end in self._sockets:
            end.close()


def through(url: str, port: int) -> str:
    """``url`` with a password (which no log line may show) and another port."""
    parsed = make_url(url)
    # The embedded server's URL names its socket directory in the query, which would win over the host.
    query = {key: value for key, value in parsed.query.items() if key not in ("host", "port")}
    return parsed.set(port=port, host="127.0.0.1", password=SECRET, query=query).render_as_string(hide_password=False)


def worker(url: str, *options: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "runledger_sync.cli", "--database-url", url, "worker", "--app", "tests.cli_app:registry",
         "--poll-interval-ms", "20", "--log-format", "json", *options],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


@pytest.fixture
def proxy(fresh_database) -> Iterator[LateProxy]:
    late = LateProxy(upstream_address(fresh_database))
    yield late
    late.close()


def test_a_worker_started_before_its_database_answers_waits_logging_then_runs_jobs(engine, fresh_database, proxy):
    process = worker(through(fresh_database, proxy.port))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    try:
        waiting = wait_until(lambda: [json.loads(line) for line in list(lines)
                                      if '"waiting for the database"' in line] or process.poll() is not None,
                             timeout=30)
        assert process.poll() is None, "".join(lines)
        time.sleep(3)  # the database is down for these seconds: the worker must keep waiting through them
        assert process.poll() is None, "".join(lines)
        proxy.open()
        wait_until(lambda: any('"database answered"' in line for line in list(lines)) or process.poll() is not None,
                   timeout=30)
        # Once it answers, the worker syncs the app's definitions itself; enqueue once they exist.
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM job_definitions WHERE job_type = 'cli.echo'") == 1
                   or process.poll() is not None, timeout=30)
        assert process.poll() is None, "".join(lines)
        job = rl.enqueue(engine, "cli.echo", {"say": "late"})
        done = wait_until(lambda: rl.get_job(engine, job.id).status is rl.JobStatus.SUCCEEDED, timeout=30)
        assert done
    finally:
        process.kill()
        process.wait(10)
        reader.join(5)
        process.stderr.close()
    record = waiting[0]
    assert f":{proxy.port}/" in record["database"] and SECRET not in record["database"]
    assert "refused" in record["error"].lower() or "connect" in record["error"].lower()
    assert "\n" not in record["error"] and not any(SECRET in line for line in lines)


def test_wait_for_database_seconds_ends_with_a_coded_error_after_that_long(fresh_database, proxy):
    started = time.monotonic()
    process = worker(through(fresh_database, proxy.port), "--wait-for-database", "2")
    _, stderr = process.communicate(timeout=60)
    took = time.monotonic() - started
    assert process.returncode == 1, stderr
    assert "error: db.wait_timeout: the database did not answer within 2 s" in stderr
    assert 2 <= took < 15, took
    assert SECRET not in stderr


def test_wait_for_database_zero_fails_at_once(fresh_database, proxy):
    process = worker(through(fresh_database, proxy.port), "--wait-for-database", "0")
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1 and "error: db.wait_timeout: the database did not answer" in stderr
    assert "waiting for the database" not in stderr


@pytest.mark.parametrize("value", ["-1", "soon", "nan"])
def test_wait_for_database_refuses_a_value_that_is_not_seconds(fresh_database, value):
    process = worker(fresh_database, "--wait-for-database", value)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2 and "--wait-for-database" in stderr
