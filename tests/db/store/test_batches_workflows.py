"""Workflow runs as batch members: a run is ONE member, pending until it ends, counted by its final status."""

from __future__ import annotations

import threading

import pytest

import runledger_sync as rl
from runledger_sync.core.batch import BatchStatus
from runledger_sync.core.batch_errors import BatchClosed, BatchNotFound
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.types import JobFailure
from runledger_sync.core.workflow import WorkflowRunStatus, WorkflowStepStatus
from runledger_sync.core.workflow_errors import WorkflowEnqueueConflictingRetry
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success
from runledger_sync.store.attempt.running import mark_job_running
from runledger_sync.store.batches.batches import cancel_batch, close_batch, get_batch, open_batch
from runledger_sync.store.claim.claim import claim_prestart_jobs_for_types
from runledger_sync.store.enqueue.enqueue import enqueue
from tests.support import JOB_TYPE, define, identity, rows, scalar

STEP = "test.step"
REPORT = "test.report"
DONE = "test.done"


@pytest.fixture
def defined(engine):
    for job_type in (JOB_TYPE, STEP, REPORT, DONE):
        define(engine, job_type)
    return engine


def counts(batch) -> tuple[int, int, int, int, int]:
    return batch.total, batch.pending, batch.succeeded, batch.failed, batch.canceled


def callbacks(engine, job_type: str) -> list:
    return rows(engine, "SELECT id, payload FROM job_queue WHERE job_type = :t", t=job_type)


def two_steps(name: str = "wf.pair", **options) -> rl.Workflow:
    wf = rl.Workflow(name, **options)
    first = wf.job("first", STEP, {"n": 1})
    wf.job("second", STEP, {"n": 2}, after=[first])
    return wf


def claim(engine, limit: int = 1) -> list:
    return claim_prestart_jobs_for_types(engine, worker_id="w", lease_ttl_seconds=30, limit=limit,
                                         job_types=[JOB_TYPE, STEP])


def drain(engine) -> int:
    """Claim and succeed every member job and step job until none is left; return how many ran."""
    done = 0
    while jobs := claim(engine, limit=10):
        for job in jobs:
            complete_job_success(engine, **identity(job))
            done += 1
    return done


def test_a_batch_of_runs_and_jobs_counts_each_run_once_and_enqueues_the_callbacks_once(defined):
    batch = open_batch(defined, on_success=(REPORT, {}), on_complete=(DONE, {}))
    runs = [rl.enqueue_workflow(defined, two_steps(), batch=batch.id) for _ in range(3)]
    for n in range(2):
        enqueue(defined, JOB_TYPE, {"n": n}, batch=batch.id)
    opened = get_batch(defined, batch.id)
    assert counts(opened) == (5, 5, 0, 0, 0) and opened.runs == 3

    # The first steps and the jobs end; each run's second step is released after the close.
    for job in claim(defined, limit=5):
        complete_job_success(defined, **identity(job))
    assert counts(get_batch(defined, batch.id)) == (5, 3, 2, 0, 0)
    assert close_batch(defined, batch.id).status is BatchStatus.CLOSED
    assert drain(defined) == 3

    done = get_batch(defined, batch.id)
    assert done.status is BatchStatus.SUCCEEDED and counts(done) == (5, 0, 5, 0, 0) and done.runs == 3
    assert all(rl.get_workflow_run(defined, run.id).status is WorkflowRunStatus.SUCCEEDED for run in runs)
    assert [row.id for row in callbacks(defined, REPORT)] == [done.on_success_job_id]
    assert [row.id for row in callbacks(defined, DONE)] == [done.on_complete_job_id]
    assert callbacks(defined, DONE)[0].payload == {"batch_id": str(batch.id)}
    # Step jobs are not members themselves: only the two plain jobs carry the batch.
    assert scalar(defined, "SELECT count(*) FROM job_queue WHERE batch_id = :b", b=batch.id) == 2


def test_a_run_with_a_dead_lettered_step_fails_its_member_and_the_batch_completes_with_errors(defined):
    batch = open_batch(defined, on_success=(REPORT, {}), on_complete=(DONE, {}))
    run = rl.enqueue_workflow(defined, two_steps(), batch=batch.id)
    close_batch(defined, batch.id)
    [job] = claim(defined)
    complete_job_failure(defined, **identity(job), failure=JobFailure.terminal("test.boom", "boom"),
                         retry_delay_ms=None)
    # The second step waits for the first's end (any end): the run is pending until it runs.
    assert get_batch(defined, batch.id).pending == 1
    assert drain(defined) == 1

    assert rl.get_workflow_run(defined, run.id).status is WorkflowRunStatus.COMPLETED_WITH_ERRORS
    done = get_batch(defined, batch.id)
    assert done.status is BatchStatus.COMPLETED_WITH_ERRORS and counts(done) == (1, 0, 0, 1, 0)
    assert callbacks(defined, REPORT) == [] and len(callbacks(defined, DONE)) == 1


def test_a_run_that_ends_at_its_enqueue_is_counted_ended_at_once(defined):
    batch = open_batch(defined, on_complete=(DONE, {}))
    wf = rl.Workflow("wf.gate")
    wf.external("approval")
    run = rl.enqueue_workflow(defined, wf, batch=batch.id)
    assert counts(get_batch(defined, batch.id)) == (1, 1, 0, 0, 0)
    close_batch(defined, batch.id)
    # Waiting for an answer is still pending; the answer ends the run and the batch.
    assert get_batch(defined, batch.id).status is BatchStatus.CLOSED
    rl.complete_external_step(defined, run.id, "approval", succeeded=True)
    assert get_batch(defined, batch.id).status is BatchStatus.SUCCEEDED
    assert len(callbacks(defined, DONE)) == 1


@pytest.mark.parametrize("finish", ["close", "cancel", "missing"])
def test_a_run_joining_a_batch_that_is_not_open_is_refused_and_writes_nothing(defined, finish):
    batch = open_batch(defined)
    target = batch.id
    if finish == "close":
        close_batch(defined, batch.id)
    elif finish == "cancel":
        cancel_batch(defined, batch.id)
    else:
        target = rl.open_batch(defined).id
        with defined.begin() as conn:
            conn.exec_driver_sql("DELETE FROM job_batches WHERE id = %(b)s", {"b": target})
    error = BatchNotFound if finish == "missing" else BatchClosed
    with pytest.raises(error) as raised:
        rl.enqueue_workflow(defined, two_steps(), batch=target)
    assert raised.value.code == ("batch.not_found" if finish == "missing" else "batch.closed")
    assert scalar(defined, "SELECT count(*) FROM workflow_runs") == 0
    assert scalar(defined, "SELECT count(*) FROM job_queue") == 0


def test_an_idempotent_repeat_adds_no_member_and_another_batch_is_a_conflict(defined):
    batch = open_batch(defined)
    first = rl.enqueue_workflow(defined, two_steps(idempotency_key="k"), batch=batch.id)
    again = rl.enqueue_workflow(defined, two_steps(idempotency_key="k"), batch=batch.id)
    assert again.id == first.id and counts(get_batch(defined, batch.id)) == (1, 1, 0, 0, 0)
    other = open_batch(defined)
    with pytest.raises(WorkflowEnqueueConflictingRetry):
        rl.enqueue_workflow(defined, two_steps(idempotency_key="k"), batch=other.id)
    assert counts(get_batch(defined, other.id)) == (0, 0, 0, 0, 0)


def test_cancel_batch_cancels_a_running_member_run_through_the_workflow_cancel(defined):
    batch = open_batch(defined, on_complete=(DONE, {}))
    run = rl.enqueue_workflow(defined, two_steps(), batch=batch.id)
    plain = enqueue(defined, JOB_TYPE, batch=batch.id)
    [job] = claim_prestart_jobs_for_types(defined, worker_id="w", lease_ttl_seconds=30, limit=1, job_types=[STEP])
    mark_job_running(defined, LeaseIdentity.of(job))

    canceled = cancel_batch(defined, batch.id, reason="stop")
    assert canceled.status is BatchStatus.CANCELED and counts(canceled) == (2, 0, 0, 0, 2)
    after = rl.get_workflow_run(defined, run.id)
    assert after.status is WorkflowRunStatus.CANCELED and after.status_reason == "stop"
    assert after.step("second").status is WorkflowStepStatus.CANCELED
    assert rl.get_job(defined, plain.id).status is rl.JobStatus.CANCELED

    # The step a worker held runs to its end; the run stays canceled and the batch's counts stay.
    complete_job_success(defined, **identity(job))
    assert rl.get_workflow_run(defined, run.id).status is WorkflowRunStatus.CANCELED
    assert counts(get_batch(defined, batch.id)) == (2, 0, 0, 0, 2)
    assert callbacks(defined, DONE) == []


@pytest.mark.parametrize("close_first", [True, False])
def test_a_close_racing_the_runs_end_enqueues_the_callbacks_once(defined, close_first):
    rounds = 5
    for round_ in range(rounds):
        batch = open_batch(defined, on_complete=(DONE, {"round": str(round_)}))
        wf = rl.Workflow("wf.one")
        wf.job("only", STEP)
        run = rl.enqueue_workflow(defined, wf, batch=batch.id)
        [job] = claim(defined)
        go = threading.Barrier(2)

        def close(go=go, batch=batch):
            go.wait()
            close_batch(defined, batch.id)

        def end(go=go, job=job):
            go.wait()
            complete_job_success(defined, **identity(job))

        threads = [threading.Thread(target=f) for f in ((close, end) if close_first else (end, close))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert rl.get_workflow_run(defined, run.id).status is WorkflowRunStatus.SUCCEEDED
        done = get_batch(defined, batch.id)
        assert done.status is BatchStatus.SUCCEEDED and counts(done) == (1, 0, 1, 0, 0)
    assert sorted(row.payload["round"] for row in callbacks(defined, DONE)) == [str(n) for n in range(rounds)]


def test_pruning_a_finished_batch_keeps_its_member_run_for_the_runs_own_retention(defined):
    keep_ages = dict(succeeded=None, canceled=None, dead_lettered=None, workflow_runs=None, dashboard_rollup=None)
    batch = open_batch(defined)
    run = rl.enqueue_workflow(defined, two_steps(), batch=batch.id)
    close_batch(defined, batch.id)
    drain(defined)
    assert get_batch(defined, batch.id).status is BatchStatus.SUCCEEDED
    with defined.begin() as conn:
        conn.exec_driver_sql("UPDATE job_batches SET finished_at = finished_at - interval '40 days'")

    assert rl.prune(defined, rl.Retention(**keep_ages)).job_batches == 1
    assert get_batch(defined, batch.id) is None
    assert rl.get_workflow_run(defined, run.id).status is WorkflowRunStatus.SUCCEEDED
    assert scalar(defined, "SELECT batch_id FROM workflow_runs WHERE id = :r", r=run.id) is None
