"""A running worker keeps its job_workers row fresh and deletes it on stop; it refuses a queue that does not exist."""

from __future__ import annotations

import os
import socket

import pytest
from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.runtime.loops import serving
from runledger_sync.runtime.supervisor.supervisor import Supervisor
from tests import process_app
from tests.handlers import fast_config
from tests.support import rows, scalar, wait_until

#: Spawning imports the library afresh in each child: allow for a busy 2-core machine.
START_TIMEOUT = 60


@pytest.fixture
def supervisors():
    made: list[Supervisor] = []
    yield made
    for supervisor in made:
        if not supervisor.stop(timeout=20) and supervisor._group is not None:
            supervisor._group.kill()


@pytest.fixture
def quick_rows(monkeypatch):
    """Rows written every 50 ms, so a test sees a refresh without waiting out the real interval."""
    monkeypatch.setattr(serving, "WORKER_ROW_INTERVAL_SECONDS", 0.05)


def mail_app() -> rl.JobRegistry:
    registry = rl.JobRegistry()
    registry.queue("mail", global_limit=2)

    @registry.job("row.mail", queue="mail")
    def mail(ctx, payload):
        return None

    @registry.job("row.report")
    def report(ctx, payload):
        return None

    return registry


def worker_rows(engine) -> list:
    return rows(engine, "SELECT worker_id, hostname, pid, queues, job_types, last_seen_at FROM job_workers "
                        "ORDER BY worker_id")


def test_a_running_worker_keeps_its_row_fresh_and_deletes_it_on_a_clean_stop(engine, supervisors, quick_rows):
    registry = mail_app()
    registry.sync_definitions(engine)
    supervisor = Supervisor(engine, registry, fast_config(worker_id="row-a", queues=("mail",)),
                            run_reaper=False, run_scheduler=False)
    supervisors.append(supervisor)
    supervisor.start()

    [row] = wait_until(lambda: worker_rows(engine))
    assert (row.worker_id, row.queues, row.job_types) == ("row-a", ["mail"], ["row.mail", "row.report"])
    assert (row.hostname, row.pid) == (socket.gethostname(), os.getpid())
    # An old sighting is written over while the worker runs.
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_workers SET last_seen_at = now() - interval '1 hour'"))
    wait_until(lambda: scalar(engine, "SELECT last_seen_at > now() - interval '10 seconds' FROM job_workers"))

    assert supervisor.stop(timeout=10) is True
    assert worker_rows(engine) == []


def test_the_row_tells_explain_wait_which_queue_and_types_are_served(engine, supervisors, quick_rows):
    registry = mail_app()
    registry.sync_definitions(engine)
    rl.pause_queue(engine, "mail")
    report = rl.enqueue(engine, "row.report", {})  # the default queue: this worker does not serve it
    supervisor = Supervisor(engine, registry, fast_config(worker_id="row-b", queues=("mail",)),
                            run_reaper=False, run_scheduler=False)
    supervisors.append(supervisor)
    supervisor.start()
    wait_until(lambda: worker_rows(engine))

    wait = rl.explain_wait(engine, report.id)
    assert wait.reason is rl.WaitReason.NO_WORKER
    assert wait.message == "no live worker serves queue 'default' and type 'row.report'"
    # Served but paused: the pause is the reason; resumed, the worker takes it.
    mail = rl.enqueue(engine, "row.mail", {})
    assert rl.explain_wait(engine, mail.id).reason is rl.WaitReason.QUEUE_PAUSED
    rl.resume_queue(engine, "mail")
    wait_until(lambda: rl.get_job(engine, mail.id).status is rl.JobStatus.SUCCEEDED)
    assert rl.get_job(engine, report.id).status is rl.JobStatus.PENDING


def test_a_row_that_cannot_be_written_is_logged_and_the_worker_runs_on(engine, supervisors, quick_rows, logs):
    registry = mail_app()
    registry.sync_definitions(engine)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE job_workers"))
    supervisor = Supervisor(engine, registry, fast_config(worker_id="row-c"), run_reaper=False, run_scheduler=False)
    supervisors.append(supervisor)
    supervisor.start()
    job = rl.enqueue(engine, "row.mail", {})

    wait_until(lambda: rl.get_job(engine, job.id).status is rl.JobStatus.SUCCEEDED)
    wait_until(lambda: [r for r in logs.records if r.getMessage() == "worker row step failed"])
    assert supervisor.stop(timeout=10) is True
    assert supervisor.failure is None
    assert [r for r in logs.records if r.getMessage() == "worker row could not be removed"]


@pytest.mark.parametrize("config", [
    {"queues": ("mail", "nosuch")},
    {"queue_concurrency": {"nosuch": 2}},
], ids=["queues", "queue_concurrency"])
def test_a_queue_that_does_not_exist_is_refused_at_start_before_any_claim(engine, supervisors, config):
    [setting] = config
    registry = mail_app()
    registry.sync_definitions(engine)
    job = rl.enqueue(engine, "row.mail", {})
    supervisor = Supervisor(engine, registry, fast_config(worker_id="row-d", **config))
    supervisors.append(supervisor)

    with pytest.raises(rl.QueueNotFound) as refused:
        supervisor.start()

    assert refused.value.code == "queue.not_found"
    assert refused.value.details == {"queue": "nosuch", "setting": setting}
    assert refused.value.message.startswith(f"jobs config {setting} names a queue that does not exist: 'nosuch' "
                                            "(known: default, mail); ")
    assert not supervisor.running
    assert rl.get_job(engine, job.id).status is rl.JobStatus.PENDING
    assert worker_rows(engine) == []


def test_a_queue_the_registry_declares_is_known_before_it_is_synced(engine, supervisors):
    registry = mail_app()  # nothing synced: no row for "mail" yet
    supervisor = Supervisor(engine, registry, fast_config(worker_id="row-e", queues=("mail",),
                                                          queue_concurrency={"mail": 1}),
                            run_reaper=False, run_scheduler=False)
    supervisors.append(supervisor)

    supervisor.start()

    assert supervisor.running


def test_each_worker_process_writes_its_own_row(engine, fresh_database, supervisors, monkeypatch):
    monkeypatch.setenv(process_app.URL_VARIABLE, fresh_database)
    process_app.registry.sync_definitions(engine)
    supervisor = Supervisor(engine, process_app.registry, fast_config(worker_id="rows"), processes=2,
                            app="tests.process_app:registry")
    supervisors.append(supervisor)
    supervisor.start()

    found = wait_until(lambda: len(worker_rows(engine)) == 2 and worker_rows(engine), timeout=START_TIMEOUT)
    assert [row.worker_id for row in found] == ["rows-p0", "rows-p1"]
    assert len({row.pid for row in found} | {os.getpid()}) == 3
    assert all(row.queues is None and row.job_types == process_app.registry.registered_types() for row in found)
    assert supervisor.stop(timeout=30) is True
    assert worker_rows(engine) == []
