"""testing.drain and testing.run_job: jobs worked in the test's process through the worker's own claim and writes."""

from __future__ import annotations

import threading
import pytest

import runledger_sync as rl
from runledger_sync import testing
from runledger_sync.core.errors import InvalidArgument, InvalidStateTransition
from runledger_sync.store.admin.jobs import list_attempts


def count(engine, status: rl.JobStatus, job_type: str | None = None) -> int:
    return len(rl.list_jobs(engine, status=status, job_type=job_type, limit=1000))


@pytest.fixture
def registry():
    return rl.JobRegistry()


def test_drain_runs_every_due_job_and_counts_each_outcome(engine, registry):
    @registry.job("ok")
    def ok(ctx, payload):
        return None

    @registry.job("flaky", max_attempts=3)
    def flaky(ctx, payload):
        raise rl.JobFailure.retryable("api.busy", "try later")

    @registry.job("doomed", max_attempts=1)
    def doomed(ctx, payload):
        raise rl.JobFailure.retryable("api.busy", "no more tries")

    @registry.job("broken", dead_letter_on=ValueError)
    def broken(ctx, payload):
        raise ValueError("a bug")

    registry.sync_definitions(engine)
    oks = [rl.enqueue(engine, "ok", {"n": n}).id for n in range(3)]
    flaky_job = rl.enqueue(engine, "flaky", {})
    doomed_job = rl.enqueue(engine, "doomed", {})
    broken_job = rl.enqueue(engine, "broken", {})

    result = testing.drain(engine, registry)

    assert result.by_outcome == {"succeeded": 3, "retried": 1, "dead_lettered": 2}
    assert (result.succeeded, result.retried, result.dead_lettered, len(result)) == (3, 1, 2, 6)
    assert sorted(result.ids("succeeded")) == sorted(oks)
    assert result.ids("retried") == [flaky_job.id]
    assert set(result.ids("dead_lettered")) == {doomed_job.id, broken_job.id}
    assert count(engine, rl.JobStatus.SUCCEEDED) == 3
    assert count(engine, rl.JobStatus.DEAD_LETTERED) == 2
    flaky_now = rl.get_job(engine, flaky_job.id)
    assert (flaky_now.status, flaky_now.last_error_code, flaky_now.attempt) == (rl.JobStatus.PENDING, "api.busy", 1)
    assert rl.get_job(engine, broken_job.id).last_error_code == "job.handler_panic"
    # The attempts are the worker's own rows, signed by the drain.
    assert list_attempts(engine, oks[0])[0].worker_id.startswith("testing-worker-")


def test_drain_runs_the_jobs_that_jobs_enqueue(engine, registry):
    @registry.job("order.placed")
    def placed(ctx, payload):
        rl.enqueue(engine, "email.send", {"order": payload["order"]})

    @registry.job("email.send")
    def send(ctx, payload):
        if payload["order"] < 2:
            rl.enqueue(engine, "order.placed", {"order": payload["order"] + 1})

    registry.sync_definitions(engine)
    rl.enqueue(engine, "order.placed", {"order": 0})

    result = testing.drain(engine, registry)

    assert [job.job_type for job in result.jobs] == ["order.placed", "email.send"] * 3
    assert result.by_outcome == {"succeeded": 6}
    assert count(engine, rl.JobStatus.PENDING) == 0


def test_drain_runs_the_handler_on_the_calling_thread_and_the_dead_letter_hook_before_returning(engine, registry):
    seen = {}

    class Export(rl.JobHandler):
        job_type = "reports.export"

        def execute(self, ctx, payload):
            seen["thread"] = threading.current_thread()
            raise rl.JobFailure.terminal("report.bad", "cannot")

        def on_dead_letter(self, ctx, payload, info):
            seen["reason"] = info.failure.code

    registry.register(Export())
    registry.sync_definitions(engine)
    rl.enqueue(engine, "reports.export", {})

    testing.drain(engine, registry)

    assert seen == {"thread": threading.current_thread(), "reason": "report.bad"}


def test_a_handler_past_its_deadline_is_told_to_stop_and_its_timeout_written(engine, registry):
    @registry.job("slow", timeout_seconds=1, max_attempts=1)
    def slow(ctx, payload):
        assert ctx.wait_cancelled(30), "the deadline's cancellation never came"
        ctx.check_cancelled()

    registry.sync_definitions(engine)
    job = rl.enqueue(engine, "slow", {})

    assert testing.drain(engine, registry).by_outcome == {"dead_lettered": 1}
    assert rl.get_job(engine, job.id).last_error_code == "job.timeout_exceeded"


def test_a_ctrl_c_in_a_handler_stops_the_drain_once_its_attempt_is_written(engine, registry):
    @registry.job("interrupted")
    def interrupted(ctx, payload):
        raise KeyboardInterrupt

    registry.sync_definitions(engine)
    first = rl.enqueue(engine, "interrupted", {})
    second = rl.enqueue(engine, "interrupted", {})

    with pytest.raises(KeyboardInterrupt):
        testing.drain(engine, registry)

    assert rl.get_job(engine, first.id).last_error_code == "job.handler_panic"
    assert rl.get_job(engine, second.id).status is rl.JobStatus.PENDING


def test_drain_stops_at_max_jobs(engine, registry):
    @registry.job("ok")
    def ok(ctx, payload):
        return None

    registry.sync_definitions(engine)
    ids = [rl.enqueue(engine, "ok", {"n": n}, priority=10 - n).id for n in range(5)]

    result = testing.drain(engine, registry, max_jobs=2)

    assert result.ids() == ids[:2]  # in claim order: highest priority first
    assert count(engine, rl.JobStatus.PENDING) == 3
    assert testing.drain(engine, registry).ids() == ids[2:]


@pytest.mark.parametrize("max_jobs", [0, -1, 1.5, True])
def test_drain_refuses_a_max_jobs_that_is_not_a_positive_int(engine, registry, max_jobs):
    with pytest.raises(InvalidArgument) as raised:
        testing.drain(engine, registry, max_jobs=max_jobs)
    assert raised.value.code == "job.invalid_argument"
    assert "max_jobs" in str(raised.value)


def test_drain_leaves_jobs_it_has_no_handler_for_and_jobs_not_yet_due(engine, registry):
    @registry.job("ok")
    def ok(ctx, payload):
        return None

    registry.sync_definitions(engine)
    other = rl.JobRegistry()
    other.job("someone.elses")(ok)
    other.sync_definitions(engine)
    later = rl.enqueue(engine, "ok", {}, delay_seconds=3600)
    foreign = rl.enqueue(engine, "someone.elses", {})

    assert len(testing.drain(engine, registry)) == 0
    assert rl.get_job(engine, later.id).status is rl.JobStatus.PENDING
    assert rl.get_job(engine, foreign.id).status is rl.JobStatus.PENDING


def test_include_scheduled_runs_retries_through_their_backoff_until_the_job_ends(engine, registry):
    @registry.job("flaky", max_attempts=5)
    def flaky(ctx, payload):
        if ctx.attempt < 3:
            raise rl.JobFailure.retryable("api.busy", "try later")

    registry.sync_definitions(engine)
    job = rl.enqueue(engine, "flaky", {})

    assert testing.drain(engine, registry).by_outcome == {"retried": 1}
    assert rl.get_job(engine, job.id).next_run_at > rl.get_job(engine, job.id).updated_at

    result = testing.drain(engine, registry, include_scheduled=True)

    assert [j.outcome for j in result.jobs] == ["retried", "succeeded"]
    done = rl.get_job(engine, job.id)
    assert (done.status, done.attempt) == (rl.JobStatus.SUCCEEDED, 3)


def test_include_scheduled_runs_delayed_jobs_in_the_order_they_come_due(engine, registry):
    @registry.job("ok")
    def ok(ctx, payload):
        return None

    registry.sync_definitions(engine)
    last = rl.enqueue(engine, "ok", {"at": "2h"}, delay_seconds=7200)
    first = rl.enqueue(engine, "ok", {"at": "1h"}, delay_seconds=3600, priority=-5)
    now = rl.enqueue(engine, "ok", {"at": "now"}, priority=-10)

    result = testing.drain(engine, registry, include_scheduled=True)

    assert result.ids() == [now.id, first.id, last.id]


def test_include_scheduled_with_max_jobs_bounds_a_job_that_never_ends(engine, registry):
    @registry.job("again")
    def again(ctx, payload):
        rl.enqueue(engine, "again", {}, delay_seconds=60)

    registry.sync_definitions(engine)
    rl.enqueue(engine, "again", {})

    assert testing.drain(engine, registry, include_scheduled=True, max_jobs=4).by_outcome == {"succeeded": 4}
    assert count(engine, rl.JobStatus.PENDING) == 1


def test_drain_runs_a_workflow_step_by_step(engine, registry):
    ran = []

    @registry.job("payments.charge")
    def charge(ctx, payload):
        ran.append(ctx.workflow.step_key)
        return rl.JobCompletion(output={"charged": payload["order"]})

    @registry.job("shipping.send")
    def ship(ctx, payload):
        ran.append((ctx.workflow.step_key, ctx.workflow.output_of("charge")))

    registry.sync_definitions(engine)
    wf = rl.Workflow("order.fulfil", idempotency_key="order-42")
    charge_step = wf.job("charge", "payments.charge", {"order": 42})
    wf.job("ship", "shipping.send", {"order": 42}, after=[charge_step], release="on_success")
    run = rl.enqueue_workflow(engine, wf)

    result = testing.drain(engine, registry)

    assert result.by_outcome == {"succeeded": 2}
    assert ran == ["charge", ("ship", {"charged": 42})]
    assert rl.get_workflow_run(engine, run.id).status is rl.WorkflowRunStatus.SUCCEEDED


def test_drain_respects_a_paused_queue(engine, registry):
    @registry.job("ok")
    def ok(ctx, payload):
        return None

    registry.sync_definitions(engine)
    rl.configure_queue(engine, "slow")
    rl.pause_queue(engine, "slow")
    held = rl.enqueue(engine, "ok", {}, queue="slow")

    assert len(testing.drain(engine, registry, include_scheduled=True)) == 0
    assert rl.get_job(engine, held.id).status is rl.JobStatus.PENDING


# --- run_job ---------------------------------------------------------------------


def test_run_job_works_only_the_job_it_enqueues_and_returns_its_final_record(engine, registry):
    calls = []

    @registry.job("email.send")
    def send(ctx, payload):
        calls.append(payload)
        rl.enqueue(engine, "email.followup", {})
        return rl.JobCompletion(output={"sent_to": payload["to"]})

    registry.job("email.followup")(send)

    registry.sync_definitions(engine)
    waiting = rl.enqueue(engine, "email.send", {"to": "first@b.c"}, priority=100)

    record = testing.run_job(engine, registry, "email.send", {"to": "a@b.c"}, priority=-100)

    assert isinstance(record, rl.JobRecord)
    assert (record.status, record.output, record.attempt) == (rl.JobStatus.SUCCEEDED, {"sent_to": "a@b.c"}, 1)
    assert calls == [{"to": "a@b.c"}]
    assert rl.get_job(engine, waiting.id).status is rl.JobStatus.PENDING
    assert count(engine, rl.JobStatus.PENDING, "email.followup") == 1


def test_run_job_runs_a_delayed_job_now(engine, registry):
    @registry.job("ok")
    def ok(ctx, payload):
        return None

    registry.sync_definitions(engine)
    assert testing.run_job(engine, registry, "ok", {}, delay_seconds=3600).status is rl.JobStatus.SUCCEEDED


def test_run_job_leaves_a_retryable_failure_pending_with_its_retry_scheduled(engine, registry):
    @registry.job("flaky", retry_delay_overrides={"api.busy": 60_000})
    def flaky(ctx, payload):
        raise rl.JobFailure.retryable("api.busy", "429")

    registry.sync_definitions(engine)
    record = testing.run_job(engine, registry, "flaky", {})

    assert (record.status, record.last_error_code, record.attempt) == (rl.JobStatus.PENDING, "api.busy", 1)


def test_run_job_refuses_a_type_without_handler(engine, registry):
    @registry.job("ok")
    def ok(ctx, payload):
        return None

    registry.sync_definitions(engine)
    with pytest.raises(InvalidArgument) as raised:
        testing.run_job(engine, registry, "nope", {})
    assert "registered: ok" in str(raised.value)
    assert count(engine, rl.JobStatus.PENDING) == 0


def test_run_job_says_why_a_job_cannot_run(engine, registry):
    @registry.job("ok")
    def ok(ctx, payload):
        return None

    registry.sync_definitions(engine)
    rl.configure_queue(engine, "slow")
    rl.pause_queue(engine, "slow")

    with pytest.raises(InvalidStateTransition) as raised:
        testing.run_job(engine, registry, "ok", {}, queue="slow")
    assert raised.value.code == "job.invalid_state_transition"
    assert "paused" in str(raised.value)


def test_run_job_says_so_when_an_idempotency_key_returns_a_job_that_already_ran(engine, registry):
    @registry.job("ok")
    def ok(ctx, payload):
        return None

    registry.sync_definitions(engine)
    testing.run_job(engine, registry, "ok", {}, idempotency_key="once")
    with pytest.raises(InvalidStateTransition) as raised:
        testing.run_job(engine, registry, "ok", {}, idempotency_key="once")
    assert "SUCCEEDED" in str(raised.value)
