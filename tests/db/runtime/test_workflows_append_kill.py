"""An appended run of 100 pages across two worker processes, each killed with SIGKILL mid-run: in order, fan-in once."""

from __future__ import annotations

import signal
from pathlib import Path

import runledger_sync as rl
from runledger_sync.core.workflow import WorkflowRunStatus as Run
from tests.db.runtime import append_worker_process as proc
from tests.db.runtime.process_support import WorkerProcess
from tests.support import rows, scalar, wait_until

SCRIPT = Path(proc.__file__)


def pages_done(engine, run_id) -> int:
    return scalar(engine, "SELECT count(*) FROM workflow_steps WHERE run_id = :run AND step_key LIKE 'page-%' "
                          "AND status = 'SUCCEEDED'", run=run_id)


def kill_the_one_running_a_page(engine, workers: list[WorkerProcess]) -> None:
    """SIGKILL the worker process that holds the running page job (worker ids are ``proc-<pid>``)."""
    # A page started within the last 40 ms still has 60 ms of its handler to go: the kill
    # lands mid-handler, never just as its success commits.
    holder = wait_until(lambda: scalar(engine, "SELECT worker_id FROM job_queue WHERE job_type = :t AND "
                                               "status = 'LEASED' AND stage = 'running' AND "
                                               "started_at > clock_timestamp() - interval '40 milliseconds'",
                                       t=proc.PAGE), timeout=20, interval=0.005)
    [doomed] = [worker for worker in workers if holder == f"proc-{worker.process.pid}"]
    doomed.process.send_signal(signal.SIGKILL)
    doomed.process.wait(10)
    workers.remove(doomed)
    doomed.stop()


def test_appended_pages_run_in_order_through_two_kills_and_the_report_runs_once_after_them(engine, fresh_database):
    proc.build_registry(engine).sync_definitions(engine)
    run = rl.enqueue_workflow(engine, proc.crawl())
    workers = [WorkerProcess(fresh_database, None, script=SCRIPT) for _ in range(2)]
    try:
        wait_until(lambda: pages_done(engine, run.id) >= 20, timeout=60)
        kill_the_one_running_a_page(engine, workers)
        workers.append(WorkerProcess(fresh_database, None, script=SCRIPT))
        wait_until(lambda: pages_done(engine, run.id) >= 60, timeout=60)
        kill_the_one_running_a_page(engine, workers)
        wait_until(lambda: rl.get_workflow_run(engine, run.id).status is Run.SUCCEEDED, timeout=120)
    finally:
        for worker in workers:
            worker.stop()

    assert_pages_in_order_each_once_and_the_report_once(engine, run.id)


def assert_pages_in_order_each_once_and_the_report_once(engine, run_id) -> None:
    """Every page ran, each released after the one before ended; one success per step; the fan-in once, last."""
    final = rl.get_workflow_run(engine, run_id)
    assert final.status is Run.SUCCEEDED
    assert [m.mutation_key for m in final.mutations] == ["pages"]
    assert final.step("report").output == {"pages": proc.PAGES}
    jobs = rows(engine, "SELECT s.step_key, j.created_at, j.finished_at, "
                        "(SELECT count(*) FROM job_attempts a WHERE a.job_id = j.id AND a.finished_at IS NOT NULL "
                        " AND a.outcome IS NULL) AS ok, "
                        "(SELECT count(*) FROM job_attempts a WHERE a.job_id = j.id AND a.outcome = 'LEASE_EXPIRED') "
                        " AS lost "
                        "FROM workflow_steps s JOIN job_queue j ON j.workflow_step_id = s.id WHERE s.run_id = :run",
                 run=run_id)
    by_key = {job.step_key: job for job in jobs}
    assert len(jobs) == proc.PAGES + 2  # one job per step: list, the pages, report
    assert {job.ok for job in jobs} == {1}
    # A killed worker's page went through the reaper (a kill may land between two pages: at least one did).
    assert sum(job.lost for job in jobs) >= 1
    # Each page was released only once the page before it had ended, and the report after the last.
    order = ["list", *(f"page-{n}" for n in range(1, proc.PAGES + 1)), "report"]
    for before, after in zip(order, order[1:], strict=False):
        assert by_key[after].created_at >= by_key[before].finished_at, (before, after)
