"""A run's cancel racing its jobs' completions: nothing released after the cancel, no completion lost."""

from __future__ import annotations

import threading

import runledger_sync as rl
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.workflow import WorkflowRunStatus as Run
from runledger_sync.core.workflow import WorkflowStepStatus as Step
from runledger_sync.store.attempt.ends import complete_job_success
from runledger_sync.store.attempt.running import mark_job_running
from runledger_sync.store.claim.claim import claim_prestart_jobs_for_types
from runledger_sync.store.maintenance.reaper import reap_expired_leases
from tests.support import define, expire_lease, scalar

FIRST, SECOND = "race.first", "race.second"
RUNS = 200


def race_once(engine, index: int, outcomes: dict) -> None:
    wf = rl.Workflow("race")
    first = wf.job("first", FIRST, {"i": index})
    wf.job("second", SECOND, after=[first])
    run = rl.enqueue_workflow(engine, wf)
    job = claim_prestart_jobs_for_types(
        engine, worker_id="w", lease_ttl_seconds=30, limit=1, job_types=[FIRST])[0]
    identity = LeaseIdentity.of(job)
    mark_job_running(engine, identity)
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def complete() -> None:
        start.wait()
        try:
            complete_job_success(engine, **identity.keywords())
        except rl.errors.WorkflowReleaseConflict as conflict:
            errors.append(conflict)

    completer = threading.Thread(target=complete)
    completer.start()
    start.wait()
    rl.cancel_workflow_run(engine, run.id)
    completer.join(10)

    if errors:
        outcomes["conflict"] += 1
        assert rl.get_job(engine, job.id).status is rl.JobStatus.LEASED
        # Once the cancel has committed the job is finished: by a later completion, or by the reaper.
        if index % 2:
            complete_job_success(engine, **identity.keywords())
        else:
            expire_lease(engine, job.id)
            assert reap_expired_leases(engine, limit=10, default_retry_delay_ms=1).processed == 1
    else:
        outcomes["written"] += 1
    final = rl.get_workflow_run(engine, run.id)
    assert final.status is Run.CANCELED
    second = final.step("second")
    assert second.status is Step.CANCELED
    # Released before the cancel (then cancelled with it), or never.
    if second.job_id is not None:
        assert rl.get_job(engine, second.job_id).status is rl.JobStatus.CANCELED
    assert final.step("first").status in (Step.SUCCEEDED, Step.FAILED)


def test_cancel_racing_completions_never_releases_after_the_cancel_and_loses_no_completion(engine):
    define(engine, FIRST, max_attempts=1)
    define(engine, SECOND)
    outcomes = {"conflict": 0, "written": 0}

    for index in range(RUNS):
        race_once(engine, index, outcomes)

    # The conflict path was taken (in practice most of the time: the cancel's lock comes first).
    assert outcomes["conflict"] > 0
    assert scalar(engine, "SELECT count(*) FROM job_queue WHERE status = 'LEASED'") == 0
    assert scalar(engine, "SELECT count(*) FROM job_queue WHERE job_type = :t AND status <> 'CANCELED'",
                  t=SECOND) == 0
    assert scalar(engine, "SELECT count(*) FROM workflow_runs WHERE status <> 'CANCELED'") == 0
    assert scalar(engine, "SELECT count(*) FROM job_queue WHERE job_type = :t AND status IN "
                          "('SUCCEEDED', 'DEAD_LETTERED')", t=FIRST) == RUNS
