"""`runledger-sync worker --processes 2`: two spawned workers under one parent, end to end, drained by SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from sqlalchemy import text
from sqlalchemy.engine import make_url

import runledger_sync as rl
from runledger_sync import cli
from tests import process_app
from tests.support import event_types, rows, wait_until

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START_TIMEOUT = 60


class ParentProcess:
    """The worker command in a child of the test, its JSON log lines (its own and its children's) collected."""

    def __init__(self, url: str, *options: str, env: dict[str, str] | None = None) -> None:
        env = {**os.environ, process_app.URL_VARIABLE: url, **(env or {})}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "runledger_sync.cli", "--database-url", url, "worker",
             "--app", "tests.process_app:registry", "--processes", "2", "--worker-id", "cli",
             "--concurrency", "1", "--poll-interval-ms", "20", *options],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
            # A process group of its own, so a test can signal it as a terminal's Ctrl-C does.
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line)

    def records(self, message: str) -> list[dict]:
        found = []
        for line in list(self.lines):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("message") == message:
                found.append(record)
        return found

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()  # the children notice their parent is gone and drain
        self.process.wait(10)
        self._reader.join(5)
        self.process.stderr.close()


def start_two_children(engine, fresh_database, *options: str) -> "ParentProcess":
    """The app's tables, then `worker --processes 2` (and ``options``) until both children said they started."""
    with engine.begin() as conn:
        for ddl in process_app.TABLES_DDL:
            conn.execute(text(ddl))
    parent = ParentProcess(fresh_database, *options)
    try:
        wait_until(lambda: len(parent.records("worker process started")) == 2 or parent.process.poll() is not None,
                   timeout=START_TIMEOUT)
    except BaseException:
        parent.close()
        raise
    return parent


def test_worker_with_two_processes_runs_jobs_in_both_and_sigterm_drains_them_then_exits_0(engine, fresh_database):
    parent = start_two_children(engine, fresh_database)
    try:
        assert parent.process.poll() is None, "".join(parent.lines)
        blockers = [rl.enqueue(engine, "proc.block", {}) for _ in range(2)]
        # One slot per child: both blockers running means each child took one.
        wait_until(lambda: {row.worker_id for row in rows(engine, "SELECT worker_id FROM process_runs")}
                   == {"cli-p0", "cli-p1"}, timeout=START_TIMEOUT)
        # The URL reaches the children through multiprocessing's pipe, not their command line.
        database = make_url(fresh_database).database
        for started in parent.records("worker process started"):
            with open(f"/proc/{started['pid']}/cmdline", "rb") as cmdline:
                assert database.encode() not in cmdline.read()
        parent.process.send_signal(signal.SIGTERM)
        wait_until(lambda: {record.get("worker_id") for record in
                            parent.records("worker shutdown requested; draining in-flight jobs")}
                   == {"cli-p0", "cli-p1"}, timeout=30)
        late = rl.enqueue(engine, "proc.quick", {})
        assert parent.process.poll() is None  # still draining
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO process_gate VALUES (true)"))
        assert parent.process.wait(30) == 0, "".join(parent.lines)
    finally:
        parent.close()
    assert {rl.get_job(engine, job.id).status for job in blockers} == {rl.JobStatus.SUCCEEDED}
    assert event_types(engine, late.id) == []  # never claimed: no row at the default event log
    stopped = parent.records("worker process stopped")
    assert sorted((record["worker_id"], record["exit_code"]) for record in stopped) == [("cli-p0", 0), ("cli-p1", 0)]


def test_ctrl_c_drains_once_and_a_second_one_kills_the_children_and_exits_130(engine, fresh_database):
    parent = start_two_children(engine, fresh_database)
    try:
        children = [record["pid"] for record in parent.records("worker process started")]
        blockers = [rl.enqueue(engine, "proc.block", {}) for _ in range(2)]
        wait_until(lambda: len(rows(engine, "SELECT 1 FROM process_runs")) == 2, timeout=START_TIMEOUT)
        # Ctrl-C reaches every process of the group: the children ignore it and drain on
        # the parent's SIGTERM, rather than count it as a second signal and exit at once.
        os.killpg(parent.process.pid, signal.SIGINT)
        wait_until(lambda: len(parent.records("worker shutdown requested; draining in-flight jobs")) == 2, timeout=30)
        assert parent.process.poll() is None and all(alive(pid) for pid in children)
        os.killpg(parent.process.pid, signal.SIGINT)
        assert parent.process.wait(10) == 130
        wait_until(lambda: not any(alive(pid) for pid in children), timeout=10)
    finally:
        parent.close()
    # Left to the reaper, as with a single process: the leases were not given back.
    assert {rl.get_job(engine, job.id).status for job in blockers} == {rl.JobStatus.LEASED}


def each_child_runs_a_job(engine, parent: "ParentProcess") -> tuple[list[int], list]:
    """The children's pids, and the two jobs they run, one each: a blocker that never looks at its
    cancellation, and one that stops when told."""
    children = [record["pid"] for record in parent.records("worker process started")]
    jobs = [rl.enqueue(engine, "proc.block", {}), rl.enqueue(engine, "proc.wait_cancel", {})]
    wait_until(lambda: len(rows(engine, "SELECT 1 FROM process_runs")) == 2, timeout=START_TIMEOUT)
    return children, jobs


def test_at_the_drain_timeout_children_stop_their_jobs_and_exit_after_the_grace_and_the_worker_exits_1(
        engine, fresh_database):
    drain, grace, margin = 1.0, 1.0, 4.0
    parent = start_two_children(engine, fresh_database, "--drain-timeout", str(drain),
                                "--timeout-grace-seconds", str(grace))
    try:
        children, jobs = each_child_runs_a_job(engine, parent)
        parent.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert parent.process.wait(drain + grace + 30) == 1
        took = time.monotonic() - signalled
        assert not any(alive(pid) for pid in children)
    finally:
        parent.close()
    assert drain <= took < drain + grace + margin, took
    # Each child stopped by itself after the grace, neither was killed.
    stopped = parent.records("worker process stopped")
    assert sorted((record["worker_id"], record["exit_code"]) for record in stopped) == [("cli-p0", 0), ("cli-p1", 0)]
    assert len(parent.records("job stopped by the worker's shutdown; it runs again without spending an attempt")) == 1
    # The job that stopped when told is pending again, its attempt unspent; the blocker keeps its lease for the reaper.
    blocker, waiter = (rl.get_job(engine, job.id) for job in jobs)
    assert (waiter.status, waiter.attempt, waiter.last_error_code) == (rl.JobStatus.PENDING, 1, "job.worker_shutdown")
    assert (blocker.status, blocker.attempt, blocker.last_error_code) == (rl.JobStatus.LEASED, 1, None)


def test_children_drain_and_exit_when_their_parent_is_killed(engine, fresh_database):
    parent = ParentProcess(fresh_database)
    try:
        wait_until(lambda: len(parent.records("worker process started")) == 2 or parent.process.poll() is not None,
                   timeout=START_TIMEOUT)
        children = [record["pid"] for record in parent.records("worker process started")]
        parent.process.kill()
        # They still write to the pipe the parent's stderr was, so their last words arrive.
        wait_until(lambda: {record["worker_id"] for record in parent.records("parent process is gone; draining")}
                   == {"cli-p0", "cli-p1"}, timeout=30)
        wait_until(lambda: not any(alive(pid) for pid in children), timeout=30)
    finally:
        parent.close()


def test_children_orphaned_by_a_killed_parent_stop_their_jobs_at_the_drain_timeout_and_exit(engine, fresh_database):
    drain, grace, margin = 3.0, 1.0, 4.0
    parent = start_two_children(engine, fresh_database, "--drain-timeout", str(drain),
                                "--timeout-grace-seconds", str(grace))
    try:
        # Only the deadline ends them.
        children, jobs = each_child_runs_a_job(engine, parent)
        parent.process.kill()
        killed = time.monotonic()
        wait_until(lambda: not any(alive(pid) for pid in children), timeout=drain + grace + 30)
        took = time.monotonic() - killed
    finally:
        parent.close()
    assert drain <= took < drain + grace + margin, took
    waiter = rl.get_job(engine, jobs[1].id)
    assert (waiter.status, waiter.last_error_code) == (rl.JobStatus.PENDING, "job.worker_shutdown")


def alive(pid: int) -> bool:
    """True while ``pid`` runs (an exited child that nobody has reaped yet is a zombie, not alive)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_worker_refuses_a_process_count_below_one_before_touching_the_database(engine, fresh_database, capsys):
    code = cli.main(["--database-url", fresh_database, "worker", "--app", "tests.process_app:registry",
                     "--processes", "0"])

    lines = capsys.readouterr().err.splitlines()
    assert code == 2
    assert lines[0] == "error: config.invalid: processes must be an integer >= 1, got 0"
    assert rl.list_jobs(engine) == [] and not definition_count(engine)


def definition_count(engine) -> int:
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM job_definitions").scalar()
