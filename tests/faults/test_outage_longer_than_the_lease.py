"""A success decided during an outage longer than the lease lands once the database is back.

The handler finishes a moment into the outage; the outage then outlasts the
lease. Nobody else took the job (same run, attempt and worker, still LEASED),
so the worker's completer, which keeps trying for as long as the worker lives,
writes the success when the database returns, and the reaper, back from the
same outage, gives the worker a heartbeat interval to land it before reclaiming.
With ``max_attempts=1`` a reclaim would dead-letter the job; any rerun would show
as a second attempt.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

import runledger_sync as rl
from runledger_sync.runtime.loops.reaper import run_reaper_loop
from runledger_sync.store.driver import driver_for
from tests.faults.harness import Db, TcpProxy
from tests.support import claim_one, expire_lease, wait_until

#: The issue's figures (a managed failover: 70 s down, the default 60 s lease) under
#: RUNLEDGER_FAULT_SIZES=full; scaled down otherwise, in the same proportions.
FULL = os.environ.get("RUNLEDGER_FAULT_SIZES", "") == "full"
LEASE_SECONDS = 60 if FULL else 6
OUTAGE_SECONDS = 70 if FULL else 8


@pytest.mark.timeout(OUTAGE_SECONDS + 90)
def test_a_success_decided_in_an_outage_longer_than_the_lease_lands_once_and_is_not_run_again(fresh_database):
    proxy = TcpProxy(fresh_database)
    engine = rl.create_engine(proxy.url_for(fresh_database))
    in_outage = threading.Event()
    runs: list[int] = []
    registry = rl.JobRegistry()

    @registry.job("outage.finish", max_attempts=1, timeout_seconds=LEASE_SECONDS * 4)
    def finish(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
        runs.append(ctx.attempt)
        in_outage.wait(30)
        time.sleep(1)  # decided a moment into the outage
        return rl.JobCompletion.success().with_output({"done": True})

    config = rl.JobsConfig(poll_interval_ms=20, lease_ttl_seconds=LEASE_SECONDS, reaper_interval_seconds=0.5)
    registry.sync_definitions(engine)
    job = rl.enqueue(engine, "outage.finish", {})
    shutdown = threading.Event()
    threads = [
        threading.Thread(target=rl.run_worker_loop, args=(engine, registry, config, shutdown), daemon=True),
        threading.Thread(target=run_reaper_loop, args=(driver_for(engine), registry, config, shutdown), daemon=True),
    ]
    for thread in threads:
        thread.start()
    observer = rl.create_engine(fresh_database)
    try:
        wait_until(lambda: rl.get_job(observer, job.id).stage is rl.JobStage.RUNNING, 20, what="the job to start")
        lease_ends = rl.get_job(observer, job.id).lease_expires_at
        proxy.refuse()
        in_outage.set()
        time.sleep(OUTAGE_SECONDS)
        assert Db(observer).now() > lease_ends, "the outage must outlast the lease"
        assert rl.get_job(observer, job.id).status is rl.JobStatus.LEASED
        proxy.heal()
        wait_until(lambda: rl.get_job(observer, job.id).status.is_terminal, LEASE_SECONDS + 30,
                   what="the job to finish")
        finished = rl.get_job(observer, job.id)
        assert finished.status is rl.JobStatus.SUCCEEDED, (finished.status, finished.last_error_code)
        assert finished.output == {"done": True}
        assert (finished.attempt, finished.run_number) == (1, 1)
        assert Db(observer).scalar("SELECT count(*) FROM job_attempts WHERE job_id = :id", id=job.id) == 1
        assert runs == [1]
    finally:
        in_outage.set()
        shutdown.set()
        for thread in threads:
            thread.join(20)
        proxy.close()
        engine.dispose()
        observer.dispose()


@pytest.mark.timeout(60)
def test_the_reaper_back_from_an_outage_waits_a_heartbeat_interval_before_reclaiming(fresh_database):
    proxy = TcpProxy(fresh_database)
    engine = rl.create_engine(proxy.url_for(fresh_database))
    observer = rl.create_engine(fresh_database)
    registry = rl.JobRegistry()
    registry.job("outage.other_worker", max_attempts=3)(lambda ctx, payload: None)
    registry.sync_definitions(observer)
    job = rl.enqueue(observer, "outage.other_worker", {})
    claim_one(observer, job_type="outage.other_worker", lease_ttl_seconds=60)
    hold = 3.0
    config = rl.JobsConfig(reaper_interval_seconds=0.2, heartbeat_interval_seconds=hold, lease_ttl_seconds=60)
    shutdown = threading.Event()
    reaper = threading.Thread(target=run_reaper_loop, args=(driver_for(engine), registry, config, shutdown), daemon=True)
    try:
        proxy.refuse()
        reaper.start()
        time.sleep(1.0)  # sweeps fail: the database is out of reach
        expire_lease(observer, job.id)
        proxy.heal()
        healed = time.monotonic()
        wait_until(lambda: rl.get_job(observer, job.id).status is not rl.JobStatus.LEASED, 20,
                   what="the reaper to reclaim the expired lease")
        assert time.monotonic() - healed >= hold - 0.5
        assert rl.get_job(observer, job.id).status is rl.JobStatus.PENDING
    finally:
        shutdown.set()
        reaper.join(20)
        proxy.close()
        engine.dispose()
        observer.dispose()
