"""Why a PENDING job waits: each reason of explain_wait, in the order a claim meets them, on real rows."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest

import runledger_sync as rl
from runledger_sync.store.attempt.ends import complete_job_success
from runledger_sync.store.driver import claim_jobs, record_worker
from runledger_sync.store.enqueue.enqueue import enqueue
from runledger_sync.store.queues import configure_queue, explain_wait, pause_queue
from tests.support import JOB_TYPE, define, identity

W = rl.WaitReason


@pytest.fixture(autouse=True)
def defined(engine) -> None:
    define(engine)
    # A live worker serves every queue and the test's type, unless a test says otherwise.
    record_worker(engine, "w-serving", queues=None, job_types=[JOB_TYPE])


def claim(engine: Any, limit: int = 10) -> list[Any]:
    return claim_jobs(engine, worker_id="w", lease_ttl_seconds=30, limit=limit)


def test_a_job_that_is_not_pending_waits_for_nothing(engine):
    job = enqueue(engine, JOB_TYPE, {})
    [leased] = claim(engine)
    assert explain_wait(engine, leased.id) is None
    complete_job_success(engine, **identity(leased))
    assert explain_wait(engine, job.id) is None


def test_an_unknown_job_is_refused_with_its_code(engine):
    with pytest.raises(rl.JobNotFound):
        explain_wait(engine, UUID(int=1))


def test_a_due_job_of_a_served_queue_is_ready(engine):
    wait = explain_wait(engine, enqueue(engine, JOB_TYPE, {}).id)
    assert wait.reason is W.READY and "default" in wait.message


def test_a_delayed_job_is_not_due_until_its_run_time(engine):
    job = enqueue(engine, JOB_TYPE, {}, delay_seconds=3600)
    wait = explain_wait(engine, job.id)
    assert (wait.reason, wait.until) == (W.NOT_DUE, job.next_run_at)


def test_not_due_comes_before_a_paused_queue(engine):
    job = enqueue(engine, JOB_TYPE, {}, delay_seconds=3600)
    pause_queue(engine, "default")
    assert explain_wait(engine, job.id).reason is W.NOT_DUE


def test_a_paused_queue_is_named(engine):
    job = enqueue(engine, JOB_TYPE, {})
    pause_queue(engine, "default")
    wait = explain_wait(engine, job.id)
    assert wait.reason is W.QUEUE_PAUSED and "'default' is paused" in wait.message


def test_a_busy_key_names_the_job_holding_its_turn(engine):
    head = enqueue(engine, JOB_TYPE, {}, concurrency_key="customer:42")
    nxt = enqueue(engine, JOB_TYPE, {}, concurrency_key="customer:42")
    wait = explain_wait(engine, nxt.id)
    assert (wait.reason, wait.blocking_job_id) == (W.KEY_BUSY, head.id)
    [leased] = claim(engine)
    assert explain_wait(engine, nxt.id).blocking_job_id == leased.id == head.id


def test_a_full_global_limit_says_how_many_run(engine):
    configure_queue(engine, "capped", global_limit=1)
    enqueue(engine, JOB_TYPE, {}, queue="capped")
    waiting = enqueue(engine, JOB_TYPE, {}, queue="capped")
    assert len(claim(engine)) == 1
    wait = explain_wait(engine, waiting.id)
    assert wait.reason is W.GLOBAL_LIMIT and "1 of 1" in wait.message


def test_a_spent_rate_budget_says_until_when(engine):
    configure_queue(engine, "rated", rate_limit=rl.RateLimit(1, per_seconds=600))
    enqueue(engine, JOB_TYPE, {}, queue="rated")
    waiting = enqueue(engine, JOB_TYPE, {}, queue="rated")
    [first] = claim(engine)
    wait = explain_wait(engine, waiting.id)
    assert wait.reason is W.RATE_LIMITED
    # The window runs from the claim's own instant, which its attempt row keeps.
    assert wait.until == rl.list_attempts(engine, first.id)[0].leased_at + timedelta(seconds=600)


def test_a_spent_per_key_budget_holds_only_that_key(engine):
    configure_queue(engine, "per-key", key_limit=None, rate_limit=rl.RateLimit(1, per_seconds=600, per_key=True))
    enqueue(engine, JOB_TYPE, {}, queue="per-key", concurrency_key="a")
    same = enqueue(engine, JOB_TYPE, {}, queue="per-key", concurrency_key="a")
    other = enqueue(engine, JOB_TYPE, {}, queue="per-key", concurrency_key="b")
    assert len(claim(engine, limit=1)) == 1
    assert explain_wait(engine, same.id).reason is W.RATE_LIMITED
    assert explain_wait(engine, other.id).reason is W.READY


def test_no_live_worker_serving_the_queue_or_type_is_said(engine):
    job = enqueue(engine, JOB_TYPE, {}, queue=configure_queue(engine, "mail").name)
    record_worker(engine, "w-serving", queues=["default"], job_types=[JOB_TYPE])
    assert explain_wait(engine, job.id).reason is W.NO_WORKER
    record_worker(engine, "w-serving", queues=["mail"], job_types=["other.type"])
    assert explain_wait(engine, job.id).reason is W.NO_WORKER
    record_worker(engine, "w-serving", queues=["mail"], job_types=[JOB_TYPE])
    assert explain_wait(engine, job.id).reason is W.READY
