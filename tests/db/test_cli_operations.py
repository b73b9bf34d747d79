"""The operations commands: worker --metrics-port (a real process), health, top --once."""

from __future__ import annotations

import json
import logging
import os
import pty
import queue
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.metrics import registry_for, serve_metrics
from tests.handlers import fast_config
from tests.support import define, wait_until

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNREACHABLE_URL = "postgresql://nobody@127.0.0.1:1/nothing"


class LogLines:
    """The JSON log lines of a process's stderr, read on a thread so a test can wait for one."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        self.reader = threading.Thread(target=self._read, args=(process.stderr,), daemon=True)
        self.reader.start()

    def close(self) -> None:
        """Stop the process if it still runs, then close its pipes once the reader has drained them."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.reader.join(10)
        self.process.stdout.close()
        self.process.stderr.close()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.put(line)

    def wait_for(self, message: str, timeout: float = 30) -> dict:
        while True:
            line = self.lines.get(timeout=timeout)
            self.seen.append(line)
            if line.startswith("{") and json.loads(line).get("message") == message:
                return json.loads(line)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - a local test server
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _samples(body: bytes) -> dict[tuple[str, tuple], float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(body.decode()) for sample in family.samples}


def test_worker_metrics_port_serves_metrics_and_health_over_http(engine, fresh_database):
    process = subprocess.Popen(
        [sys.executable, "-m", "runledger_sync.cli", "--database-url", fresh_database, "worker",
         "--app", "tests.cli_app:registry", "--poll-interval-ms", "20", "--metrics-port", "0"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    logs = LogLines(process)
    try:
        served = logs.wait_for("metrics served")
        port = served["port"]
        logs.wait_for("supervisor started")
        job = rl.enqueue(engine, "cli.echo", {"say": "hi"})
        wait_until(lambda: rl.get_job(engine, job.id).status is rl.JobStatus.SUCCEEDED, timeout=30)
        base = f"http://127.0.0.1:{port}"

        succeeded = ("runledger_jobs_total", (("job_type", "cli.echo"), ("outcome", "succeeded")))
        # The counter moves just after the success commits, on the job's own thread.
        status, body = wait_until(lambda: (lambda got: got if succeeded in _samples(got[1]) else None)(
            _get(f"{base}/metrics")))
        samples = _samples(body)
        health_status, health_body = _get(f"{base}/health")
        ready_status, ready_body = _get(f"{base}/readyz")
        missing_status, _ = _get(f"{base}/nothing")

        assert status == 200
        assert samples[("runledger_queue_up", ())] == 1
        assert samples[succeeded] == 1
        assert samples[("runledger_queue_jobs", (("job_type", "cli.echo"), ("status", "PENDING")))] == 0
        health = json.loads(health_body)
        assert health_status == 200 and health["healthy"] and health["live"]
        assert ready_status == 200 and json.loads(ready_body)["ready"] and json.loads(ready_body)["database_reachable"]
        assert {name for name, loop in health["loops"].items() if loop["alive"]} >= {"worker", "reaper", "scheduler"}
        assert health["loops"]["worker"]["last_success_at"] is not None
        assert missing_status == 404
        # No --metrics-host: loopback only, since the port asks nobody who they are.
        assert served["host"] == "127.0.0.1"
        outside = _non_loopback_address()
        if outside is not None:
            with pytest.raises(OSError):
                socket.create_connection((outside, port), timeout=2).close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        logs.close()


def _non_loopback_address():
    """This machine's address on its default route (no packet is sent), or None when it has only loopback."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


def test_worker_refuses_a_metrics_port_out_of_range(fresh_database, capsys):
    code = rl_cli(["--database-url", fresh_database, "worker", "--app", "tests.cli_app:registry",
                   "--metrics-port", "70000"])

    assert code == 2
    assert "error: config.invalid: --metrics-port must be a port number from 0 to 65535, got 70000" in \
        capsys.readouterr().err


@pytest.fixture
def restore_logging():
    """Remove the handlers an in-process worker command installs (they write to a captured stream)."""
    logger = logging.getLogger("runledger_sync")
    handlers, level = list(logger.handlers), logger.level
    yield
    for handler in list(logger.handlers):
        if handler not in handlers:
            logger.removeHandler(handler)
            handler.close()
    logger.setLevel(level)


def test_worker_refuses_a_metrics_port_already_taken(engine, fresh_database, capsys, restore_logging):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = rl_cli(["--database-url", fresh_database, "worker", "--app", "tests.cli_app:registry",
                       "--metrics-port", str(port), "--metrics-host", "127.0.0.1"])

    err = capsys.readouterr().err
    assert code == 2
    assert f"error: config.invalid: --metrics-port {port} cannot be served on '127.0.0.1': Address already in use" in err
    assert rl.count_jobs(engine) == 0


def rl_cli(argv: list[str]) -> int:
    from runledger_sync import cli

    return cli.main(argv)


# -- health ---------------------------------------------------------------------------


def test_health_exits_0_on_a_healthy_database(run):
    code, out, _ = run("health")

    assert code == 0
    assert json.loads(out) == {"healthy": True, "database_reachable": True, "schema_at_head": True}


def test_health_exits_1_when_the_database_is_unreachable(capsys):
    code = rl_cli(["--database-url", UNREACHABLE_URL, "health", "--timeout", "2"])

    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert report["healthy"] is False and report["database_reachable"] is False
    assert "127.0.0.1" in report["error"]


def test_health_never_prints_the_password(capsys):
    from tests.db.test_security_secrets import TRICKY_PASSWORD, secret_spellings, unreachable_url

    code = rl_cli(["--database-url", unreachable_url(TRICKY_PASSWORD), "health", "--timeout", "2"])

    out, err = capsys.readouterr()
    assert code == 1 and json.loads(out)["error"]
    for secret in secret_spellings(TRICKY_PASSWORD):
        assert secret not in out + err


def test_health_exits_1_on_a_database_without_the_schema(empty_database, capsys):
    code = rl_cli(["--database-url", empty_database, "health"])

    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert (report["database_reachable"], report["schema_at_head"]) == (True, False)
    assert report["error"].startswith("db.schema_mismatch")


def test_health_exits_1_on_a_url_that_is_not_postgresql(capsys):
    code = rl_cli(["--database-url", "mysql://x@y/z", "health"])

    assert code == 1
    assert json.loads(capsys.readouterr().out)["error"].startswith("config.invalid")


def test_health_url_asks_a_running_supervisor(engine, capsys):
    jobs = rl.JobRegistry()
    jobs.job("health.noop")(lambda ctx, payload: None)
    jobs.sync_definitions(engine)
    supervisor = rl.Supervisor(engine, jobs, fast_config())
    server = serve_metrics(registry_for(engine), 0, host="127.0.0.1", health=supervisor.health)
    try:
        url = f"http://127.0.0.1:{server.port}/health"
        assert rl_cli(["health", "--url", url]) == 1  # not started: no loop alive
        stopped = json.loads(capsys.readouterr().out)
        supervisor.start()
        wait_until(lambda: supervisor.health().loops["worker"].last_success_at is not None)
        assert rl_cli(["health", "--url", url]) == 0
        started = json.loads(capsys.readouterr().out)
    finally:
        supervisor.stop()
        server.close()

    assert stopped["status"] == 503 and stopped["worker"]["healthy"] is False
    assert started["healthy"] and started["worker"]["loops"]["worker"]["alive"]


def test_health_url_exits_1_when_nothing_answers(capsys):
    assert rl_cli(["health", "--url", "http://127.0.0.1:1/health", "--timeout", "2"]) == 1
    assert json.loads(capsys.readouterr().out)["error"].startswith("URLError")


# -- top ---------------------------------------------------------------------------------


def test_top_once_prints_counts_that_match_the_rows(engine, run):
    define(engine, "top.a")
    define(engine, "top.b")
    for _ in range(5):
        rl.enqueue(engine, "top.a", {})
    for _ in range(2):
        rl.enqueue(engine, "top.b", {})
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET status = 'SUCCEEDED', stage = 'completed', finished_at = now() "
                          "WHERE id IN (SELECT id FROM job_queue WHERE job_type = 'top.a' LIMIT 3)"))
        conn.execute(text("UPDATE job_queue SET status = 'CANCELED' WHERE job_type = 'top.b'"))
        expected = {(row.job_type, row.status): row.n for row in conn.execute(text(
            "SELECT job_type, status, count(*) AS n FROM job_queue GROUP BY job_type, status"))}

    code, out, _ = run("top", "--once")

    assert code == 0
    statuses = [status.value for status in rl.JobStatus]
    header = _cells(next(line for line in out.splitlines() if "PENDING" in line and "job type" in line))
    rows = {cells[0]: cells for cells in map(_cells, out.splitlines()) if cells and cells[0] in ("top.a", "top.b")}
    for job_type in ("top.a", "top.b"):
        shown = dict(zip(header, rows[job_type], strict=True))
        assert {status: int(shown[status]) for status in statuses} == {
            status: expected.get((job_type, status), 0) for status in statuses}
    assert int(dict(zip(header, rows["top.a"], strict=True))["due"]) == 2
    totals_header = next(index for index, line in enumerate(out.splitlines()) if line.startswith("┃ PENDING"))
    totals = _cells(out.splitlines()[totals_header + 2])
    assert [int(cell) for cell in totals] == [sum(n for (_, s), n in expected.items() if s == status)
                                             for status in statuses]


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"[│┃]", line)[1:-1]]


def test_top_redraws_until_interrupted_and_then_exits_0(engine, fresh_database):
    define(engine, "top.a")
    rl.enqueue(engine, "top.a", {})
    # A terminal of its own: rich redraws a live view only on a terminal.
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "runledger_sync.cli", "--database-url", fresh_database, "top", "--interval", "0.2"],
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=terminal, stderr=subprocess.PIPE, text=True,
    )
    os.close(terminal)
    shown = bytearray()
    try:
        while shown.count(b"runledger-sync top") < 3 and process.poll() is None:
            ready, _, _ = select.select([controller], [], [], 30)
            assert ready, "top drew nothing for 30 s"
            shown += os.read(controller, 65536)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        os.close(controller)

    assert process.returncode == 0, err
    assert shown.count(b"runledger-sync top") >= 3 and b"top.a" in shown
