"""The Supervisor: embedding, context manager, a loop that dies, and SIGTERM in a real process."""

from __future__ import annotations

import signal
import time

import pytest

from runledger_sync.core.errors import ConfigError
from runledger_sync.core.types import JobCompletion, RuntimeLoopExit
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.supervisor.supervisor import Supervisor
from runledger_sync.store.enqueue.enqueue import enqueue
from tests import handlers as h
from tests.db.runtime.process_support import WorkerProcess, create_side_effects
from tests.handlers import SECRET, fast_config
from tests.support import JOB_TYPE, claim_one, define, event_types, expire_lease, rows, scalar, wait_until

PAYLOAD = {"secret": SECRET}


def status(engine, job_id):
    return scalar(engine, "SELECT status FROM job_queue WHERE id = :id", id=job_id)


@pytest.fixture
def supervisors():
    made: list[Supervisor] = []
    yield made
    for supervisor in made:
        supervisor.stop(timeout=10)


def test_started_supervisor_runs_jobs_in_the_background_and_stop_drains_them(engine, probe, supervisors, logs):
    registry = h.registry_with(JOB_TYPE, h.hang(probe, JobCompletion(output={"ok": 1})), max_attempts=1)
    registry.sync_definitions(engine)
    supervisor = Supervisor(engine, registry, fast_config())
    supervisors.append(supervisor)
    assert supervisor.start() is supervisor
    assert supervisor.running
    job = enqueue(engine, JOB_TYPE, PAYLOAD)
    probe.wait_calls(1)
    # The reaper runs too: it dead-letters the expired last attempt of a job
    # another process (gone now) had claimed.
    define(engine, "test.elsewhere", max_attempts=1)
    orphan = enqueue(engine, "test.elsewhere", PAYLOAD)
    claim_one(engine, worker_id="gone", prestart=False, job_type="test.elsewhere")
    expire_lease(engine, orphan.id)
    wait_until(lambda: status(engine, orphan.id) == "DEAD_LETTERED")
    probe.release.set()
    assert supervisor.stop(timeout=10) is True
    assert status(engine, job.id) == "SUCCEEDED"
    assert not supervisor.running and supervisor.failure is None
    assert supervisor.exits == {"worker": RuntimeLoopExit.SHUTDOWN, "reaper": RuntimeLoopExit.SHUTDOWN,
                                "scheduler": RuntimeLoopExit.SHUTDOWN}
    with pytest.raises(RuntimeError):
        supervisor.start()


def test_stop_tells_a_job_that_outlives_the_timeout_to_stop_and_returns_false_after_the_grace(
        engine, probe, supervisors, logs):
    registry = h.registry_with(JOB_TYPE, h.ignore_cancel(probe))
    registry.sync_definitions(engine)
    supervisor = Supervisor(engine, registry, fast_config(timeout_grace_seconds=0.5), run_reaper=False).start()
    supervisors.append(supervisor)
    job = enqueue(engine, JOB_TYPE, PAYLOAD)
    probe.wait_calls(1)
    started = time.monotonic()
    assert supervisor.stop(timeout=0.3) is False
    # The drain timeout, the grace, and the loops' closing: no wait for the handler.
    assert 0.8 <= time.monotonic() - started < 2.5
    [call] = probe.calls
    assert call.cancelled_at is not None and not supervisor.running
    probe.release.set()
    # Its late return is not written: the lease is left for the reaper, the attempt not spent by a failure.
    wait_until(lambda: [r for r in logs.records if r.getMessage().startswith("handler finished after its attempt was already")])
    assert status(engine, job.id) == "LEASED" and "FAILED" not in event_types(engine, job.id)
    assert [r for r in logs.records if r.getMessage().startswith("job ignored its cancellation past the shutdown")]


def test_supervisor_as_a_context_manager_stops_on_exit(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    registry.sync_definitions(engine)
    job = enqueue(engine, JOB_TYPE, PAYLOAD)
    with Supervisor(engine, registry, fast_config()) as supervisor:
        wait_until(lambda: status(engine, job.id) == "SUCCEEDED")
        assert supervisor.running
    assert not supervisor.running and supervisor.failure is None


def test_supervisor_with_an_invalid_reaper_setting_refuses_to_start_and_claims_nothing(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    registry.sync_definitions(engine)
    job = enqueue(engine, JOB_TYPE, PAYLOAD)
    config = fast_config(reaper_retry_delay_ms=0)
    config.validate_worker_loop()  # the worker's own settings are fine
    supervisor = Supervisor(engine, registry, config)
    with pytest.raises(ConfigError) as caught:
        supervisor.start()
    assert any("reaper_retry_delay_ms" in problem for problem in caught.value.problems)
    assert not supervisor.running and supervisor.exits == {}
    assert event_types(engine, job.id) == []


class BrokenRegistry(JobRegistry):
    """A registry that fails when the worker asks for its types (a bug in user code)."""

    def registered_types(self):
        raise RuntimeError("registry is broken")


def test_a_loop_that_dies_stops_the_others_and_is_reported(engine, probe, logs):
    registry = BrokenRegistry()
    registry.job(JOB_TYPE, max_attempts=1)(h.ok(probe))
    supervisor = Supervisor(engine, registry, fast_config()).start()
    try:
        wait_until(lambda: not supervisor.running)
    finally:
        supervisor.stop(timeout=5)
    assert "worker loop ended unexpectedly" in supervisor.failure
    assert "registry is broken" in supervisor.failure
    assert isinstance(supervisor.exits["worker"], RuntimeError)
    assert supervisor.exits["reaper"] is RuntimeLoopExit.SHUTDOWN
    assert [r for r in logs.records if r.getMessage() == "a runtime loop ended early; stopping the others"]


def test_run_until_shutdown_drains_on_sigterm_and_exits_zero(engine, fresh_database, logs):
    create_side_effects(engine)
    h.registry_with("proc.job", lambda ctx, payload: None, max_attempts=3).sync_definitions(engine)
    job = enqueue(engine, "proc.job", PAYLOAD)
    worker = WorkerProcess(fresh_database, "drain")
    try:
        wait_until(lambda: scalar(engine, "SELECT stage FROM job_queue WHERE id = :id", id=job.id) == "running",
                   timeout=30)
        worker.process.send_signal(signal.SIGTERM)
        wait_until(lambda: worker.logged("worker shutdown requested; draining in-flight jobs"))
        late = enqueue(engine, "proc.job", PAYLOAD)
        assert worker.process.poll() is None  # still draining
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO side_effects (note) VALUES ('go')")
        assert worker.process.wait(15) == 0, worker.output()
    finally:
        worker.stop()
    row = rows(engine, "SELECT status, output FROM job_queue WHERE id = :id", id=job.id)[0]
    assert (row.status, row.output) == ("SUCCEEDED", {"pid": worker.process.pid})
    assert event_types(engine, late.id) == []
    assert SECRET not in worker.output()
