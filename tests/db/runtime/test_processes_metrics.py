"""Supervisor(processes=N, observer=WorkerMetrics()): the worker processes' counts, summed where the parent collects."""

from __future__ import annotations

import os
import signal
from typing import Optional

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import runledger_sync as rl
from runledger_sync.metrics import WorkerMetrics, registry_for
from runledger_sync.runtime.supervisor.supervisor import Supervisor
from tests import process_app
from tests.db.runtime.test_processes import APP, START_TIMEOUT, app_database, succeeded, supervisors  # noqa: F401
from tests.handlers import fast_config
from tests.support import wait_until


def succeeded_count(registry) -> float:
    return sum(sample.value for family in text_string_to_metric_families(generate_latest(registry).decode())
               for sample in family.samples
               if sample.name == "runledger_jobs_total" and sample.labels.get("outcome") == "succeeded")


def spawned_pid(logs, worker_id: str) -> Optional[int]:
    return next((record.pid for record in logs.records
                 if record.getMessage() == "worker process spawned" and record.worker_id == worker_id), None)


def test_a_killed_processs_counts_stay_in_the_sum_and_close_removes_the_directory(
        app_database, supervisors, logs):  # noqa: F811 - the fixtures imported above
    engine = app_database
    metrics = WorkerMetrics()
    registry = registry_for(engine, worker=metrics)
    config = fast_config(worker_id="counted", max_global_concurrency=1)
    supervisor = Supervisor(engine, process_app.registry, config, processes=2, app=APP, observer=metrics)
    supervisors.append(supervisor)
    assert metrics.directory is None  # nothing is made for a group that never starts
    supervisor.start()
    directory = metrics.directory
    assert directory is not None and os.stat(directory).st_mode & 0o777 == 0o700
    rl.enqueue_many(engine, [rl.JobSpec("proc.quick", {"n": n}) for n in range(3)])
    wait_until(lambda: succeeded(engine) == 3, timeout=START_TIMEOUT)
    wait_until(lambda: succeeded_count(registry) == 3, timeout=10)

    victim = wait_until(lambda: spawned_pid(logs, "counted-p0"), timeout=START_TIMEOUT)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: spawned_pid(logs, "counted-p0-r1"), timeout=START_TIMEOUT)
    assert succeeded_count(registry) == 3  # the dead process's counts are kept
    rl.enqueue_many(engine, [rl.JobSpec("proc.quick", {"n": n}) for n in range(3, 5)])
    wait_until(lambda: succeeded(engine) == 5, timeout=START_TIMEOUT)
    wait_until(lambda: succeeded_count(registry) == 5, timeout=10)
    assert supervisor.stop(timeout=30) is True

    metrics.close()
    assert not os.path.exists(directory) and metrics.directory is None
    assert succeeded_count(registry) == 0  # this process ran no job itself


def test_an_observer_that_cannot_follow_worker_processes_is_refused():
    class Claims:
        def claimed(self, jobs): ...

        def job_finished(self, job_type, outcome, handler_seconds): ...

        def group_written(self, writer, size, seconds): ...

        def heartbeat_failed(self, job_type): ...

    with pytest.raises(rl.ConfigError, match="has no worker_process_observer") as refused:
        Supervisor(None, process_app.registry, fast_config(), processes=2, app=APP, observer=Claims())
    assert refused.value.code == "config.invalid"
