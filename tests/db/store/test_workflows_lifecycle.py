"""A workflow step follows its job through the store's transitions, and its end releases or cancels its dependents."""

from __future__ import annotations

import pytest

import runledger_sync as rl
from runledger_sync.store.workflows.steps import ADVISORY_LOCK_NAMESPACE
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.workflow import WorkflowRunStatus as Run
from runledger_sync.core.workflow import WorkflowStepStatus as Step
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success, release_unstarted_job_claim
from runledger_sync.store.attempt.running import mark_jobs_running
from runledger_sync.store.workflows.runs import step_output
from runledger_sync.store.claim.claim import claim_prestart_jobs_for_types
from runledger_sync.store.attempt.running import mark_job_running
from runledger_sync.store.maintenance.reaper import reap_expired_leases
from tests.support import define, expire_lease, scalar, write_successes

A, B, C = "wf.a", "wf.b", "wf.c"


@pytest.fixture
def typed(engine):
    for job_type in (A, B, C):
        define(engine, job_type, max_attempts=2)
    return engine


def claim(engine, job_type: str, worker: str = "worker-a"):
    jobs = claim_prestart_jobs_for_types(
        engine, worker_id=worker, lease_ttl_seconds=30, limit=1, job_types=[job_type])
    assert len(jobs) == 1, f"expected one {job_type} job, got {len(jobs)}"
    return jobs[0]


def succeed(engine, job_type: str, output=None):
    job = claim(engine, job_type)
    mark_job_running(engine, LeaseIdentity.of(job))
    return complete_job_success(
        engine, **LeaseIdentity.of(job).keywords(), completion=rl.JobCompletion(output=output))


def fail(engine, job_type: str, kind=rl.JobFailureKind.TERMINAL):
    job = claim(engine, job_type)
    return complete_job_failure(
        engine, **LeaseIdentity.of(job).keywords(), failure=rl.JobFailure(kind, "boom", "it broke"), retry_delay_ms=0)


def statuses(engine, run_id) -> dict[str, Step]:
    return {step.key: step.status for step in rl.get_workflow_run(engine, run_id).steps}


def chain(release: str) -> rl.Workflow:
    """a -> b -> c, both edges released by ``release``."""
    wf = rl.Workflow("chain")
    a = wf.job("a", A)
    b = wf.job("b", B, after=[a], release=release)
    wf.job("c", C, after=[b], release=release)
    return wf


def test_claim_runs_the_step_and_an_unstarted_release_hands_it_back(typed):
    run = rl.enqueue_workflow(typed, chain("on_terminal"))
    job = claim(typed, A)
    assert statuses(typed, run.id)["a"] is Step.RUNNING

    release_unstarted_job_claim(typed, **LeaseIdentity.of(job).keywords(), reason="test", delay_ms=0)

    assert statuses(typed, run.id)["a"] is Step.ENQUEUED


def test_a_success_releases_the_next_step_and_the_last_one_ends_the_run(typed):
    run = rl.enqueue_workflow(typed, chain("on_success"))

    succeed(typed, A, output={"charged": 5})
    assert statuses(typed, run.id) == {"a": Step.SUCCEEDED, "b": Step.ENQUEUED, "c": Step.BLOCKED}
    succeed(typed, B)
    succeed(typed, C)

    final = rl.get_workflow_run(typed, run.id)
    assert final.status is Run.SUCCEEDED and final.finished_at is not None
    assert final.step("a").output == {"charged": 5}
    assert step_output(typed, run.id, "a") == {"charged": 5}
    assert scalar(typed, "SELECT count(*) FROM job_queue") == 3


def test_a_retry_keeps_the_step_running(typed):
    run = rl.enqueue_workflow(typed, chain("on_terminal"))

    retried = fail(typed, A, kind=rl.JobFailureKind.RETRYABLE)

    assert retried.status is rl.JobStatus.PENDING
    assert statuses(typed, run.id)["a"] is Step.RUNNING
    assert statuses(typed, run.id)["b"] is Step.BLOCKED


def test_on_success_after_a_dead_letter_cancels_the_dependent_and_its_descendants(typed):
    run = rl.enqueue_workflow(typed, chain("on_success"))

    fail(typed, A)

    final = rl.get_workflow_run(typed, run.id)
    assert {s.key: s.status for s in final.steps} == {"a": Step.FAILED, "b": Step.CANCELED, "c": Step.CANCELED}
    assert final.step("a").error_code == "boom"
    assert final.step("b").error_code == "workflow.dependency_unsatisfied"
    assert final.status is Run.COMPLETED_WITH_ERRORS
    assert scalar(typed, "SELECT count(*) FROM job_queue") == 1


def test_on_terminal_after_a_dead_letter_releases_the_dependent(typed):
    run = rl.enqueue_workflow(typed, chain("on_terminal"))

    fail(typed, A)

    assert statuses(typed, run.id) == {"a": Step.FAILED, "b": Step.ENQUEUED, "c": Step.BLOCKED}
    assert rl.get_workflow_run(typed, run.id).status is Run.RUNNING


def test_a_cancelled_step_still_releases_an_on_terminal_dependent(typed):
    wf = rl.Workflow("mixed")
    a = wf.job("a", A)
    b = wf.job("b", B, after=[a], release="on_success")
    wf.job("c", C, after=[b])
    run = rl.enqueue_workflow(typed, wf)

    fail(typed, A)

    assert statuses(typed, run.id) == {"a": Step.FAILED, "b": Step.CANCELED, "c": Step.ENQUEUED}


def test_an_operator_cancel_of_a_step_job_ends_the_step(typed):
    run = rl.enqueue_workflow(typed, chain("on_success"))

    rl.cancel_job(typed, rl.get_workflow_run(typed, run.id).step("a").job_id)

    assert statuses(typed, run.id) == {"a": Step.CANCELED, "b": Step.CANCELED, "c": Step.CANCELED}


def test_the_reaper_dead_letter_ends_the_step(typed):
    run = rl.enqueue_workflow(typed, chain("on_terminal"))
    for _ in range(2):
        job = claim(typed, A)
        mark_job_running(typed, LeaseIdentity.of(job))
        expire_lease(typed, job.id)
        reap_expired_leases(typed, limit=10, default_retry_delay_ms=1)
        if job.attempt == 1:
            assert statuses(typed, run.id)["a"] is Step.RUNNING
            with typed.begin() as connection:
                connection.exec_driver_sql("UPDATE job_queue SET next_run_at = now()")

    assert statuses(typed, run.id) == {"a": Step.FAILED, "b": Step.ENQUEUED, "c": Step.BLOCKED}


def test_requeue_of_a_workflow_job_is_refused(typed):
    run = rl.enqueue_workflow(typed, chain("on_terminal"))
    job = succeed(typed, A)

    with pytest.raises(rl.errors.WorkflowRequeueNotSupported) as caught:
        rl.requeue_job(typed, job.id)

    assert caught.value.code == "job.workflow_requeue_not_supported"
    assert rl.get_job(typed, job.id).status is rl.JobStatus.SUCCEEDED
    assert statuses(typed, run.id)["b"] is Step.ENQUEUED


def test_fan_in_waits_for_every_prerequisite(typed):
    wf = rl.Workflow("fan")
    branches = [wf.job(f"b{i}", A) for i in range(3)]
    wf.job("join", B, after=branches)
    run = rl.enqueue_workflow(typed, wf)

    for _ in range(2):
        succeed(typed, A)
    assert statuses(typed, run.id)["join"] is Step.BLOCKED
    succeed(typed, A)

    joined = rl.get_workflow_run(typed, run.id).step("join")
    assert (joined.status, joined.dependencies_pending) == (Step.ENQUEUED, 0)


# -- external steps ----------------------------------------------------------------


def gated() -> rl.Workflow:
    wf = rl.Workflow("gated")
    a = wf.job("a", A)
    gate = wf.external("approval", after=[a], release="on_success")
    wf.job("after", B, after=[gate], release="on_success")
    return wf


def test_an_external_step_waits_then_its_answer_releases_its_dependent(typed):
    run = rl.enqueue_workflow(typed, gated())
    with pytest.raises(rl.errors.ExternalStepNotWaiting):
        rl.complete_external_step(typed, run.id, "approval")
    succeed(typed, A)
    waiting = rl.get_workflow_run(typed, run.id)
    assert waiting.step("approval").status is Step.WAITING_FOR_EXTERNAL

    answered = rl.complete_external_step(typed, run.id, "approval", succeeded=True, output={"by": "ada"})

    assert answered.step("approval").status is Step.SUCCEEDED
    assert answered.step("approval").output == {"by": "ada"}
    assert answered.step("after").status is Step.ENQUEUED
    again = rl.complete_external_step(typed, run.id, "approval", succeeded=True, output={"by": "ada"})
    assert again.step("after").job_id == answered.step("after").job_id


def test_a_run_that_only_an_answer_can_move_waits_for_external_and_runs_again_once_answered(typed):
    run = rl.enqueue_workflow(typed, gated())
    succeed(typed, A)

    waiting = rl.get_workflow_run(typed, run.id)
    # The gate's dependent is BLOCKED behind it: that is waiting too, not running.
    assert (waiting.status, waiting.step("after").status) == (Run.WAITING_FOR_EXTERNAL, Step.BLOCKED)
    assert waiting.finished_at is None
    assert [r.id for r in rl.list_workflow_runs(typed, status="WAITING_FOR_EXTERNAL")] == [run.id]
    assert rl.list_workflow_runs(typed, status=Run.RUNNING) == []

    assert rl.complete_external_step(typed, run.id, "approval", succeeded=True).status is Run.RUNNING
    succeed(typed, B)

    final = rl.get_workflow_run(typed, run.id)
    assert (final.status, final.finished_at is not None) == (Run.SUCCEEDED, True)


def test_a_running_job_step_keeps_a_run_with_a_waiting_gate_running(typed):
    wf = rl.Workflow("gate-and-work")
    a = wf.job("a", A)
    wf.external("approval")
    wf.job("b", B, after=[a])
    run = rl.enqueue_workflow(typed, wf)
    assert run.status is Run.RUNNING  # a is ENQUEUED

    job = claim(typed, A)
    mark_job_running(typed, LeaseIdentity.of(job))
    assert statuses(typed, run.id) == {"a": Step.RUNNING, "approval": Step.WAITING_FOR_EXTERNAL, "b": Step.BLOCKED}
    assert rl.get_workflow_run(typed, run.id).status is Run.RUNNING

    complete_job_success(typed, **LeaseIdentity.of(job).keywords(), completion=rl.JobCompletion())
    assert (statuses(typed, run.id)["b"], rl.get_workflow_run(typed, run.id).status) == (Step.ENQUEUED, Run.RUNNING)
    succeed(typed, B)
    # Only the gate is left.
    assert rl.get_workflow_run(typed, run.id).status is Run.WAITING_FOR_EXTERNAL


def test_a_failed_answer_cancels_an_on_success_dependent(typed):
    run = rl.enqueue_workflow(typed, gated())
    succeed(typed, A)

    answered = rl.complete_external_step(typed, run.id, "approval", succeeded=False)

    assert (answered.step("approval").status, answered.step("after").status) == (Step.FAILED, Step.CANCELED)
    assert answered.status is Run.COMPLETED_WITH_ERRORS


@pytest.mark.parametrize(
    ("key", "kwargs", "error"),
    [
        ("approval", {"succeeded": False}, rl.errors.ExternalStepConflictingCompletion),
        ("approval", {"output": {"by": "bob"}}, rl.errors.ExternalStepConflictingOutput),
        ("a", {}, rl.errors.ExternalStepNotExternal),
        ("nope", {}, rl.errors.ExternalStepNotFound),
        ("approval", {"succeeded": "yes"}, rl.errors.ExternalStepInvalidTerminalStatus),
        ("approval", {"succeeded": False, "output": 1}, rl.errors.ExternalStepOutputInvalidStatus),
    ],
)
def test_external_completion_errors_have_codes_and_change_nothing(typed, key, kwargs, error):
    run = rl.enqueue_workflow(typed, gated())
    succeed(typed, A)
    before = rl.complete_external_step(typed, run.id, "approval", output={"by": "ada"})

    with pytest.raises(error) as caught:
        rl.complete_external_step(typed, run.id, key, **kwargs)

    assert caught.value.code.startswith("workflow.external_step_")
    assert rl.get_workflow_run(typed, run.id).steps == before.steps


def test_external_completion_of_an_unknown_run_is_run_not_found(typed):
    with pytest.raises(rl.WorkflowRunNotFound):
        rl.complete_external_step(typed, "0193b6a0-0000-7000-8000-000000000000", "approval")


# -- cancel --------------------------------------------------------------------------


def test_cancel_stops_every_unstarted_step_and_a_running_job_then_releases_nothing(typed):
    wf = rl.Workflow("cancel")
    a = wf.job("a", A)
    wf.job("a2", A)
    wf.job("b", B, after=[a])
    wf.external("gate", after=[a])
    run = rl.enqueue_workflow(typed, wf)
    running = claim(typed, A)

    canceled = rl.cancel_workflow_run(typed, run.id, reason="customer left")

    assert canceled.status is Run.CANCELED and canceled.status_reason == "customer left"
    steps = {s.key: s for s in canceled.steps}
    running_key = "a" if steps["a"].job_id == running.id else "a2"
    other_key = "a2" if running_key == "a" else "a"
    assert steps[running_key].status is Step.RUNNING
    assert {steps[k].status for k in (other_key, "b", "gate")} == {Step.CANCELED}
    assert rl.get_job(typed, steps[other_key].job_id).status is rl.JobStatus.CANCELED

    mark_job_running(typed, LeaseIdentity.of(running))
    complete_job_success(typed, **LeaseIdentity.of(running).keywords())

    after = rl.get_workflow_run(typed, run.id)
    assert after.status is Run.CANCELED
    assert after.step(running_key).status is Step.SUCCEEDED
    assert scalar(typed, "SELECT count(*) FROM job_queue") == 2
    assert rl.cancel_workflow_run(typed, run.id).status is Run.CANCELED


def test_cancel_of_a_finished_run_or_an_unknown_one_is_refused(typed):
    wf = rl.Workflow("one")
    wf.job("a", A)
    run = rl.enqueue_workflow(typed, wf)
    succeed(typed, A)

    with pytest.raises(rl.errors.WorkflowRunFinished):
        rl.cancel_workflow_run(typed, run.id)
    with pytest.raises(rl.WorkflowRunNotFound):
        rl.cancel_workflow_run(typed, "0193b6a0-0000-7000-8000-000000000000")
    assert rl.get_workflow_run(typed, run.id).status is Run.SUCCEEDED


def hold_cancel_lock(engine, run_id):
    """Open a transaction holding the run's advisory lock exclusively, as a cancel in progress does."""
    connection = engine.connect()
    connection.begin()
    connection.exec_driver_sql(
        "SELECT pg_advisory_xact_lock(%(namespace)s, hashtext(%(id)s::text))",
        {"namespace": ADVISORY_LOCK_NAMESPACE, "id": str(run_id)})
    return connection


def test_a_completion_while_a_cancel_holds_the_run_writes_nothing(typed):
    run = rl.enqueue_workflow(typed, chain("on_terminal"))
    job = claim(typed, A)
    mark_job_running(typed, LeaseIdentity.of(job))
    holder = hold_cancel_lock(typed, run.id)
    try:
        with pytest.raises(rl.errors.WorkflowReleaseConflict) as caught:
            complete_job_success(typed, **LeaseIdentity.of(job).keywords())
    finally:
        holder.rollback()
        holder.close()

    assert caught.value.code == "workflow.release_conflict"
    assert rl.get_job(typed, job.id).status is rl.JobStatus.LEASED
    assert statuses(typed, run.id) == {"a": Step.RUNNING, "b": Step.BLOCKED, "c": Step.BLOCKED}
    complete_job_success(typed, **LeaseIdentity.of(job).keywords())
    assert statuses(typed, run.id)["b"] is Step.ENQUEUED


def test_a_grouped_success_commits_the_plain_jobs_and_leaves_out_the_held_workflow_job(typed):
    run = rl.enqueue_workflow(typed, chain("on_terminal"))
    free = rl.Workflow("free")
    free.job("a", A)
    free_run = rl.enqueue_workflow(typed, free)
    for _ in range(3):
        rl.enqueue(typed, A, {})
    jobs = claim_prestart_jobs_for_types(typed, worker_id="w", lease_ttl_seconds=30, limit=10, job_types=[A])
    assert len(jobs) == 5
    mark_jobs_running(typed, [LeaseIdentity.of(job) for job in jobs])
    held_step = rl.get_workflow_run(typed, run.id).step("a").id
    holder = hold_cancel_lock(typed, run.id)
    try:
        results = write_successes(typed, [(LeaseIdentity.of(job), None) for job in jobs])
    finally:
        holder.rollback()
        holder.close()

    by_job = {job.id: result for job, result in zip(jobs, results, strict=True)}
    held = next(job for job in jobs if job.workflow_step_id == held_step)
    assert isinstance(by_job.pop(held.id), rl.errors.WorkflowReleaseConflict)
    assert set(by_job.values()) == {None}
    assert rl.get_job(typed, held.id).status is rl.JobStatus.LEASED
    assert all(rl.get_job(typed, job_id).status is rl.JobStatus.SUCCEEDED for job_id in by_job)
    assert rl.get_workflow_run(typed, free_run.id).status is Run.SUCCEEDED
    # The plain jobs were committed together (their rows carry the same xmin), the
    # free run's job in a transaction that could also end its step.
    plain = [job.id for job in jobs if job.workflow_step_id is None]
    assert len(plain) == 3
    assert scalar(typed, "SELECT count(DISTINCT xmin::text) FROM job_queue WHERE id = ANY(:ids)", ids=plain) == 1


def test_the_reaper_postpones_a_job_whose_run_a_cancel_holds_and_finishes_it_afterwards(typed):
    run = rl.enqueue_workflow(typed, chain("on_terminal"))
    for attempt in (1, 2):
        job = claim(typed, A)
        mark_job_running(typed, LeaseIdentity.of(job))
        if attempt == 1:
            complete_job_failure(
                typed, **LeaseIdentity.of(job).keywords(),
                failure=rl.JobFailure(rl.JobFailureKind.RETRYABLE, "again", "again"), retry_delay_ms=0)
    expire_lease(typed, job.id)
    holder = hold_cancel_lock(typed, run.id)
    try:
        held = reap_expired_leases(typed, limit=10, default_retry_delay_ms=60_000)
    finally:
        holder.rollback()
        holder.close()

    assert (held.failed_rows, held.dead_lettered) == (1, ())
    assert rl.get_job(typed, job.id).status is rl.JobStatus.LEASED
    assert statuses(typed, run.id)["a"] is Step.RUNNING

    expire_lease(typed, job.id)
    reaped = reap_expired_leases(typed, limit=10, default_retry_delay_ms=60_000)

    assert [dead.job_id for dead in reaped.dead_lettered] == [job.id]
    assert statuses(typed, run.id) == {"a": Step.FAILED, "b": Step.ENQUEUED, "c": Step.BLOCKED}


def test_a_grouped_success_in_the_callers_transaction_keeps_nothing_of_a_pass_a_cancel_refused(typed):
    held_run = rl.enqueue_workflow(typed, chain("on_terminal"))
    free = rl.Workflow("free")
    free.job("a", A)
    free_run = rl.enqueue_workflow(typed, free)
    jobs = claim_prestart_jobs_for_types(typed, worker_id="w", lease_ttl_seconds=30, limit=10, job_types=[A])
    assert len(jobs) == 2
    mark_jobs_running(typed, [LeaseIdentity.of(job) for job in jobs])
    held_step = rl.get_workflow_run(typed, held_run.id).step("a").id
    holder = hold_cancel_lock(typed, held_run.id)
    try:
        with typed.begin() as conn:
            # Both workflow jobs go in one pass, which the held run refuses; the pass is
            # written again without it, in the same (caller's) transaction.
            results = write_successes(conn, [(LeaseIdentity.of(job), None) for job in jobs])
    finally:
        holder.rollback()
        holder.close()

    by_step = {job.workflow_step_id: result for job, result in zip(jobs, results, strict=True)}
    assert isinstance(by_step.pop(held_step), rl.errors.WorkflowReleaseConflict)
    assert list(by_step.values()) == [None]
    held_job = next(job for job in jobs if job.workflow_step_id == held_step)
    assert rl.get_job(typed, held_job.id).status is rl.JobStatus.LEASED
    assert rl.get_workflow_run(typed, free_run.id).status is Run.SUCCEEDED


# -- output limits -------------------------------------------------------------------

BIG_OUTPUT = {"blob": "x" * 1_100_000}


def test_an_external_answer_over_the_output_limit_is_refused_and_the_step_keeps_waiting(typed):
    run = rl.enqueue_workflow(typed, gated())
    succeed(typed, A)

    with pytest.raises(rl.OutputTooLarge) as raised:
        rl.complete_external_step(typed, run.id, "approval", output=BIG_OUTPUT)
    assert raised.value.code == "job.output_too_large" and "xxxx" not in raised.value.message
    assert statuses(typed, run.id)["approval"] is Step.WAITING_FOR_EXTERNAL

    answered = rl.complete_external_step(typed, run.id, "approval", output=BIG_OUTPUT, max_output_bytes=2_000_000)
    assert answered.step("approval").output == BIG_OUTPUT


def test_a_job_success_over_the_output_limit_is_refused_and_the_lease_is_kept(typed):
    run = rl.enqueue_workflow(typed, chain("on_success"))
    job = claim(typed, A)
    identity = LeaseIdentity.of(job)
    mark_job_running(typed, identity)

    with pytest.raises(rl.OutputTooLarge):
        complete_job_success(typed, **identity.keywords(), completion=rl.JobCompletion(output=BIG_OUTPUT))
    with pytest.raises(rl.OutputTooLarge):
        write_successes(typed, [(identity, rl.JobCompletion(output=BIG_OUTPUT))])
    assert rl.get_job(typed, job.id).status is rl.JobStatus.LEASED
    assert statuses(typed, run.id)["a"] is Step.RUNNING

    [result] = write_successes(
        typed, [(identity, rl.JobCompletion(output=BIG_OUTPUT))], max_output_bytes=2_000_000)
    assert result is None and rl.get_job(typed, job.id).output == BIG_OUTPUT
