"""An outcome that needs a read to be decided, when the database stays out of reach for that read.

A retryable failure reads the run's earlier attempts, and a workflow job's
continuation reads whether its step opted in. If that read keeps failing for
as long as the lease lasts, nothing is written: the job stays LEASED under the
attempt's lease, and the reaper takes it back when the lease runs out.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

import runledger_sync as rl
from runledger_sync.core.store_errors import ConnectionFailed
from runledger_sync.runtime.attempt.run import process_claimed_job
from runledger_sync.store import driver
from runledger_sync.store.driver import driver_for
from tests.handlers import fast_config
from tests.support import JOB_TYPE, claim_one, rows

# The read is retried while the lease lasts: a short lease keeps the test short.
CONFIG = fast_config(lease_ttl_seconds=1)


def unreachable(*_args: Any, **_kwargs: Any) -> Any:
    raise ConnectionFailed("the database is out of reach")


def busy(ctx: rl.JobContext, payload: Any) -> None:
    raise rl.JobFailure.retryable("api.busy", "try again")


def broken(ctx: rl.JobContext, payload: Any) -> None:
    raise rl.JobFailure.terminal("bad.input", "never")


def continues(ctx: rl.JobContext, payload: Any) -> rl.JobCompletion:
    return rl.JobCompletion(continue_after=0)


def run_once_unreachable(engine: Any, registry: rl.JobRegistry, monkeypatch: Any, read: str) -> Any:
    job = claim_one(engine, worker_id=CONFIG.worker_id, lease_ttl_seconds=CONFIG.lease_ttl_seconds)
    monkeypatch.setattr(driver, read, unreachable)
    process_claimed_job(driver_for(engine), registry, job, CONFIG)
    return job


def assert_nothing_written(engine: Any, job: Any, caplog: Any, what: str) -> None:
    (row,) = rows(engine, "SELECT status, run_number, attempt FROM job_queue WHERE id = :id", id=job.id)
    assert (row.status, row.run_number, row.attempt) == ("LEASED", job.run_number, job.attempt)
    (attempt,) = rows(engine, "SELECT finished_at, outcome FROM job_attempts WHERE job_id = :id", id=job.id)
    assert (attempt.finished_at, attempt.outcome) == (None, None)
    assert [r.getMessage() for r in caplog.records if "could not be decided" in r.getMessage()] == [
        f"job {what} could not be decided: the database stayed out of reach; the reaper retries the job"]


def test_a_retryable_failure_whose_earlier_attempts_cannot_be_read_writes_nothing(engine, monkeypatch, caplog):
    registry = rl.JobRegistry()
    registry.job(JOB_TYPE, max_attempts=3)(busy)
    registry.sync_definitions(engine)
    rl.enqueue(engine, JOB_TYPE, {})

    with caplog.at_level(logging.WARNING):
        job = run_once_unreachable(engine, registry, monkeypatch, "read_earlier_attempts")

    assert_nothing_written(engine, job, caplog, "failure")


def test_a_continuation_whose_step_cannot_be_read_writes_nothing(engine, monkeypatch, caplog):
    registry = rl.JobRegistry()
    registry.job(JOB_TYPE)(continues)
    registry.sync_definitions(engine)
    wf = rl.Workflow("paged")
    wf.job("sync", JOB_TYPE, {}, continuation=True)
    rl.enqueue_workflow(engine, wf)

    with caplog.at_level(logging.WARNING):
        job = run_once_unreachable(engine, registry, monkeypatch, "step_allows_continuation")

    assert_nothing_written(engine, job, caplog, "continuation")


@pytest.mark.parametrize(("handler", "read", "status"), [
    (continues, "step_allows_continuation", "PENDING"),  # a plain job's continuation reads no step
    (broken, "read_earlier_attempts", "DEAD_LETTERED"),  # a terminal failure reads no earlier attempts
])
def test_an_outcome_that_needs_no_read_is_written_without_it(engine, monkeypatch, handler, read, status):
    registry = rl.JobRegistry()
    registry.job(JOB_TYPE)(handler)
    registry.sync_definitions(engine)
    rl.enqueue(engine, JOB_TYPE, {})

    job = run_once_unreachable(engine, registry, monkeypatch, read)

    (row,) = rows(engine, "SELECT status FROM job_queue WHERE id = :id", id=job.id)
    assert row.status == status
