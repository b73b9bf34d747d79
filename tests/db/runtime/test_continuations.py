"""Continuations and snoozes (spec T14), and retry hints, through the worker's pipeline on a real PostgreSQL.

A handler that returns ``JobCompletion(continue_after=...)`` or raises
``Snooze`` ends its run: the job goes back to PENDING as its next run, attempt
0, with its checkpoint, and spends no attempt. Each test claims the job as the
worker does and runs it in the test thread, so every outcome can be read back
as soon as ``process_claimed_job`` returns.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any, Callable

import pytest

import runledger_sync as rl
from runledger_sync.core import backoff
from runledger_sync.core.outcomes import Continue
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.workflow import WorkflowRunStatus as Run
from runledger_sync.core.workflow import WorkflowStepStatus as Step
from runledger_sync.runtime.attempt.run import process_claimed_job
from runledger_sync.store import driver
from runledger_sync.store.enqueue import enqueue as store_enqueue
from runledger_sync.store.driver import driver_for
from tests.handlers import fast_config
from tests.support import JOB_TYPE, attempts, claim_one, events, rows, run_worker_until, scalar

CONFIG = fast_config()


def registry_of(handler: Callable[[rl.JobContext, Any], Any], **options: Any) -> rl.JobRegistry:
    registry = rl.JobRegistry()
    registry.job(JOB_TYPE, **options)(handler)
    return registry


def run_once(engine: Any, registry: rl.JobRegistry) -> Any:
    """Claim the due job as the worker does and run it to its one outcome in this thread."""
    job = claim_one(engine, worker_id=CONFIG.worker_id, lease_ttl_seconds=CONFIG.lease_ttl_seconds)
    process_claimed_job(driver_for(engine), registry, job, CONFIG)
    return job_row(engine, job.id)


def job_row(engine: Any, job_id: Any) -> Any:
    return rows(engine, "SELECT * FROM job_queue WHERE id = :id", id=job_id)[0]


def enqueue(engine: Any, registry: rl.JobRegistry, **options: Any) -> rl.JobRecord:
    registry.sync_definitions(engine)
    return store_enqueue.enqueue(engine, JOB_TYPE, {"n": 1}, **options)


def continuations_of(engine: Any, job_id: Any) -> list[tuple[int, int, dict]]:
    return [(run, attempt, payload) for run, attempt, payload in (
        (row.run_number, row.attempt, row.payload) for row in rows(
            engine, "SELECT run_number, attempt, payload FROM job_events WHERE job_id = :id AND event_type = 'REQUEUED' "
                    "ORDER BY id", id=job_id))]


# -- a job that continues, snoozes, then succeeds ------------------------------------------------


def paging_handler(seen: list) -> Callable[[rl.JobContext, Any], Any]:
    def handler(ctx: rl.JobContext, payload: Any) -> Any:
        seen.append((ctx.run_number, ctx.attempt, ctx.checkpoint))
        if ctx.run_number == 1:
            return rl.JobCompletion(continue_after=timedelta(0), checkpoint={"page": 2})
        if ctx.run_number == 2:
            raise rl.Snooze(0)  # keeps {"page": 2}
        return rl.JobCompletion(output={"pages": ctx.checkpoint["page"]})
    return handler


def test_a_job_that_continues_then_snoozes_then_succeeds_runs_three_runs_of_one_attempt_each(engine):
    seen: list = []
    registry = registry_of(paging_handler(seen))
    job = enqueue(engine, registry, max_attempts=1)

    first = run_once(engine, registry)
    assert (first.status, first.run_number, first.attempt, first.stage) == ("PENDING", 2, 0, "queued")
    assert (first.checkpoint, first.continuations, first.status_reason) == ({"page": 2}, 1, "HANDLER_CONTINUATION")
    assert first.lease_expires_at is None and first.worker_id is None and first.finished_at is None
    second = run_once(engine, registry)
    assert (second.status, second.run_number, second.attempt, second.checkpoint) == ("PENDING", 3, 0, {"page": 2})
    done = run_once(engine, registry)

    # max_attempts 1 was never exhausted: no continuation spent an attempt.
    assert (done.status, done.run_number, done.attempt, done.continuations) == ("SUCCEEDED", 3, 1, 2)
    assert done.output == {"pages": 2}
    assert seen == [(1, 1, None), (2, 1, {"page": 2}), (3, 1, {"page": 2})]
    # One attempt per run, each closed: the runs that continued say so.
    assert [(a.run_number, a.attempt, a.outcome, a.finished_at is not None) for a in attempts(engine, job.id)] == [
        (1, 1, "CONTINUED", True), (2, 1, "CONTINUED", True), (3, 1, None, True)]
    requeued = continuations_of(engine, job.id)
    assert [(run, attempt, payload["reason"], payload["continue_after_ms"]) for run, attempt, payload in requeued] == [
        (1, 1, "HANDLER_CONTINUATION", 0), (2, 1, "HANDLER_CONTINUATION", 0)]
    assert [event for event, _, _ in events(engine, job.id)].count("RETRY_SCHEDULED") == 0


def test_a_snooze_waits_its_delay_by_the_database_clock(engine):
    registry = registry_of(lambda ctx, payload: (_ for _ in ()).throw(rl.Snooze(timedelta(seconds=90))))
    job = enqueue(engine, registry)

    run_once(engine, registry)

    wait = scalar(engine, "SELECT extract(epoch FROM next_run_at - now()) FROM job_queue WHERE id = :id", id=job.id)
    assert 85 < wait <= 90
    [(_, _, payload)] = continuations_of(engine, job.id)
    assert payload["continue_after_ms"] == 90_000
    assert driver.claim_jobs(engine, worker_id="w", lease_ttl_seconds=30, limit=1, job_types=[JOB_TYPE]) == []


def test_continuations_are_written_by_the_worker_loop_and_its_completer(engine):
    seen: list = []
    registry = registry_of(paging_handler(seen))
    job = enqueue(engine, registry, max_attempts=1)

    run_worker_until(engine, registry, CONFIG, lambda: job_row(engine, job.id).status == "SUCCEEDED")

    assert job_row(engine, job.id).run_number == 3
    assert seen == [(1, 1, None), (2, 1, {"page": 2}), (3, 1, {"page": 2})]


# -- refused continuations: each a TERMINAL failure with its code --------------------------------


def dead_letter_code(engine: Any, job_id: Any) -> tuple[str, str, str]:
    row = job_row(engine, job_id)
    return row.status, row.status_reason, row.last_error_code


def test_a_job_past_its_definitions_cap_on_continuations_is_dead_lettered(engine):
    def always_snooze(ctx: rl.JobContext, payload: Any) -> None:
        raise rl.Snooze(0)
    registry = registry_of(always_snooze, max_continuations=2)
    job = enqueue(engine, registry)
    assert scalar(engine, "SELECT max_continuations FROM job_definitions WHERE job_type = :t", t=JOB_TYPE) == 2

    run_once(engine, registry)
    run_once(engine, registry)
    ended = run_once(engine, registry)

    assert dead_letter_code(engine, job.id) == ("DEAD_LETTERED", "TERMINAL", "job.continuation_limit_exceeded")
    assert (ended.run_number, ended.continuations) == (3, 2)
    assert len(continuations_of(engine, job.id)) == 2


def test_the_default_cap_is_written_to_the_definition(engine):
    registry = registry_of(lambda ctx, payload: None)
    enqueue(engine, registry)
    assert scalar(engine, "SELECT max_continuations FROM job_definitions WHERE job_type = :t", t=JOB_TYPE) == 100


@pytest.mark.parametrize("delay", [-1, timedelta(seconds=-1), math.nan, math.inf, timedelta(days=366), 10**12,
                                   "30", True])
@pytest.mark.parametrize("how", ["snooze", "completion"])
def test_a_delay_that_is_no_duration_ends_the_job_with_invalid_continuation_delay(engine, delay, how):
    def handler(ctx: rl.JobContext, payload: Any) -> Any:
        if how == "snooze":
            raise rl.Snooze(delay)
        return rl.JobCompletion(continue_after=delay, checkpoint={"kept": False})
    registry = registry_of(handler)
    job = enqueue(engine, registry)

    ended = run_once(engine, registry)

    assert dead_letter_code(engine, job.id) == ("DEAD_LETTERED", "TERMINAL", "job.invalid_continuation_delay")
    assert (ended.run_number, ended.continuations, ended.checkpoint) == (1, 0, None)


def test_an_output_with_a_continuation_ends_the_job_with_a_coded_failure(engine):
    registry = registry_of(lambda ctx, payload: rl.JobCompletion(continue_after=1, output={"half": True}))
    job = enqueue(engine, registry)

    ended = run_once(engine, registry)

    assert dead_letter_code(engine, job.id) == ("DEAD_LETTERED", "TERMINAL", "job.continuation_output_not_allowed")
    assert ended.output is None


def test_a_continuation_cannot_be_written_in_the_handlers_own_transaction(engine):
    errors: list = []

    def handler(ctx: rl.JobContext, payload: Any) -> None:
        with engine.begin() as connection:
            try:
                ctx.complete_in(connection, rl.JobCompletion(continue_after=0))
            except rl.InvalidArgument as error:
                errors.append(error.code)
    registry = registry_of(handler)
    enqueue(engine, registry)

    assert run_once(engine, registry).status == "SUCCEEDED"
    assert errors == ["job.invalid_argument"]


# -- workflow steps ------------------------------------------------------------------------------


def workflow_step_status(engine: Any, run_id: Any) -> tuple[Run, Step]:
    run = rl.get_workflow_run(engine, run_id)
    return run.status, run.step("sync").status


def test_a_workflow_step_that_opted_in_stays_running_while_its_job_continues(engine):
    seen: list = []
    registry = registry_of(paging_handler(seen))
    registry.sync_definitions(engine)
    wf = rl.Workflow("paged")
    sync = wf.job("sync", JOB_TYPE, {}, continuation=True)
    wf.job("after", JOB_TYPE, {}, after=[sync])
    run = rl.enqueue_workflow(engine, wf)

    run_once(engine, registry)
    assert workflow_step_status(engine, run.id) == (Run.RUNNING, Step.RUNNING)
    run_once(engine, registry)
    assert workflow_step_status(engine, run.id) == (Run.RUNNING, Step.RUNNING)
    assert rl.get_workflow_run(engine, run.id).step("after").status is Step.BLOCKED
    run_once(engine, registry)

    assert workflow_step_status(engine, run.id) == (Run.RUNNING, Step.SUCCEEDED)
    assert rl.get_workflow_run(engine, run.id).step("after").status is Step.ENQUEUED
    assert [checkpoint for _, _, checkpoint in seen] == [None, {"page": 2}, {"page": 2}]


def test_a_workflow_step_that_did_not_opt_in_fails_on_a_continuation(engine):
    registry = registry_of(lambda ctx, payload: rl.JobCompletion(continue_after=0))
    registry.sync_definitions(engine)
    wf = rl.Workflow("plain")
    wf.job("sync", JOB_TYPE, {})
    run = rl.enqueue_workflow(engine, wf)

    ended = run_once(engine, registry)

    assert (ended.status, ended.last_error_code) == ("DEAD_LETTERED", "job.workflow_handler_continuation_not_enabled")
    assert workflow_step_status(engine, run.id) == (Run.COMPLETED_WITH_ERRORS, Step.FAILED)


# -- concurrency keys ----------------------------------------------------------------------------


def held_back(engine: Any) -> set[Any]:
    return {row.id for row in rows(engine, "SELECT id FROM job_queue WHERE blocked_by_key AND status = 'PENDING'")}


def test_a_continued_job_keeps_its_keys_turn_like_a_retry(engine):
    registry = registry_of(lambda ctx, payload: rl.JobCompletion(continue_after=60, checkpoint={"half": 1}),
                           queue="keyed")
    registry.queue("keyed", key_limit=1)
    first = enqueue(engine, registry, concurrency_key="customer:1")
    run_once(engine, registry)

    # A later job of the key, due at once, settles the key while the continued one waits its minute.
    later = store_enqueue.enqueue(engine, JOB_TYPE, {"n": 2}, concurrency_key="customer:1")

    assert job_row(engine, first.id).status == "PENDING"
    assert held_back(engine) == {later.id}
    assert driver.claim_jobs(engine, worker_id="w", lease_ttl_seconds=30, limit=5, job_types=[JOB_TYPE]) == []


def test_a_continuation_whose_lease_was_lost_is_refused_by_the_fence(engine):
    registry = registry_of(lambda ctx, payload: None)
    enqueue(engine, registry)
    job = claim_one(engine, worker_id="w")
    stranger = LeaseIdentity(job.id, job.run_number, job.attempt, "someone-else")

    [refused] = driver.apply_transitions(engine, [(stranger, Continue(0))])

    assert refused.code == "job.lease_owner_mismatch"
    assert job_row(engine, job.id).status == "LEASED"
    assert driver.apply_transitions(engine, [(LeaseIdentity.of(job), Continue(0, {"p": 1}))]) == [None]
    assert (job_row(engine, job.id).status, job_row(engine, job.id).checkpoint) == ("PENDING", {"p": 1})


def test_an_operators_requeue_starts_the_count_of_continuations_again(engine):
    registry = registry_of(lambda ctx, payload: rl.JobCompletion(continue_after=0) if ctx.run_number == 1 else None)
    job = enqueue(engine, registry)
    run_once(engine, registry)
    assert run_once(engine, registry).continuations == 1

    rl.requeue_job(engine, job.id)

    assert job_row(engine, job.id).continuations == 0


# -- retry hints ---------------------------------------------------------------------------------


def retry_row(engine: Any, job_id: Any) -> Any:
    return rows(engine, "SELECT a.retry_delay_ms, extract(epoch FROM j.next_run_at - a.finished_at) AS waits "
                        "FROM job_queue j JOIN job_attempts a ON a.job_id = j.id WHERE j.id = :id", id=job_id)[0]


def test_a_retry_hint_longer_than_the_backoff_is_the_delay_and_is_recorded(engine):
    def busy(ctx: rl.JobContext, payload: Any) -> None:
        raise rl.JobFailure.retryable("api.busy", "429", retry_after=timedelta(seconds=100))
    registry = registry_of(busy)
    job = enqueue(engine, registry, max_attempts=3)

    run_once(engine, registry)

    recorded = retry_row(engine, job.id)
    assert recorded.retry_delay_ms == 100_000
    assert recorded.waits >= 100
    scheduled = [payload for event, _, payload in events(engine, job.id) if event == "RETRY_SCHEDULED"]
    assert [(p["retry_delay_ms"], p["retry_after_ms"]) for p in scheduled] == [(100_000, 100_000)]


def test_a_retry_hint_shorter_than_the_backoff_leaves_the_backoff(engine):
    def busy(ctx: rl.JobContext, payload: Any) -> None:
        raise rl.JobFailure.retryable("api.busy", "429", retry_after=timedelta(seconds=1))
    registry = registry_of(busy)
    job = enqueue(engine, registry, max_attempts=3)

    run_once(engine, registry)

    assert retry_row(engine, job.id).retry_delay_ms == backoff.compute_retry_delay_ms(1, job.id)


@pytest.mark.parametrize("hint", [timedelta(seconds=-1), timedelta(days=400), "30"])
def test_a_retry_hint_that_is_no_valid_delay_ends_the_job_with_invalid_retry_timing(engine, hint):
    def busy(ctx: rl.JobContext, payload: Any) -> None:
        raise rl.JobFailure.retryable("api.busy", "429", retry_after=hint)
    registry = registry_of(busy)
    job = enqueue(engine, registry, max_attempts=3)

    run_once(engine, registry)

    assert dead_letter_code(engine, job.id) == ("DEAD_LETTERED", "TERMINAL", "job.invalid_retry_timing")


def test_a_continuation_whose_reply_was_lost_reads_back_as_landed(engine):
    registry = registry_of(lambda ctx, payload: None)
    enqueue(engine, registry)
    job = claim_one(engine, worker_id="w")
    lease = LeaseIdentity.of(job)
    assert driver.read_back_outcomes(engine, [(lease, Continue(0))]) == [None]  # still leased: write it

    driver.apply_transitions(engine, [(lease, Continue(0))])

    assert driver.read_back_outcomes(engine, [(lease, Continue(0))]) == [True]


def test_a_workflow_whose_step_opts_in_is_enqueued_again_idempotently(engine):
    registry = registry_of(lambda ctx, payload: None)
    registry.sync_definitions(engine)

    def build() -> rl.Workflow:
        wf = rl.Workflow("paged", idempotency_key="paged-1")
        wf.job("sync", JOB_TYPE, {}, continuation=True)
        return wf

    first = rl.enqueue_workflow(engine, build())
    assert rl.enqueue_workflow(engine, build()).id == first.id
    assert scalar(engine, "SELECT allow_continuation FROM workflow_steps WHERE run_id = :run", run=first.id) is True
