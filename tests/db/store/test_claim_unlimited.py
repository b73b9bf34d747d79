"""The claim that counts nothing: only for queues without a global or rate limit, and never past one.

A worker whose served queues have no such limit claims without the advisory
locks, the LEASED counts and the rate log. Its answer to "is any served queue
limited?" can be a second old, so the claim itself must leave a queue alone
that has a limit by the time it runs.
"""

from __future__ import annotations

from typing import Any

import pytest

import runledger_sync as rl
from runledger_sync.store.transactions import HeldConnection
from runledger_sync.store.driver import claim_and_start_jobs, claim_prestart_jobs_for_types, serves_limited_queue
from runledger_sync.store.enqueue.enqueue import enqueue_many
from runledger_sync.store.queues import configure_queue, pause_queue
from runledger_sync.store.driver import driver_for
from tests.support import JOB_TYPE, define, scalar


@pytest.fixture(autouse=True)
def defined(engine) -> None:
    define(engine)


def jobs_in(engine: Any, queue: str, count: int) -> None:
    enqueue_many(engine, [rl.JobSpec(JOB_TYPE, {"n": n}, queue=queue) for n in range(count)])


def leased_by_queue(engine: Any) -> dict[str, int]:
    return {queue: scalar(engine, "SELECT count(*) FROM job_queue WHERE status = 'LEASED' AND queue = :q", q=queue)
            for queue in ("plain", "capped", "metered")}


def unlimited_claim(bind: Any, limit: int = 50, **kwargs: Any) -> list[Any]:
    return claim_prestart_jobs_for_types(bind, worker_id="w", lease_ttl_seconds=30, limit=limit,
                                         job_types=[JOB_TYPE], unlimited_only=True, **kwargs)


def test_serves_limited_queue_answers_for_the_served_unpaused_queues(engine) -> None:
    configure_queue(engine, "plain")
    assert serves_limited_queue(engine, None) is False
    configure_queue(engine, "capped", global_limit=2)
    assert serves_limited_queue(engine, None) is True
    assert serves_limited_queue(engine, ["plain"]) is False
    assert serves_limited_queue(engine, ["plain", "capped"]) is True
    pause_queue(engine, "capped")
    assert serves_limited_queue(engine, None) is False
    configure_queue(engine, "metered", rate_limit=rl.RateLimit(5, per_seconds=60))
    assert serves_limited_queue(engine, ["metered"]) is True
    configure_queue(engine, "metered", rate_limit=None)
    assert serves_limited_queue(engine, ["metered"]) is False


def test_an_unlimited_claim_takes_only_from_queues_without_a_global_or_rate_limit(engine) -> None:
    configure_queue(engine, "plain")
    configure_queue(engine, "capped", global_limit=2)
    configure_queue(engine, "metered", rate_limit=rl.RateLimit(3, per_seconds=60))
    for queue in ("plain", "capped", "metered"):
        jobs_in(engine, queue, 5)
    claimed = unlimited_claim(engine)
    assert {job.queue for job in claimed} == {"plain"}
    assert leased_by_queue(engine) == {"plain": 5, "capped": 0, "metered": 0}
    assert scalar(engine, "SELECT count(*) FROM job_queue_rate_claims") == 0
    # The counting claim serves the limited ones, each within its limit.
    claimed = claim_prestart_jobs_for_types(engine, worker_id="w", lease_ttl_seconds=30, limit=50, job_types=[JOB_TYPE])
    assert sorted(job.queue for job in claimed) == ["capped"] * 2 + ["metered"] * 3
    assert scalar(engine, "SELECT count(*) FROM job_queue_rate_claims") == 3


def test_a_limit_set_after_the_caller_looked_is_not_overrun(engine) -> None:
    configure_queue(engine, "capped")
    jobs_in(engine, "capped", 6)
    assert serves_limited_queue(engine, None) is False
    configure_queue(engine, "capped", global_limit=1)
    # The caller still goes by its earlier answer: the claim leaves the queue alone.
    assert unlimited_claim(engine) == []
    held = HeldConnection(engine)
    try:
        started = claim_and_start_jobs(held, worker_id="w", lease_ttl_seconds=30, limit=50, job_types=[JOB_TYPE],
                                       unlimited_only=True)
    finally:
        held.close()
    assert started.running == [] and started.unstarted == []
    assert leased_by_queue(engine)["capped"] == 0


def test_an_unlimited_claim_keeps_pause_the_workers_share_and_the_claim_order(engine) -> None:
    configure_queue(engine, "plain")
    configure_queue(engine, "capped")
    jobs_in(engine, "plain", 4)
    jobs_in(engine, "capped", 4)
    pause_queue(engine, "capped")
    assert {job.queue for job in unlimited_claim(engine)} == {"plain"}
    rl.resume_queue(engine, "capped")
    jobs_in(engine, "plain", 4)
    claimed = unlimited_claim(engine, queue_rooms={"capped": 1, "plain": 2})
    assert sorted(job.queue for job in claimed) == ["capped", "plain", "plain"]
    claimed = unlimited_claim(engine, limit=2, queues=["plain"])
    assert [job.queue for job in claimed] == ["plain", "plain"]
    assert claimed[0].created_at <= claimed[1].created_at


def test_the_workers_watch_looks_again_once_its_answer_is_old_and_counts_when_it_cannot_look(engine, monkeypatch) -> None:
    from runledger_sync.runtime.worker import queue_limits

    configure_queue(engine, "plain")
    # An hour here, so a slow box cannot let the answer expire between two calls.
    monkeypatch.setattr(queue_limits, "LOOK_AGAIN_SECONDS", 3600.0)
    watch = queue_limits.QueueLimitsWatch(None, "w")
    assert watch.limited(driver_for(engine)) is False
    configure_queue(engine, "plain", global_limit=3)
    assert watch.limited(driver_for(engine)) is False  # the answer stands until it is LOOK_AGAIN_SECONDS old
    monkeypatch.setattr(queue_limits, "LOOK_AGAIN_SECONDS", 0.0)
    assert watch.limited(driver_for(engine)) is True
    configure_queue(engine, "plain", global_limit=None)
    assert watch.limited(driver_for(engine)) is False
    engine.dispose()
    assert queue_limits.QueueLimitsWatch(None, "w").limited(object()) is True
