"""An appended run of 100 pages through a PostgreSQL restart and a SIGKILL, as one member of a batch.

The run is the crawl of the append kill test (a listing step appends 100 pages, each
after the one before, at a window the report waits for), run by two worker
processes on a dedicated server that is stopped and started again mid-run, with a
worker killed mid-page after it. Every page must run in order, each job succeed
once, the report run once after the last page, and the batch the run belongs to
finish once with its callback enqueued exactly once.
"""

from __future__ import annotations

import pytest

import runledger_sync as rl
from runledger_sync.core.workflow import WorkflowRunStatus as Run
from tests.db.runtime import append_worker_process as proc
from tests.db.runtime.process_support import WorkerProcess
from tests.db.runtime.test_workflows_append_kill import (
    SCRIPT,
    assert_pages_in_order_each_once_and_the_report_once,
    kill_the_one_running_a_page,
    pages_done,
)
from tests.faults.scenarios import RestartableServer
from tests.support import define, scalar, wait_until

#: The batch's callback: a definition no worker here runs, so its one row stays to be counted.
DONE = "crawl.done"


@pytest.mark.timeout(90)
def test_appended_pages_run_in_order_through_a_postgres_restart_and_a_kill_and_the_batch_ends_once(tmp_path):
    server = RestartableServer(tmp_path, down_seconds=1.0)
    engine = rl.create_engine(server.url)
    workers: list[WorkerProcess] = []
    try:
        proc.build_registry(engine).sync_definitions(engine)
        define(engine, DONE)
        batch = rl.open_batch(engine, on_complete=(DONE, {}))
        run = rl.enqueue_workflow(engine, proc.crawl(), batch=batch.id)
        rl.close_batch(engine, batch.id)
        workers.extend(WorkerProcess(server.url, None, script=SCRIPT) for _ in range(2))

        wait_until(lambda: pages_done(engine, run.id) >= 25, timeout=30)
        engine.dispose()
        server.restart()
        engine = rl.create_engine(server.url)
        wait_until(lambda: pages_done(engine, run.id) >= 50, timeout=30)
        kill_the_one_running_a_page(engine, workers)
        workers.append(WorkerProcess(server.url, None, script=SCRIPT))
        wait_until(lambda: rl.get_workflow_run(engine, run.id).status is Run.SUCCEEDED, timeout=40)
        assert all(worker.process.poll() is None for worker in workers), [w.output()[-2000:] for w in workers]
    finally:
        for worker in workers:
            worker.stop()

    try:
        assert_pages_in_order_each_once_and_the_report_once(engine, run.id)
        done = rl.get_batch(engine, batch.id)
        assert (done.status, done.total, done.succeeded, done.pending, done.runs) == (
            rl.BatchStatus.SUCCEEDED, 1, 1, 0, 1)
        assert scalar(engine, "SELECT count(*) FROM job_queue WHERE job_type = :t", t=DONE) == 1
        print(f"append faults: {proc.PAGES} pages, downtime {server.downtimes}")
    finally:
        engine.dispose()
        server.close()
