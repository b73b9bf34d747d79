"""A worker process killed with SIGKILL in the middle of a workflow run: the run still finishes."""

from __future__ import annotations

import signal
from pathlib import Path

import runledger_sync as rl
from runledger_sync.core.workflow import WorkflowRunStatus as Run
from tests.db.runtime import workflow_worker_process as proc
from tests.db.runtime.process_support import WorkerProcess
from tests.support import rows, wait_until

SCRIPT = Path(proc.__file__)


def diamond() -> rl.Workflow:
    wf = rl.Workflow("diamond")
    start = wf.job("start", proc.JOB_TYPE)
    middle = [wf.job(f"m{i}", proc.JOB_TYPE, after=[start]) for i in range(4)]
    join = wf.job("join", proc.JOB_TYPE, after=middle)
    wf.job("end", proc.JOB_TYPE, after=[join])
    return wf


def succeeded_steps(engine, run_id) -> int:
    return sum(step.status.value == "SUCCEEDED" for step in rl.get_workflow_run(engine, run_id).steps)


def test_a_run_whose_worker_was_killed_finishes_with_one_successful_attempt_per_step(engine, fresh_database):
    proc.build_registry().sync_definitions(engine)
    run = rl.enqueue_workflow(engine, diamond())
    doomed = WorkerProcess(fresh_database, None, script=SCRIPT)
    try:
        # Killed with the fan-out under way: some steps done, a job of another running.
        wait_until(lambda: succeeded_steps(engine, run.id) >= 2, timeout=30)
        # A step started within the last 200 ms still has 300 ms of its handler to go: the
        # kill lands mid-handler, never just as its success commits.
        wait_until(lambda: rows(engine, "SELECT 1 FROM job_queue WHERE status = 'LEASED' AND stage = 'running' "
                                        "AND started_at > clock_timestamp() - interval '200 milliseconds'"),
                   timeout=10, interval=0.01)
        doomed.process.send_signal(signal.SIGKILL)
        doomed.process.wait(10)
    finally:
        doomed.stop()
    assert rl.get_workflow_run(engine, run.id).status is Run.RUNNING

    with rl.Supervisor(engine, proc.build_registry(), proc.config("worker-rescuer")):
        wait_until(lambda: rl.get_workflow_run(engine, run.id).status is Run.SUCCEEDED, timeout=60)

    final = rl.get_workflow_run(engine, run.id)
    assert [step.output for step in final.steps] == [{"key": step.key} for step in final.steps]
    per_job = rows(engine, "SELECT j.id, count(a.id) FILTER (WHERE a.finished_at IS NOT NULL AND a.outcome IS NULL) "
                           "AS ok, count(a.id) FILTER (WHERE a.outcome = 'LEASE_EXPIRED') AS lost "
                           "FROM job_queue j LEFT JOIN job_attempts a ON a.job_id = j.id GROUP BY j.id")
    assert len(per_job) == len(final.steps) == 7
    assert {row.ok for row in per_job} == {1}
    assert sum(row.lost for row in per_job) >= 1  # the killed worker's job went through the reaper
