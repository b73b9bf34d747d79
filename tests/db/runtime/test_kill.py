"""A worker process killed with SIGKILL mid-job: its job is recovered after the lease runs out."""

from __future__ import annotations

import signal
import time

from runledger_sync.runtime.supervisor.supervisor import Supervisor
from runledger_sync.store.enqueue.enqueue import enqueue
from tests import handlers as h
from tests.db.runtime.process_support import WorkerProcess
from tests.db.runtime.worker_process import LEASE_TTL_SECONDS
from tests.handlers import SECRET, fast_config
from tests.support import attempts, events, rows, scalar, wait_until

PAYLOAD = {"secret": SECRET}


def test_job_of_a_worker_killed_mid_job_is_finished_by_another_worker_after_lease_expiry(engine, fresh_database,
                                                                                          probe, logs):
    h.registry_with("proc.job", lambda ctx, payload: None, max_attempts=3).sync_definitions(engine)
    job = enqueue(engine, "proc.job", PAYLOAD)
    doomed = WorkerProcess(fresh_database, "hang")
    try:
        wait_until(lambda: rows(engine, "SELECT status, stage FROM job_queue")[0] == ("LEASED", "running"),
                   timeout=30)
        # It is alive and renewing: its lease was renewed after the claim (the job row shows it at any event log level).
        wait_until(lambda: scalar(engine, "SELECT q.last_heartbeat_at > a.leased_at FROM job_queue q JOIN job_attempts a "
                                          "ON (a.job_id, a.run_number, a.attempt) = (q.id, q.run_number, q.attempt)"),
                   timeout=10)
        doomed.process.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        doomed.process.wait(10)
    finally:
        doomed.stop()
    dead_worker = f"proc-{doomed.process.pid}"
    lease_end = scalar(engine, "SELECT lease_expires_at FROM job_queue")
    assert rows(engine, "SELECT status, worker_id FROM job_queue") == [("LEASED", dead_worker)]

    reaper_interval, poll_ms = 0.2, 50
    registry = h.registry_with("proc.job", h.ok(probe))
    config = fast_config(worker_id="worker-rescuer", reaper_interval_seconds=reaper_interval,
                         poll_interval_ms=poll_ms, reaper_retry_delay_ms=1)
    with Supervisor(engine, registry, config):
        wait_until(lambda: scalar(engine, "SELECT status FROM job_queue") == "SUCCEEDED", timeout=20)
        recovered_in = time.monotonic() - killed_at

    # The dead worker's last heartbeat may have been just before the kill; allow
    # a generous margin for a loaded machine on top of TTL + sweep + poll.
    assert recovered_in <= LEASE_TTL_SECONDS + reaper_interval + poll_ms / 1000 + 2.0
    first, second = attempts(engine, job.id)
    assert (first.attempt, first.worker_id, first.outcome, first.error_code) == (
        1, dead_worker, "LEASE_EXPIRED", "job.lease_expired")
    assert (second.attempt, second.worker_id, second.outcome) == (2, "worker-rescuer", None)
    assert second.finished_at is not None and second.leased_at >= lease_end  # not before the lease ran out
    assert [(call.attempt, call.worker_id) for call in probe.calls] == [(2, "worker-rescuer")]
    retry = [e for e in events(engine, job.id) if e[0] == "RETRY_SCHEDULED"]
    assert retry[0][1] == 1 and retry[0][2]["kind"] == "LEASE_EXPIRED"
    assert SECRET not in doomed.output()
