"""A worker process running a crawl that appends its pages, for the kill test; written against the public API only.

Usage: ``python append_worker_process.py <database url>``

``crawl.list`` appends PAGES pages at the window ``collect``, each page after the
one before (so they run one at a time, in order), then answers the window;
``crawl.page`` takes PAGE_SECONDS; ``crawl.report`` counts the pages that
succeeded before it. The process runs ``Supervisor.run_until_shutdown`` with a
short lease (2 s) and logs JSON lines to stderr.
"""

from __future__ import annotations

import os
import sys

import runledger_sync as rl

LIST, PAGE, REPORT = "crawl.list", "crawl.page", "crawl.report"
PAGES = 100
PAGE_SECONDS = 0.1
LEASE_TTL_SECONDS = 2


def crawl() -> rl.Workflow:
    wf = rl.Workflow("crawl")
    listing = wf.job("list", LIST)
    wf.job("report", REPORT, after=[listing, wf.external("collect")])
    return wf


def pages() -> rl.WorkflowAppend:
    more = rl.WorkflowAppend(window="collect")
    previous = "list"
    for n in range(1, PAGES + 1):
        more.job(f"page-{n}", PAGE, {"n": n}, after=[previous])
        previous = f"page-{n}"
    return more


def build_registry(engine: object) -> rl.JobRegistry:
    registry = rl.JobRegistry()

    @registry.job(LIST, max_attempts=5)
    def listing(ctx: rl.JobContext, payload: dict) -> None:
        # Committed on its own: a retry after a kill appends nothing twice (same key, same steps).
        ctx.workflow.append(pages(), mutation_key="pages")
        run = rl.get_workflow_run(engine, ctx.workflow.run_id)
        if run.step("collect").status is rl.WorkflowStepStatus.WAITING_FOR_EXTERNAL:
            rl.complete_external_step(engine, ctx.workflow.run_id, "collect")

    @registry.job(PAGE, max_attempts=5)
    def page(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
        ctx.wait_cancelled(PAGE_SECONDS)
        ctx.check_cancelled()
        return rl.JobCompletion(output={"n": payload["n"]})

    @registry.job(REPORT, max_attempts=5)
    def report(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
        run = rl.get_workflow_run(engine, ctx.workflow.run_id)
        done = [step for step in run.steps if step.key.startswith("page-") and step.status.value == "SUCCEEDED"]
        return rl.JobCompletion(output={"pages": len(done)})

    return registry


def config(worker_id: str) -> rl.JobsConfig:
    return rl.JobsConfig(
        worker_id=worker_id,
        poll_interval_ms=50,
        max_global_concurrency=2,
        lease_ttl_seconds=LEASE_TTL_SECONDS,
        heartbeat_interval_seconds=0.5,
        reaper_interval_seconds=0.2,
        reaper_retry_delay_ms=1,
    )


def main(url: str) -> int:
    engine = rl.create_engine(url)
    rl.configure_logging(level="INFO", stream=sys.stderr)
    return rl.Supervisor(engine, build_registry(engine), config(f"proc-{os.getpid()}")).run_until_shutdown(
        drain_timeout=10)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
