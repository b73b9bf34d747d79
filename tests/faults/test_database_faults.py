"""Scenario 2: the database goes away under running workers, which must ride it out without a restart."""

from __future__ import annotations

import threading
import time

import pytest

import runledger_sync as rl
from runledger_sync.store.transactions import TRANSIENT_RETRY_BUDGET_SECONDS
from tests.faults.harness import Db, TcpProxy
from tests.faults.scenarios import postgres_crash, postgres_restart, restart_under_app_writes, terminate_backends
from tests.support import wait_until


@pytest.mark.timeout(240)
def test_workers_finish_every_job_once_across_two_postgres_restarts(tmp_path, sizes):
    result = postgres_restart(tmp_path, sizes)
    print(result.summary())
    assert result.problems == []
    assert result.lost == 0
    assert result.duplicate_completions == 0
    assert len(result.details["resume_seconds"]) == 2


@pytest.mark.timeout(240)
def test_a_crashed_server_loses_no_job_runs_none_twice_at_once_and_counts_every_attempt(tmp_path, sizes):
    # pg_ctl -m immediate: claims committed without waiting for the disk may be gone after it.
    result = postgres_crash(tmp_path, sizes)
    print(result.summary())
    assert result.problems == []
    assert result.lost == 0 and result.details["statuses"] == {"SUCCEEDED": sizes.crash_jobs}
    assert result.duplicate_completions == 0
    assert result.details["handlers_overlapping"] == 0
    assert result.details["jobs_with_miscounted_attempts"] == 0
    assert len(result.details["resume_seconds"]) == 2


@pytest.mark.timeout(180)
def test_workers_reconnect_after_every_backend_is_terminated(fresh_database, sizes):
    result = terminate_backends(fresh_database, sizes)
    print(result.summary())
    assert result.problems == []
    assert result.lost == 0
    assert result.duplicate_completions == 0
    assert all(count > 0 for count in result.details["backends_terminated"])


@pytest.mark.timeout(60)
def test_an_outage_shorter_than_the_lease_costs_the_running_job_nothing(fresh_database):
    # Longer than one store call's own retry budget, shorter than the lease: the
    # watchdog must keep renewing until the database is back instead of giving up.
    outage_seconds = TRANSIENT_RETRY_BUDGET_SECONDS + 1.0
    proxy = TcpProxy(fresh_database)
    engine = rl.create_engine(proxy.url_for(fresh_database))
    release = threading.Event()
    cancelled: list[str] = []
    registry = rl.JobRegistry()

    @registry.job("outage.ride", max_attempts=3, timeout_seconds=60)
    def ride(ctx: rl.JobContext, payload: dict) -> None:
        while not release.wait(0.05):
            if ctx.cancelled:
                cancelled.append(ctx.cancel_reason or "?")
                return

    config = rl.JobsConfig(poll_interval_ms=20, lease_ttl_seconds=outage_seconds + 3, heartbeat_interval_seconds=0.3,
                           reaper_interval_seconds=0.2)
    registry.sync_definitions(engine)
    job = rl.enqueue(engine, "outage.ride", {})
    shutdown = threading.Event()
    worker = threading.Thread(target=rl.run_worker_loop, args=(engine, registry, config, shutdown), daemon=True)
    worker.start()
    observer = rl.create_engine(fresh_database)
    try:
        wait_until(lambda: rl.get_job(observer, job.id).stage is rl.JobStage.RUNNING, 20, what="the job to start")
        proxy.refuse()
        time.sleep(outage_seconds)  # the outage itself: longer than the retry budget
        healed_at = Db(observer).now()
        proxy.heal()
        # The lease survives the outage: a renewal lands after it, before the job is let go.
        wait_until(lambda: rl.get_job(observer, job.id).last_heartbeat_at > healed_at, 10, what="a renewal after the outage")
        release.set()
        wait_until(lambda: rl.get_job(observer, job.id).status is rl.JobStatus.SUCCEEDED, 20, what="the job to succeed")
        finished = rl.get_job(observer, job.id)
        assert cancelled == []
        assert (finished.attempt, finished.run_number) == (1, 1)
        assert Db(observer).scalar("SELECT count(*) FROM job_attempts WHERE job_id = :id", id=job.id) == 1
    finally:
        release.set()
        shutdown.set()
        worker.join(20)
        proxy.close()
        engine.dispose()
        observer.dispose()


@pytest.mark.timeout(240)
def test_a_restart_and_killed_backends_under_handlers_writing_through_their_own_engine_lose_nothing(tmp_path, sizes):
    # The handlers do not retry their own writes: the queue must ride the restart out for them.
    result = restart_under_app_writes(tmp_path, sizes)
    print(result.summary())
    assert result.problems == []
    assert result.lost == 0 and result.details["statuses"] == {"SUCCEEDED": sizes.restart_jobs}
    assert result.duplicate_completions == 0
    assert all(count > 0 for count in result.details["backends_terminated"])
