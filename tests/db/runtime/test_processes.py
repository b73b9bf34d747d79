"""Supervisor(processes=N): real worker processes, spawned, sharing one queue; restarts and drains.

The app is :mod:`tests.process_app`, imported by each child. Waits poll the
database for what the handlers recorded (``process_runs``), never a fixed sleep.
"""

from __future__ import annotations

import os
import signal

import pytest
from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.runtime.supervisor.supervisor import Supervisor
from tests import process_app
from tests.handlers import fast_config
from tests.support import rows, scalar, wait_until

APP = "tests.process_app:registry"
#: Spawning imports the library afresh in each child: allow for a busy 2-core machine.
START_TIMEOUT = 60


@pytest.fixture
def app_database(engine, fresh_database, monkeypatch):
    monkeypatch.setenv(process_app.URL_VARIABLE, fresh_database)
    with engine.begin() as conn:
        for ddl in process_app.TABLES_DDL:
            conn.execute(text(ddl))
    process_app.registry.sync_definitions(engine)
    return engine


@pytest.fixture
def supervisors():
    made: list[Supervisor] = []
    yield made
    for supervisor in made:
        if not supervisor.stop(timeout=20):
            supervisor._group.kill()  # a failed test must not leave children writing into the next one


def runs(engine) -> list:
    return rows(engine, "SELECT job_id, attempt, worker_id, pid FROM process_runs ORDER BY worker_id")


def open_gate(engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO process_gate VALUES (true)"))


def succeeded(engine) -> int:
    return rl.count_jobs(engine, status=rl.JobStatus.SUCCEEDED)


def test_two_processes_share_the_queue_and_run_each_job_exactly_once(app_database, supervisors, logs):
    engine = app_database
    blockers = [rl.enqueue(engine, "proc.block", {}) for _ in range(2)]
    config = fast_config(worker_id="multi", max_global_concurrency=1)
    supervisor = Supervisor(engine, process_app.registry, config, processes=2, app=APP)
    supervisors.append(supervisor)
    supervisor.start()
    # One slot per child, and each blocker holds its slot: both running means each child claimed one.
    wait_until(lambda: {run.worker_id for run in runs(engine)} == {"multi-p0", "multi-p1"}, timeout=START_TIMEOUT)
    assert len({run.pid for run in runs(engine)} | {os.getpid()}) == 3
    rl.enqueue_many(engine, [rl.JobSpec("proc.quick", {"n": n}) for n in range(40)])
    open_gate(engine)
    wait_until(lambda: succeeded(engine) == 42, timeout=START_TIMEOUT)
    assert supervisor.stop(timeout=30) is True
    assert supervisor.failure is None and supervisor.exits == {"multi-p0": 0, "multi-p1": 0}
    per_job = rows(engine, "SELECT job_id, count(*) AS n FROM process_runs GROUP BY job_id")
    assert len(per_job) == 42 and {row.n for row in per_job} == {1}
    assert scalar(engine, "SELECT count(*) FROM job_attempts") == 42
    workers = {row.worker_id for row in rows(engine, "SELECT DISTINCT worker_id FROM job_attempts")}
    assert workers == {"multi-p0", "multi-p1"}
    assert {job.id for job in blockers} <= {row.job_id for row in per_job}


def test_a_child_killed_with_sigkill_is_restarted_and_its_job_recovered_after_its_lease(
    app_database, supervisors, logs,
):
    engine = app_database
    for _ in range(2):
        rl.enqueue(engine, "proc.block", {})
    config = fast_config(worker_id="kill", max_global_concurrency=1, lease_ttl_seconds=2,
                         heartbeat_interval_seconds=0.5, reaper_interval_seconds=0.2, reaper_retry_delay_ms=1)
    supervisor = Supervisor(engine, process_app.registry, config, processes=2, app=APP)
    supervisors.append(supervisor)
    supervisor.start()
    wait_until(lambda: {run.worker_id for run in runs(engine)} == {"kill-p0", "kill-p1"}, timeout=START_TIMEOUT)
    victim = next(run for run in runs(engine) if run.worker_id == "kill-p0")
    os.kill(victim.pid, signal.SIGKILL)
    # kill-p1 still holds its one slot, so only the restarted child can take the job
    # back, once its lease has expired and the reaper (child 0's, restarted) released it.
    retried = wait_until(lambda: [run for run in runs(engine) if run.job_id == victim.job_id and run.attempt == 2],
                         timeout=START_TIMEOUT)
    assert retried[0].worker_id == "kill-p0-r1" and retried[0].pid != victim.pid
    restarts = [r for r in logs.records if r.getMessage() == "worker process exited unexpectedly; restarting it"]
    assert [(r.worker_id, r.exit_code, r.signal) for r in restarts] == [("kill-p0", -9, "SIGKILL")]
    open_gate(engine)
    wait_until(lambda: succeeded(engine) == 2, timeout=START_TIMEOUT)
    assert supervisor.stop(timeout=30) is True
    assert supervisor.failure is None and supervisor.exits == {"kill-p0-r1": 0, "kill-p1": 0}
    attempts = rows(engine, "SELECT worker_id, outcome FROM job_attempts WHERE job_id = :id ORDER BY attempt",
                    id=victim.job_id)
    assert [row.worker_id for row in attempts] == ["kill-p0", "kill-p0-r1"]
    assert attempts[0].outcome is not None and attempts[1].outcome is None


def test_a_registry_factory_is_imported_and_called_in_each_child(app_database, supervisors, logs):
    engine = app_database
    job = rl.enqueue(engine, "proc.quick", {})
    supervisor = Supervisor(engine, process_app.make_registry(), fast_config(worker_id="factory"), processes=2,
                            app="tests.process_app:make_registry")
    supervisors.append(supervisor)
    supervisor.start()
    wait_until(lambda: rl.get_job(engine, job.id).status is rl.JobStatus.SUCCEEDED, timeout=START_TIMEOUT)
    assert supervisor.stop(timeout=30) is True
    assert runs(engine)[0].worker_id in {"factory-p0", "factory-p1"}


def test_a_child_that_cannot_load_its_app_is_not_restarted_and_stops_the_others(app_database, supervisors, logs):
    supervisor = Supervisor(app_database, process_app.registry, fast_config(worker_id="refused"), processes=2,
                            app="tests.process_app:refused_in_children")
    supervisors.append(supervisor)
    supervisor.start()
    wait_until(lambda: not supervisor.running, timeout=START_TIMEOUT)
    assert "refused to start (last status 2)" in supervisor.failure
    assert set(supervisor.exits) == {"refused-p0", "refused-p1"} and 2 in supervisor.exits.values()
    assert not [r for r in logs.records if r.getMessage() == "worker process exited unexpectedly; restarting it"]
    assert [r for r in logs.records if r.getMessage() == "worker process keeps failing; stopping the others"]


def test_worker_processes_open_payloads_with_the_parents_encryption_keys(app_database, supervisors, logs):
    from runledger_sync.core.encryption import active_encryption

    engine = app_database
    before = active_encryption()
    rl.configure_encryption(rl.Encryption(keys={"k1": os.urandom(32)}, current="k1"))
    try:
        rl.enqueue_many(engine, [rl.JobSpec("proc.quick", {"n": n}) for n in range(4)])
        assert scalar(engine, "SELECT count(*) FROM job_queue WHERE payload ? '$rl.enc'") == 4
        supervisor = Supervisor(engine, process_app.registry, fast_config(worker_id="sealed"), processes=2, app=APP)
        supervisors.append(supervisor)
        supervisor.start()
        # A child without the keys would hand every claim back: all four succeed only if the children hold them.
        wait_until(lambda: succeeded(engine) == 4, timeout=START_TIMEOUT)
        assert scalar(engine, "SELECT count(*) FROM job_events WHERE event_type = 'REQUEUED'") == 0
    finally:
        rl.configure_encryption(before)
