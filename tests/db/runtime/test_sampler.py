"""The dashboard's sampler: it writes each closed minute while the worker runs, one sampler at a time."""

from __future__ import annotations

import threading

import runledger_sync as rl
from runledger_sync.runtime.loops import sampling
from runledger_sync.runtime.loops.sampling import Sampler
from runledger_sync.runtime.supervisor.supervisor import Supervisor
from runledger_sync.store import driver as driver_module
from runledger_sync.store.driver import driver_for
from tests.handlers import fast_config
from tests.support import define, scalar, wait_until


def sampler_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("runledger-sampler-")]


def sampled_minutes(engine) -> int:
    return scalar(engine, "SELECT count(DISTINCT minute) FROM job_rollup_minutes")


def test_two_samplers_write_the_last_closed_minute_once(engine):
    define(engine)
    shutdown = threading.Event()
    samplers = [Sampler(driver_for(engine), fast_config(worker_id=f"w{n}"), shutdown, first_delay_seconds=0).start()
                for n in range(2)]
    try:
        wait_until(lambda: sampled_minutes(engine) >= 1, what="a sampler writes the last closed minute")
        # One row per minute (there is one queue): the second sampler wrote nothing twice.
        assert scalar(engine, "SELECT count(*) = count(DISTINCT minute) FROM job_rollup_minutes") is True
    finally:
        shutdown.set()
        for sampler in samplers:
            sampler.join(5)
    assert sampler_threads() == []


def test_the_supervisor_that_reaps_runs_a_sampler_and_a_failure_never_stops_it(engine, monkeypatch, caplog):
    turns = []

    def failing(*args, **kwargs):
        turns.append(1)
        raise rl.StoreError("statement timeout")

    monkeypatch.setattr(driver_module, "sample_rollup", failing)
    monkeypatch.setattr(sampling, "FIRST_TURN_DELAY_SECONDS", 0.0)
    monkeypatch.setattr(sampling, "INTERVAL_SECONDS", 0.05)
    with Supervisor(engine, rl.JobRegistry(), fast_config()) as supervisor:
        wait_until(lambda: len(turns) >= 2, what="the sampler tries again after a failure")
        assert supervisor.failure is None
    assert "sampler step failed" in caplog.text
    assert sampler_threads() == []
    with Supervisor(engine, rl.JobRegistry(), fast_config(), run_reaper=False):
        assert sampler_threads() == []
