"""The supervisor's pruner: it deletes finished jobs past the retention while the worker runs, and never stops it."""

from __future__ import annotations

import threading
from datetime import timedelta

from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.runtime.supervisor.supervisor import Supervisor
from runledger_sync.store import driver as driver_module
from tests.handlers import fast_config
from tests.support import define, scalar, wait_until

RETENTION = rl.Retention(succeeded=timedelta(days=1), canceled=None, dead_lettered=None, workflow_runs=None)


def old_succeeded_job(engine) -> object:
    job_id = rl.enqueue(engine, "test.job", {}).id
    with engine.begin() as connection:
        connection.execute(text("UPDATE job_queue SET status = 'SUCCEEDED', finished_at = now() - interval '2 days' "
                                "WHERE id = :id"), {"id": job_id})
    return job_id


def pruner_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("runledger-pruner-")]


def test_the_supervisor_prunes_old_finished_jobs_while_it_runs(engine):
    define(engine)
    old = old_succeeded_job(engine)
    config = fast_config(retention=RETENTION, prune_interval_seconds=0.1)

    with Supervisor(engine, rl.JobRegistry(), config):
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM job_queue WHERE id = :id", id=old) == 0,
                   what="the pruner deletes the old job")
        later = old_succeeded_job(engine)
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM job_queue WHERE id = :id", id=later) == 0,
                   what="the next turn deletes the next one")
    assert pruner_threads() == []


def test_no_pruner_without_a_retention_or_without_the_reaper(engine):
    for config, run_reaper in ((fast_config(retention=None), True), (fast_config(retention=RETENTION), False)):
        with Supervisor(engine, rl.JobRegistry(), config, run_reaper=run_reaper):
            assert pruner_threads() == []


def test_a_failing_prune_is_logged_and_the_worker_goes_on(engine, monkeypatch, caplog):
    define(engine)
    turns = []

    def failing(*args, **kwargs):
        turns.append(1)
        raise rl.StoreError("statement timeout")

    monkeypatch.setattr(driver_module, "prune", failing)
    registry = rl.JobRegistry()
    done = threading.Event()

    @registry.job("test.job")
    def handler(ctx, payload):
        done.set()

    config = fast_config(retention=RETENTION, prune_interval_seconds=0.05)
    with Supervisor(engine, registry, config) as supervisor:
        wait_until(lambda: len(turns) >= 2, what="the pruner tries again after a failure")
        rl.enqueue(engine, "test.job", {})
        assert done.wait(10)
        assert supervisor.failure is None and supervisor.health(check_database=False).live
    assert "pruner step failed" in caplog.text
