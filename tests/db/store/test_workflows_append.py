"""Appending steps to a running workflow run: the window's rules, idempotency by mutation key, the fan-in waits."""

from __future__ import annotations

import threading

import pytest

import runledger_sync as rl
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.workflow import WorkflowRunStatus as Run
from runledger_sync.core.workflow import WorkflowStepStatus as Step
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success
from runledger_sync.store.attempt.running import mark_job_running
from runledger_sync.store.claim.claim import claim_prestart_jobs_for_types
from tests.support import define, lock_waiters, scalar, wait_until

LIST, PAGE, REPORT = "crawl.list", "crawl.page", "crawl.report"


@pytest.fixture
def typed(engine):
    for job_type in (LIST, PAGE, REPORT):
        define(engine, job_type, max_attempts=1)
    return engine


def crawl() -> rl.Workflow:
    """list and the window "collect" start together; report waits for both."""
    wf = rl.Workflow("crawl")
    listing = wf.job("list", LIST)
    collect = wf.external("collect")
    wf.job("report", REPORT, after=[listing, collect])
    return wf


def pages(n: int, *, window: str = "collect", after: tuple[str, ...] = ("list",)) -> rl.WorkflowAppend:
    more = rl.WorkflowAppend(window=window)
    for i in range(1, n + 1):
        more.job(f"page-{i}", PAGE, {"n": i}, after=list(after))
    return more


def finish(engine, job_type: str, *, succeeded: bool = True):
    jobs = claim_prestart_jobs_for_types(engine, worker_id="w", lease_ttl_seconds=30, limit=1, job_types=[job_type])
    assert len(jobs) == 1, f"expected one {job_type} job, got {len(jobs)}"
    identity = LeaseIdentity.of(jobs[0])
    mark_job_running(engine, identity)
    if succeeded:
        return complete_job_success(engine, **identity.keywords())
    return complete_job_failure(engine, **identity.keywords(),
                                failure=rl.JobFailure(rl.JobFailureKind.TERMINAL, "boom", "it broke"), retry_delay_ms=0)


def statuses(engine, run_id) -> dict[str, Step]:
    return {step.key: step.status for step in rl.get_workflow_run(engine, run_id).steps}


def mutation_rows(engine, run_id) -> int:
    return scalar(engine, "SELECT count(*) FROM workflow_run_mutations WHERE run_id = :run", run=run_id)


def test_appended_steps_wait_for_their_prerequisites_and_the_windows_dependents_wait_for_them(typed):
    run = rl.enqueue_workflow(typed, crawl())

    after = rl.append_workflow_steps(typed, run.id, pages(2), mutation_key="pages")

    assert [step.key for step in after.steps] == ["list", "collect", "report", "page-1", "page-2"]
    assert after.step("page-1").deps == ("list",)
    assert after.step("report").deps == ("list", "collect", "page-1", "page-2")
    report = after.step("report")
    assert (report.dependencies_total, report.dependencies_pending) == (4, 4)
    assert after.step("page-1").status is Step.BLOCKED
    assert [(m.mutation_key, m.window, m.step_keys) for m in after.mutations] == [
        ("pages", "collect", ("page-1", "page-2"))]

    finish(typed, LIST)
    assert statuses(typed, run.id)["page-1"] is Step.ENQUEUED
    rl.complete_external_step(typed, run.id, "collect")
    finish(typed, PAGE)
    assert statuses(typed, run.id)["report"] is Step.BLOCKED  # page-2 still to go
    finish(typed, PAGE)
    assert statuses(typed, run.id)["report"] is Step.ENQUEUED
    finish(typed, REPORT)
    assert rl.get_workflow_run(typed, run.id).status is Run.SUCCEEDED


def test_a_step_after_an_ended_step_is_released_at_once_and_one_after_nothing_too(typed):
    run = rl.enqueue_workflow(typed, crawl())
    finish(typed, LIST)
    more = rl.WorkflowAppend(window="collect")
    more.job("page-1", PAGE, after=["list"])
    more.job("page-2", PAGE)
    more.job("page-3", PAGE, after=["page-1", "page-2"])

    after = rl.append_workflow_steps(typed, run.id, more, mutation_key="pages")

    assert [after.step(k).status for k in ("page-1", "page-2", "page-3")] == [Step.ENQUEUED, Step.ENQUEUED, Step.BLOCKED]
    assert after.step("page-1").dependencies_pending == 0
    assert after.status is Run.RUNNING
    assert scalar(typed, "SELECT count(*) FROM job_queue WHERE job_type = :t AND status = 'PENDING'", t=PAGE) == 2


def test_an_on_success_step_after_a_failed_step_is_cancelled_when_appended(typed):
    run = rl.enqueue_workflow(typed, crawl())
    finish(typed, LIST, succeeded=False)
    more = rl.WorkflowAppend(window="collect")
    more.job("page-1", PAGE, after=["list"], release="on_success")

    after = rl.append_workflow_steps(typed, run.id, more, mutation_key="pages")

    assert after.step("page-1").status is Step.CANCELED
    assert after.step("page-1").error_code == "workflow.dependency_unsatisfied"
    assert after.step("page-1").job_id is None


def test_the_same_steps_again_under_the_key_change_nothing(typed):
    run = rl.enqueue_workflow(typed, crawl())
    first = rl.append_workflow_steps(typed, run.id, pages(3), mutation_key="pages")
    again = rl.append_workflow_steps(typed, run.id, pages(3), mutation_key="pages")

    assert again.steps == first.steps and again.mutations == first.mutations
    assert mutation_rows(typed, run.id) == 1
    assert scalar(typed, "SELECT count(*) FROM workflow_steps WHERE run_id = :run", run=run.id) == 6
    assert again.step("report").dependencies_total == 5


def test_the_same_key_with_other_steps_is_a_conflicting_retry(typed):
    run = rl.enqueue_workflow(typed, crawl())
    rl.append_workflow_steps(typed, run.id, pages(3), mutation_key="pages")

    with pytest.raises(rl.errors.WorkflowAppendConflictingRetry) as conflict:
        rl.append_workflow_steps(typed, run.id, pages(4), mutation_key="pages")
    assert conflict.value.code == "workflow.append_conflicting_retry"
    assert scalar(typed, "SELECT count(*) FROM workflow_steps WHERE run_id = :run", run=run.id) == 6


def test_a_second_key_appends_again_at_the_same_window(typed):
    run = rl.enqueue_workflow(typed, crawl())
    rl.append_workflow_steps(typed, run.id, pages(1), mutation_key="first")
    more = rl.WorkflowAppend(window="collect")
    more.job("page-9", PAGE, after=["page-1"])

    after = rl.append_workflow_steps(typed, run.id, more, mutation_key="second")

    assert after.step("report").deps == ("list", "collect", "page-1", "page-9")
    assert [m.mutation_key for m in after.mutations] == ["first", "second"]


def test_eight_threads_appending_with_the_same_key_write_one_mutation(typed):
    run = rl.enqueue_workflow(typed, crawl())
    barrier = threading.Barrier(8)
    results: list = []
    errors: list = []

    def append() -> None:
        barrier.wait()
        try:
            results.append(rl.append_workflow_steps(typed, run.id, pages(20), mutation_key="pages"))
        except Exception as error:  # reported below: a thread's exception is otherwise lost
            errors.append(error)

    threads = [threading.Thread(target=append) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert errors == []
    assert len(results) == 8 and all(result.steps == results[0].steps for result in results)
    assert mutation_rows(typed, run.id) == 1
    assert scalar(typed, "SELECT count(*) FROM workflow_steps WHERE run_id = :run", run=run.id) == 23
    assert rl.get_workflow_run(typed, run.id).step("report").dependencies_total == 22


@pytest.mark.parametrize("key", ["", "   ", "\t\n"])
def test_a_blank_mutation_key_is_refused_before_anything_is_read(typed, key):
    run = rl.enqueue_workflow(typed, crawl())
    with pytest.raises(rl.errors.WorkflowAppendMutationKeyBlank) as refused:
        rl.append_workflow_steps(typed, run.id, pages(1), mutation_key=key)
    assert refused.value.code == "workflow.append_mutation_key_blank"
    assert mutation_rows(typed, run.id) == 0


def test_a_run_that_ended_takes_no_append(typed):
    run = rl.enqueue_workflow(typed, crawl())
    finish(typed, LIST)
    rl.complete_external_step(typed, run.id, "collect")
    finish(typed, REPORT)
    assert rl.get_workflow_run(typed, run.id).status is Run.SUCCEEDED

    with pytest.raises(rl.errors.WorkflowAppendTerminalRun) as refused:
        rl.append_workflow_steps(typed, run.id, pages(1, after=()), mutation_key="late")
    assert refused.value.code == "workflow.append_terminal_run"


def test_a_cancelled_run_takes_no_append(typed):
    run = rl.enqueue_workflow(typed, crawl())
    rl.cancel_workflow_run(typed, run.id)
    with pytest.raises(rl.errors.WorkflowAppendTerminalRun):
        rl.append_workflow_steps(typed, run.id, pages(1), mutation_key="late")


@pytest.mark.parametrize(
    ("window", "error", "code"),
    [
        ("nowhere", rl.errors.WorkflowAppendWindowMissing, "workflow.append_window_missing"),
        ("list", rl.errors.WorkflowAppendWindowNotExternal, "workflow.append_window_not_external"),
    ],
)
def test_the_window_must_be_an_external_step_of_the_run(typed, window, error, code):
    run = rl.enqueue_workflow(typed, crawl())
    with pytest.raises(error) as refused:
        rl.append_workflow_steps(typed, run.id, pages(1, window=window), mutation_key="pages")
    assert refused.value.code == code
    assert mutation_rows(typed, run.id) == 0


def test_an_answered_window_is_not_open(typed):
    wf = crawl()
    wf.external("other")  # keeps the run going once collect is answered
    run = rl.enqueue_workflow(typed, wf)
    rl.complete_external_step(typed, run.id, "collect")

    with pytest.raises(rl.errors.WorkflowAppendWindowNotOpen) as refused:
        rl.append_workflow_steps(typed, run.id, pages(1), mutation_key="pages")
    assert refused.value.code == "workflow.append_window_not_open"
    assert statuses(typed, run.id)["report"] is Step.BLOCKED
    assert scalar(typed, "SELECT count(*) FROM workflow_steps WHERE run_id = :run", run=run.id) == 4


def test_a_window_still_blocked_is_open(typed):
    wf = rl.Workflow("gated")
    first = wf.job("list", LIST)
    gate = wf.external("collect", after=[first])
    wf.job("report", REPORT, after=[gate])
    run = rl.enqueue_workflow(typed, wf)

    after = rl.append_workflow_steps(typed, run.id, pages(1), mutation_key="pages")

    assert after.step("report").deps == ("collect", "page-1")


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda more: more.job("list", PAGE), rl.errors.DuplicateStepKey),
        (lambda more: more.job("page", PAGE, after=["nope"]), rl.errors.UnknownDependency),
        # report waits for the window, so for page too: page after report is a cycle.
        (lambda more: more.job("page", PAGE, after=["report"]), rl.errors.DependencyCycle),
        (lambda more: None, rl.errors.WorkflowEmpty),
    ],
)
def test_steps_that_do_not_fit_the_run_are_refused_with_the_dag_codes(typed, build, error):
    run = rl.enqueue_workflow(typed, crawl())
    more = rl.WorkflowAppend(window="collect")
    build(more)
    with pytest.raises(error):
        rl.append_workflow_steps(typed, run.id, more, mutation_key="pages")
    assert scalar(typed, "SELECT count(*) FROM workflow_steps WHERE run_id = :run", run=run.id) == 3
    assert mutation_rows(typed, run.id) == 0


def test_a_missing_run_or_job_type_is_refused(typed):
    with pytest.raises(rl.WorkflowRunNotFound):
        rl.append_workflow_steps(typed, "0190c6c2-5f1e-7000-8000-000000000000", pages(1), mutation_key="pages")
    run = rl.enqueue_workflow(typed, crawl())
    more = rl.WorkflowAppend(window="collect")
    more.job("page", "crawl.undefined")
    with pytest.raises(rl.errors.WorkflowDefinitionNotFoundOrDisabled):
        rl.append_workflow_steps(typed, run.id, more, mutation_key="pages")


def test_an_append_in_the_callers_transaction_rolls_back_with_it(typed):
    run = rl.enqueue_workflow(typed, crawl())
    with typed.connect() as connection:
        with connection.begin() as transaction:
            inside = rl.append_workflow_steps(connection, run.id, pages(2), mutation_key="pages")
            assert len(inside.steps) == 5
            transaction.rollback()
    assert mutation_rows(typed, run.id) == 0
    assert rl.get_workflow_run(typed, run.id).step("report").dependencies_total == 2


def test_the_window_answered_while_an_append_holds_the_run_waits_for_it(typed):
    """The answer blocks on the run's row until the append commits, then sees the new steps."""
    run = rl.enqueue_workflow(typed, crawl())
    answered = threading.Event()

    def answer() -> None:
        rl.complete_external_step(typed, run.id, "collect")
        answered.set()

    with typed.connect() as connection:
        with connection.begin():
            rl.append_workflow_steps(connection, run.id, pages(2, after=()), mutation_key="pages")
            thread = threading.Thread(target=answer)
            thread.start()
            wait_until(lambda: lock_waiters(typed) == 1, what="the answer waiting for the run's lock")
            assert not answered.is_set()
        # Committed here.
    thread.join(10)
    assert answered.is_set()
    final = rl.get_workflow_run(typed, run.id)
    assert final.step("collect").status is Step.SUCCEEDED
    assert final.step("report").status is Step.BLOCKED
    assert final.step("report").dependencies_pending == 3  # list, page-1, page-2


def test_an_append_while_the_answer_holds_the_run_waits_and_then_finds_the_window_closed(typed):
    wf = crawl()
    wf.external("other")  # keeps the run going once collect is answered
    run = rl.enqueue_workflow(typed, wf)
    refused: list = []

    def append() -> None:
        try:
            rl.append_workflow_steps(typed, run.id, pages(2), mutation_key="pages")
        except rl.RunledgerError as error:
            refused.append(error.code)

    with typed.connect() as connection:
        with connection.begin():
            rl.complete_external_step(connection, run.id, "collect")
            thread = threading.Thread(target=append)
            thread.start()
            wait_until(lambda: lock_waiters(typed) == 1, what="the append waiting for the run's lock")
            assert refused == []
        # The answer commits here.
    thread.join(10)
    assert refused == ["workflow.append_window_not_open"]
    assert mutation_rows(typed, run.id) == 0
