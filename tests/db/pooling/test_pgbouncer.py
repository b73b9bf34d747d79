"""The CLI worker behind a real PgBouncer: each job once, in either pool mode, and nothing left behind.

Every worker here is a real ``runledger-sync worker`` process (16 jobs at
once) and every enqueue goes through PgBouncer from 12 threads. Pickup latency
is read from the database clock: from the enqueue (``job_queue.created_at``)
to the claim (``job_attempts.leased_at``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import psycopg2
import pytest
from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.store import notify
from tests.pool_app import JOB_TYPE
from tests.support import scalar, wait_until

REPO = Path(__file__).resolve().parents[3]
JOBS = 2_000
ENQUEUE_THREADS = 12
CONCURRENCY = 16
POLL_INTERVAL_MS = 500
PICKUP_SAMPLES = 15
#: The drain must keep moving: this long without a job finishing fails the test.
STALL_SECONDS = 30.0


class CliWorker:
    """``runledger-sync worker`` in a subprocess; its JSON log lines go to a file (a pipe could fill up)."""

    def __init__(self, url: str, pool_mode: Optional[str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("w")
        option = ["--pool-mode", pool_mode] if pool_mode else []
        env = {key: value for key, value in os.environ.items() if key != "RUNLEDGER_POOL_MODE"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "runledger_sync.cli", "--database-url", url, *option, "worker",
             "--app", "tests.pool_app:registry", "--concurrency", str(CONCURRENCY),
             "--poll-interval-ms", str(POLL_INTERVAL_MS)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=self._log, text=True, env=env,
        )

    def records(self) -> list[dict[str, Any]]:
        lines = self.log_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def messages(self, message: str) -> list[dict[str, Any]]:
        return [record for record in self.records() if record.get("message") == message]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()
        return self.process.returncode


@pytest.fixture
def start_worker(tmp_path) -> Iterator[Any]:
    started: list[CliWorker] = []

    def start(url: str, pool_mode: Optional[str], direct_engine: Any) -> CliWorker:
        worker = CliWorker(url, pool_mode, tmp_path / f"worker-{len(started)}.log")
        started.append(worker)
        # The worker writes its app's definitions itself; enqueueing needs them.
        wait_until(lambda: worker.process.poll() is not None or scalar(
            direct_engine, "SELECT count(*) FROM job_definitions WHERE job_type = :t", t=JOB_TYPE), timeout=30)
        assert worker.process.poll() is None, worker.log_path.read_text()
        return worker

    yield start
    for worker in started:
        worker.stop()


def enqueue_from_threads(engine: Any, jobs: int, threads: int = ENQUEUE_THREADS) -> list[BaseException]:
    """Enqueue ``jobs`` no-op jobs from ``threads`` threads at once; return the failures."""
    failures: list[BaseException] = []
    lock = threading.Lock()

    def enqueue_share(share: range) -> None:
        for n in share:
            try:
                rl.enqueue(engine, JOB_TYPE, {"n": n})
            except rl.RunledgerError as error:
                with lock:
                    failures.append(error)

    workers = [threading.Thread(target=enqueue_share, args=(range(t, jobs, threads),)) for t in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(120)
    return failures


def drain(direct_engine: Any, worker: CliWorker, jobs: int, timeout: float = 180.0) -> float:
    """Wait until ``jobs`` jobs have succeeded; fail when the worker dies or stops making progress."""
    started = time.monotonic()
    done, progressed_at = 0, started
    while done < jobs:
        assert worker.process.poll() is None, f"worker exited: {worker.log_path.read_text()[-3000:]}"
        now = time.monotonic()
        assert now - started < timeout, f"{done} of {jobs} jobs done in {timeout} s"
        assert now - progressed_at < STALL_SECONDS, (
            f"no job finished for {STALL_SECONDS} s at {done} of {jobs}: {describe(direct_engine, worker)}")
        time.sleep(0.1)
        count = scalar(direct_engine, "SELECT count(*) FROM job_queue WHERE status = 'SUCCEEDED'")
        if count > done:
            done, progressed_at = count, time.monotonic()
    return time.monotonic() - started


def describe(direct_engine: Any, worker: CliWorker) -> str:
    with direct_engine.connect() as conn:
        statuses = dict(conn.execute(text("SELECT status, count(*) FROM job_queue GROUP BY status")).all())
    problems = [record for record in worker.records() if record["level"] in ("WARNING", "ERROR")]
    return f"jobs by status {statuses}; warnings and errors logged: {problems[:5]} ({len(problems)} in all)"


def assert_each_job_ran_once(direct_engine: Any, jobs: int) -> None:
    assert scalar(direct_engine, "SELECT count(*) FROM job_queue") == jobs
    assert scalar(direct_engine, "SELECT count(*) FROM job_queue WHERE status = 'SUCCEEDED'") == jobs
    with direct_engine.connect() as conn:
        attempts = conn.execute(text("SELECT count(*), count(DISTINCT job_id) FROM job_attempts")).one()
        succeeded = conn.execute(text(
            "SELECT count(*), count(DISTINCT job_id) FROM job_events WHERE event_type = 'SUCCEEDED'")).one()
    assert tuple(attempts) == (jobs, jobs)
    assert tuple(succeeded) == (jobs, jobs)


def pickup_latencies_ms(enqueue_engine: Any, direct_engine: Any, samples: int = PICKUP_SAMPLES) -> list[float]:
    """Enqueue jobs one at a time to an idle worker, at gaps that do not follow its poll; return each pickup."""
    ids = []
    for n in range(samples):
        time.sleep(random.uniform(0.15, 0.45))  # noqa: S311 - spread over the poll cycle, not security
        ids.append(rl.enqueue(enqueue_engine, JOB_TYPE, {"pickup": n}).id)
        wait_until(lambda: scalar(direct_engine, "SELECT count(*) FROM job_attempts WHERE job_id = :id", id=ids[-1]),
                   timeout=10)
    with direct_engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT extract(epoch FROM a.leased_at - q.created_at) * 1000 FROM job_queue q "
            "JOIN job_attempts a ON a.job_id = q.id WHERE q.id = ANY(:ids)"), {"ids": ids}).scalars().all()
    return sorted(float(row) for row in rows)


def percentile(sorted_values: list[float], share: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(share * len(sorted_values)))]


def notifications_other_clients_receive(bouncer_url: str, enqueue_engine: Any, seconds: float = 2.0) -> int:
    """Run transactions from 4 clients through PgBouncer (one per pooled server connection) while jobs are
    enqueued; return how many notifications reached them. A LISTEN left on a pooled server connection
    is delivered to whichever client runs there."""
    stop = threading.Event()
    received: list[int] = []
    lock = threading.Lock()
    parameters = rl.create_engine(bouncer_url).url.translate_connect_args(username="user")
    clients = [psycopg2.connect(**parameters) for _ in range(4)]

    def run(connection: Any) -> None:
        connection.autocommit = True
        count = 0
        with connection.cursor() as cursor:
            while not stop.is_set():
                cursor.execute("SELECT pg_sleep(0.005)")
                connection.poll()
                count += len(connection.notifies)
                connection.notifies.clear()
        with lock:
            received.append(count)

    threads = [threading.Thread(target=run, args=(client,)) for client in clients]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rl.enqueue(enqueue_engine, JOB_TYPE, {"after": "exit"})
        time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join(10)
    for client in clients:
        client.close()
    return sum(received)


def test_cli_worker_in_transaction_mode_runs_each_of_2000_jobs_once_and_polls(
    pgbouncer, fresh_database, engine, start_worker,
):
    url = pgbouncer.url(fresh_database)
    worker = start_worker(url, "transaction", engine)
    through = rl.create_engine(url, pool_mode="transaction")
    try:
        assert enqueue_from_threads(through, JOBS) == []
        drain(engine, worker, JOBS)
        assert_each_job_ran_once(engine, JOBS)
        latencies = pickup_latencies_ms(through, engine)
        # Polling only: a pickup waits for the next poll (jittered by 10%), and no longer.
        assert percentile(latencies, 0.95) < POLL_INTERVAL_MS * 1.1 + 250, latencies
        assert worker.stop() == 0
        assert worker.messages("pool mode transaction: no LISTEN; idle workers poll")
        assert worker.messages("listener connected") == []
        assert [record for record in worker.records() if record["level"] == "WARNING"] == []
        assert notifications_other_clients_receive(url, through) == 0
    finally:
        through.dispose()


def test_cli_worker_left_in_session_mode_behind_a_transaction_pooler_switches_to_plain_statements(
    pgbouncer, fresh_database, engine, start_worker,
):
    url = pgbouncer.url(fresh_database)
    worker = start_worker(url, "session", engine)
    # Enqueued through engines left in session mode as well, as in the report of the problem.
    through = rl.create_engine(url, pool_mode="session")
    try:
        assert enqueue_from_threads(through, JOBS) == []
        drain(engine, worker, JOBS)
        assert_each_job_ran_once(engine, JOBS)
        assert worker.stop() == 0
        warnings = [record for record in worker.records() if "RUNLEDGER_POOL_MODE=transaction" in record["message"]]
        assert len(warnings) == 1, warnings
        assert warnings[0]["sqlstate"] in ("42P05", "26000")
        assert [record for record in worker.records() if record["level"] == "ERROR"] == []
        assert worker.messages("worker claim failed") == []
        # The listener either proved its LISTEN delivers nothing, or never started once the
        # engine knew its sessions were shared: in both cases it polls, and says so.
        assert worker.messages("listener lost; polling") or worker.messages("listener off; polling")
        assert worker.messages("listener connected") == []
        assert notifications_other_clients_receive(url, through) == 0
        # A new client in session mode (a one-off `enqueue`) is not broken by what is left behind.
        later = rl.create_engine(url, pool_mode="session")
        assert rl.enqueue(later, JOB_TYPE, {"later": True}).id
        later.dispose()
    finally:
        through.dispose()


def test_cli_worker_direct_in_session_mode_runs_each_of_2000_jobs_once_and_listens(
    fresh_database, engine, start_worker,
):
    worker = start_worker(fresh_database, None, engine)
    assert enqueue_from_threads(engine, JOBS) == []
    drain(engine, worker, JOBS)
    assert_each_job_ran_once(engine, JOBS)
    latencies = pickup_latencies_ms(engine, engine)
    # LISTEN wakes the worker at once: far below the 500 ms poll.
    assert percentile(latencies, 0.95) < POLL_INTERVAL_MS / 5, latencies
    assert worker.stop() == 0
    assert len(worker.messages("listener connected")) == 1
    assert worker.messages("listener lost; polling") == []
    assert scalar(engine, "SELECT count(*) FROM pg_stat_activity WHERE application_name = :name AND datname = current_database()",
                  name=notify.LISTENER_APPLICATION_NAME) == 0


def test_wait_for_job_through_a_transaction_pooler_returns_within_its_poll_interval(pgbouncer, fresh_database, engine):
    """Behind PgBouncer in transaction mode the waiter cannot LISTEN: it polls, at most 500 ms apart."""
    through = rl.create_engine(pgbouncer.url(fresh_database), pool_mode="transaction")
    try:
        with engine.begin() as connection:
            connection.execute(text("INSERT INTO job_definitions (job_type) VALUES (:t) ON CONFLICT DO NOTHING"),
                               {"t": JOB_TYPE})
        job = rl.enqueue(through, JOB_TYPE, {})
        returned: list[Any] = []
        waiter = threading.Thread(target=lambda: returned.append(
            (rl.wait_for_job(through, job.id, timeout=20), time.monotonic())))
        waiter.start()
        # Let the waiter settle into its slowest polling pace before the job ends.
        time.sleep(1.5)
        rl.cancel_job(engine, job.id)
        ended = time.monotonic()
        waiter.join(20)
        assert returned, "wait_for_job did not return"
        record, at = returned[0]
        assert record.status is rl.JobStatus.CANCELED
        assert at - ended < 0.5 + 0.25, at - ended
    finally:
        through.dispose()
