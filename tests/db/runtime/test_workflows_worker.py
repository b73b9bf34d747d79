"""Workflows run by real worker threads: fan-out and fan-in, a completion racing a cancel."""

from __future__ import annotations

import threading

import runledger_sync as rl
from runledger_sync.core.workflow import WorkflowRunStatus as Run
from runledger_sync.core.workflow import WorkflowStepStatus as Step
from tests.handlers import SECRET, Probe, fast_config
from tests.support import rows, scalar, wait_until

BRANCHES = 50
BRANCH, JOIN, PLAIN = "fan.branch", "fan.join", "fan.plain"


def fan_registry(seen: dict) -> rl.JobRegistry:
    registry = rl.JobRegistry()
    lock = threading.Lock()

    @registry.job(BRANCH)
    def branch(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
        return rl.JobCompletion(output={"i": payload["i"]})

    @registry.job(JOIN)
    def join(ctx: rl.JobContext, payload: dict) -> None:
        total = sum(ctx.workflow.output_of(f"b{i}")["i"] for i in range(BRANCHES))
        with lock:
            seen[ctx.workflow.run_id] = (ctx.workflow.step_key, total)

    @registry.job(PLAIN)
    def plain(ctx: rl.JobContext, payload: dict) -> None:
        with lock:
            seen[ctx.job_id] = ctx.workflow

    return registry


def fan_workflow(n: int) -> rl.Workflow:
    wf = rl.Workflow("fan", idempotency_key=f"fan-{n}")
    branches = [wf.job(f"b{i}", BRANCH, {"i": i}) for i in range(BRANCHES)]
    wf.job("join", JOIN, after=branches)
    return wf


def test_fan_in_is_enqueued_once_after_all_fifty_branches_ended(engine, start_loop):
    seen: dict = {}
    registry = fan_registry(seen)
    registry.sync_definitions(engine)
    start_loop("worker", registry, fast_config(max_global_concurrency=4, claim_batch_size=4))
    plain = rl.enqueue(engine, PLAIN, {})

    for n in range(3):
        run = rl.enqueue_workflow(engine, fan_workflow(n))
        wait_until(lambda run=run: rl.get_workflow_run(engine, run.id).status is Run.SUCCEEDED, timeout=60)

        joins = rows(engine, "SELECT j.id, j.created_at FROM job_queue j JOIN workflow_steps s "
                             "ON s.id = j.workflow_step_id WHERE s.run_id = :run AND j.job_type = :t", run=run.id, t=JOIN)
        assert len(joins) == 1
        last_branch_end = scalar(
            engine, "SELECT max(j.finished_at) FROM job_queue j JOIN workflow_steps s ON s.id = j.workflow_step_id "
                    "WHERE s.run_id = :run AND j.job_type = :t", run=run.id, t=BRANCH)
        assert joins[0].created_at >= last_branch_end
        assert scalar(engine, "SELECT count(*) FROM job_events WHERE job_id = :id AND event_type = 'ENQUEUED'",
                      id=joins[0].id) == 1
        assert seen[run.id] == ("join", sum(range(BRANCHES)))
        assert {step.status for step in rl.get_workflow_run(engine, run.id).steps} == {Step.SUCCEEDED}
    # Every step's job ran once, and the plain job saw no workflow.
    assert scalar(engine, "SELECT max(attempt) FROM job_queue") == 1
    assert scalar(engine, "SELECT count(*) FROM job_attempts") == 3 * (BRANCHES + 1) + 1
    assert seen[plain.id] is None


HOLD, NEXT = "race.hold", "race.next"


def test_a_completion_while_the_cancel_holds_the_run_leaves_the_lease_and_the_reaper_finishes_it(
        engine, start_loop, logs):
    probe = Probe()
    registry = rl.JobRegistry()

    @registry.job(HOLD, max_attempts=1)
    def hold(ctx: rl.JobContext, payload: dict) -> None:
        probe.note("started")
        probe.release.wait(20)

    @registry.job(NEXT)
    def follow(ctx: rl.JobContext, payload: dict) -> None:
        probe.note("next ran")

    registry.sync_definitions(engine)
    wf = rl.Workflow("race")
    first = wf.job("hold", HOLD)
    wf.job("next", NEXT, after=[first])
    run = rl.enqueue_workflow(engine, wf)
    config = fast_config(lease_ttl_seconds=2, reaper_retry_delay_ms=1_000)
    start_loop("worker", registry, config)
    wait_until(lambda: probe.notes)
    job_id = rl.get_workflow_run(engine, run.id).step("hold").job_id

    with engine.connect() as connection:
        with connection.begin():
            rl.cancel_workflow_run(connection, run.id, reason="racing")
            probe.release.set()
            wait_until(lambda: any("conflicted with workflow cancellation" in r.getMessage() for r in logs.records))
            assert rl.get_job(engine, job_id).status is rl.JobStatus.LEASED
        # The cancel commits here.

    # The worker carries on with other work.
    plain = rl.enqueue(engine, NEXT, {})
    wait_until(lambda: rl.get_job(engine, plain.id).status is rl.JobStatus.SUCCEEDED)
    assert rl.get_job(engine, job_id).status is rl.JobStatus.LEASED

    start_loop("reaper", registry, config)
    wait_until(lambda: rl.get_job(engine, job_id).status is rl.JobStatus.DEAD_LETTERED, timeout=20)
    final = rl.get_workflow_run(engine, run.id)
    assert final.status is Run.CANCELED
    assert (final.step("hold").status, final.step("next").status) == (Step.FAILED, Step.CANCELED)
    assert final.step("next").job_id is None
    assert probe.notes.count("next ran") == 1  # the plain job only


IN_TX = "race.in_transaction"


def test_a_handler_completing_in_its_own_transaction_while_the_cancel_holds_the_run_writes_nothing(
        engine, start_loop, logs):
    probe = Probe()
    registry = rl.JobRegistry()

    @registry.job(IN_TX, max_attempts=1)
    def in_transaction(ctx: rl.JobContext, payload: dict) -> None:
        probe.note("started")
        probe.release.wait(20)
        with engine.begin() as connection:
            ctx.complete_in(connection)

    registry.sync_definitions(engine)
    wf = rl.Workflow("race.in_tx")
    first = wf.job("first", IN_TX)
    wf.job("second", IN_TX, after=[first])
    run = rl.enqueue_workflow(engine, wf)
    start_loop("worker", registry, fast_config())
    wait_until(lambda: probe.notes)
    job_id = rl.get_workflow_run(engine, run.id).step("first").job_id

    with engine.connect() as connection:
        with connection.begin():
            rl.cancel_workflow_run(connection, run.id)
            probe.release.set()
            wait_until(lambda: any(getattr(r, "failure_code", None) == "workflow.release_conflict"
                                   for r in logs.records))

    job = rl.get_job(engine, job_id)
    assert (job.status, job.last_error_code) == (rl.JobStatus.LEASED, None)
    assert rl.get_workflow_run(engine, run.id).step("second").status is Step.CANCELED


BIG, AFTER_BIG, BIG_IN_TX = "limit.big", "limit.after", "limit.big_in_tx"


def output_registry(engine, size: int) -> rl.JobRegistry:
    registry = rl.JobRegistry()

    @registry.job(BIG, max_attempts=3)
    def big(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
        return rl.JobCompletion(output={"secret": SECRET, "blob": "x" * size})

    @registry.job(BIG_IN_TX, max_attempts=3)
    def big_in_tx(ctx: rl.JobContext, payload: dict) -> None:
        with engine.begin() as connection:
            ctx.complete_in(connection, rl.JobCompletion(output={"blob": "y" * size}))

    @registry.job(AFTER_BIG)
    def after(ctx: rl.JobContext, payload: dict) -> None:
        pass

    return registry



def test_an_output_over_the_limit_dead_letters_the_job_at_once_with_output_too_large(engine, start_loop, logs):
    registry = output_registry(engine, 20_000)
    registry.sync_definitions(engine)
    wf = rl.Workflow("limit")
    first = wf.job("big", BIG)
    wf.job("after", AFTER_BIG, after=[first], release="on_success")
    run = rl.enqueue_workflow(engine, wf)
    in_transaction = rl.enqueue(engine, BIG_IN_TX, {})
    start_loop("worker", registry, fast_config(max_output_bytes=10_000))

    job_id = run.step("big").job_id
    wait_until(lambda: rl.get_job(engine, job_id).status is rl.JobStatus.DEAD_LETTERED)
    job = rl.get_job(engine, job_id)
    # The same code returns the same output: retrying cannot help, so one attempt.
    assert (job.attempt, job.last_error_code, job.output) == (1, "job.output_too_large", None)
    assert "10000 bytes" in job.last_error_message and "was not stored" in job.last_error_message
    final = rl.get_workflow_run(engine, run.id)
    assert (final.step("big").status, final.step("big").error_code) == (Step.FAILED, "job.output_too_large")
    assert final.step("after").status is Step.CANCELED
    # Refused inside the handler's own transaction (ctx.complete_in): the same, at once.
    wait_until(lambda: rl.get_job(engine, in_transaction.id).status is rl.JobStatus.DEAD_LETTERED)
    job = rl.get_job(engine, in_transaction.id)
    assert (job.attempt, job.last_error_code, job.output) == (1, "job.output_too_large", None)
    assert "at most 10000 bytes of JSON" in job.last_error_message
    # The logs fixture checks that no record carries the output (it holds the secret marker).


def test_a_larger_configured_output_limit_lets_a_larger_output_be_stored(engine, start_loop):
    registry = output_registry(engine, 1_500_000)
    registry.sync_definitions(engine)
    grouped = rl.enqueue(engine, BIG, {})
    in_transaction = rl.enqueue(engine, BIG_IN_TX, {})
    start_loop("worker", registry, fast_config(max_output_bytes=2_000_000))

    for job in (grouped, in_transaction):
        wait_until(lambda job=job: rl.get_job(engine, job.id).status is rl.JobStatus.SUCCEEDED)
    assert len(rl.get_job(engine, grouped.id).output["blob"]) == 1_500_000
    assert len(rl.get_job(engine, in_transaction.id).output["blob"]) == 1_500_000
