"""Appending to a running workflow from a handler (ctx.workflow.append), run by real worker threads."""

from __future__ import annotations

import threading

import pytest

import runledger_sync as rl
from runledger_sync.core.workflow import WorkflowRunStatus as Run
from runledger_sync.core.workflow import WorkflowStepStatus as Step
from tests.handlers import fast_config
from tests.support import rows, scalar, wait_until

LIST, PAGE, REPORT = "crawl.list", "crawl.page", "crawl.report"
PAGES = 100
RETRY = "crawl.try_again"


def crawl(name: str = "crawl") -> rl.Workflow:
    """list discovers the pages and appends them at the window "collect"; report waits for the window."""
    wf = rl.Workflow(name)
    listing = wf.job("list", LIST)
    collect = wf.external("collect")
    wf.job("report", REPORT, after=[listing, collect])
    return wf


def chained_pages(n: int) -> rl.WorkflowAppend:
    """page-1 after list, each later page after the one before: released one by one, in order."""
    more = rl.WorkflowAppend(window="collect")
    previous = "list"
    for i in range(1, n + 1):
        more.job(f"page-{i}", PAGE, {"n": i}, after=[previous])
        previous = f"page-{i}"
    return more


class Crawl:
    """What the page and report handlers saw, in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pages: list[int] = []
        self.reports: list[int] = []

    def register(self, registry: rl.JobRegistry) -> None:
        @registry.job(PAGE)
        def page(ctx: rl.JobContext, payload: dict) -> None:
            with self.lock:
                self.pages.append(payload["n"])

        @registry.job(REPORT)
        def report(ctx: rl.JobContext, payload: dict) -> None:
            with self.lock:
                self.reports.append(len(self.pages))


def assert_fan_in_ran_once_after_every_page(engine, run_id, seen: Crawl) -> None:
    final = rl.get_workflow_run(engine, run_id)
    assert final.status is Run.SUCCEEDED
    assert {step.status for step in final.steps} == {Step.SUCCEEDED}
    assert seen.pages == list(range(1, PAGES + 1))
    assert seen.reports == [PAGES]
    reports = rows(engine, "SELECT j.created_at FROM job_queue j JOIN workflow_steps s ON s.id = j.workflow_step_id "
                           "WHERE s.run_id = :run AND j.job_type = :t", run=run_id, t=REPORT)
    last_page_end = scalar(engine, "SELECT max(j.finished_at) FROM job_queue j JOIN workflow_steps s "
                                   "ON s.id = j.workflow_step_id WHERE s.run_id = :run AND j.job_type = :t",
                           run=run_id, t=PAGE)
    assert len(reports) == 1 and reports[0].created_at >= last_page_end
    assert [m.mutation_key for m in final.mutations] == ["pages"]


def test_a_hundred_appended_pages_run_in_order_and_the_fan_in_after_the_window_runs_once_after_them(
        engine, start_loop):
    seen = Crawl()
    registry = rl.JobRegistry()
    seen.register(registry)

    @registry.job(LIST)
    def listing(ctx: rl.JobContext, payload: dict) -> None:
        # On the worker's own database, committed at once; then the window closes.
        ctx.workflow.append(chained_pages(PAGES), mutation_key="pages")
        rl.complete_external_step(engine, ctx.workflow.run_id, "collect")

    registry.sync_definitions(engine)
    start_loop("worker", registry, fast_config(max_global_concurrency=4, claim_batch_size=4))
    run = rl.enqueue_workflow(engine, crawl())

    wait_until(lambda: rl.get_workflow_run(engine, run.id).status is Run.SUCCEEDED, timeout=90)

    assert_fan_in_ran_once_after_every_page(engine, run.id, seen)
    assert scalar(engine, "SELECT max(attempt) FROM job_queue") == 1


def test_an_append_in_the_handlers_transaction_commits_with_its_success_and_rolls_back_with_its_failure(
        engine, start_loop):
    seen = Crawl()
    registry = rl.JobRegistry()
    seen.register(registry)
    attempts: list[int] = []

    @registry.job(LIST, max_attempts=2, retry_delay_overrides={RETRY: 10})
    def listing(ctx: rl.JobContext, payload: dict) -> None:
        attempts.append(ctx.attempt)
        with engine.begin() as conn:
            ctx.workflow.append(chained_pages(PAGES), mutation_key="pages", bind=conn)
            rl.complete_external_step(conn, ctx.workflow.run_id, "collect")
            if ctx.attempt == 1:
                # Everything above rolls back with this attempt's transaction.
                raise rl.JobFailure.retryable(RETRY, "the listing was cut short")
            ctx.complete_in(conn)

    registry.sync_definitions(engine)
    start_loop("worker", registry, fast_config(max_global_concurrency=4, claim_batch_size=4))
    run = rl.enqueue_workflow(engine, crawl())

    wait_until(lambda: rl.get_workflow_run(engine, run.id).status is Run.SUCCEEDED, timeout=90)

    assert attempts == [1, 2]
    assert_fan_in_ran_once_after_every_page(engine, run.id, seen)
    assert scalar(engine, "SELECT count(*) FROM workflow_run_mutations WHERE run_id = :run", run=run.id) == 1


def test_ctx_workflow_append_outside_a_worker_says_so():
    context = rl.WorkflowContext(step_id=None, load_step=lambda _: (None, "s"), load_output=lambda *_: None)
    with pytest.raises(RuntimeError, match="only available inside a worker"):
        context.append(rl.WorkflowAppend(window="w"), mutation_key="k")


def test_an_attempt_retried_after_its_append_committed_appends_nothing_twice(engine, start_loop):
    seen = Crawl()
    registry = rl.JobRegistry()
    seen.register(registry)
    appended: list = []

    @registry.job(LIST, max_attempts=2, retry_delay_overrides={RETRY: 10})
    def listing(ctx: rl.JobContext, payload: dict) -> None:
        # Committed at once, on the worker's database: the retry finds the append by its key.
        appended.append(len(ctx.workflow.append(chained_pages(PAGES), mutation_key="pages").steps))
        if ctx.attempt == 1:
            raise rl.JobFailure.retryable(RETRY, "the listing failed after its append")
        rl.complete_external_step(engine, ctx.workflow.run_id, "collect")

    registry.sync_definitions(engine)
    start_loop("worker", registry, fast_config(max_global_concurrency=4, claim_batch_size=4))
    run = rl.enqueue_workflow(engine, crawl())

    wait_until(lambda: rl.get_workflow_run(engine, run.id).status is Run.SUCCEEDED, timeout=90)

    assert appended == [PAGES + 3, PAGES + 3]
    assert_fan_in_ran_once_after_every_page(engine, run.id, seen)
    assert rl.get_workflow_run(engine, run.id).step("report").dependencies_total == PAGES + 2
