"""The claim narrowed to named jobs, and make_jobs_due (what testing.run_job and drain(include_scheduled=True) rest on)."""

from __future__ import annotations

import pytest

import runledger_sync as rl
from runledger_sync.core.errors import InvalidArgument
from runledger_sync.store.admin.actions import make_jobs_due
from runledger_sync.store.claim.claim import claim_prestart_jobs_for_types
from tests.support import JOB_TYPE, define, scalar


def claim(engine, job_ids=None, job_types=(JOB_TYPE,), limit=10):
    return claim_prestart_jobs_for_types(engine, worker_id="worker-a", lease_ttl_seconds=30, limit=limit,
                                         job_types=list(job_types), job_ids=job_ids)


def next_run_in_seconds(engine, job_id) -> float:
    return scalar(engine, "SELECT extract(epoch FROM next_run_at - now()) FROM job_queue WHERE id = :id", id=job_id)


def test_a_named_claim_takes_only_the_named_jobs_whatever_their_place_in_the_queue(engine):
    define(engine)
    first = rl.enqueue(engine, JOB_TYPE, {}, priority=100)
    named = rl.enqueue(engine, JOB_TYPE, {}, priority=-100)

    assert [job.id for job in claim(engine, job_ids=[str(named.id)])] == [named.id]
    assert rl.get_job(engine, first.id).status is rl.JobStatus.PENDING
    assert claim(engine, job_ids=[named.id]) == []  # already leased


def test_a_named_claim_still_keeps_every_claim_rule(engine):
    define(engine)
    later = rl.enqueue(engine, JOB_TYPE, {}, delay_seconds=3600)
    rl.configure_queue(engine, "held")
    rl.pause_queue(engine, "held")
    paused = rl.enqueue(engine, JOB_TYPE, {}, queue="held")
    other = rl.enqueue(engine, JOB_TYPE, {})

    assert claim(engine, job_ids=[later.id, paused.id]) == []
    assert claim(engine, job_ids=[other.id], job_types=["another.type"]) == []
    assert claim(engine, job_ids=[]) == []


def test_a_named_claim_refuses_a_malformed_id(engine):
    with pytest.raises(InvalidArgument) as raised:
        claim(engine, job_ids=["not-a-uuid"])
    assert raised.value.code == "job.invalid_argument"


def test_make_jobs_due_brings_forward_only_the_jobs_due_first(engine):
    define(engine)
    define(engine, "other.type")
    hour = [rl.enqueue(engine, JOB_TYPE, {"n": n}, delay_seconds=3600) for n in range(2)]
    rl.enqueue(engine, JOB_TYPE, {}, delay_seconds=7200)
    sooner_elsewhere = rl.enqueue(engine, "other.type", {}, delay_seconds=60)
    due = rl.enqueue(engine, JOB_TYPE, {})

    # Same delay, but two statements: the earliest next_run_at is the first job's alone.
    assert make_jobs_due(engine, job_types=[JOB_TYPE]) == [hour[0].id]
    assert next_run_in_seconds(engine, hour[0].id) <= 0
    assert next_run_in_seconds(engine, hour[1].id) > 3000
    assert next_run_in_seconds(engine, due.id) <= 0
    assert make_jobs_due(engine) == [sooner_elsewhere.id]


def test_make_jobs_due_with_ids_brings_those_forward_and_leaves_due_and_finished_jobs(engine):
    define(engine)
    later = rl.enqueue(engine, JOB_TYPE, {}, delay_seconds=3600)
    untouched = rl.enqueue(engine, JOB_TYPE, {}, delay_seconds=3600)
    due = rl.enqueue(engine, JOB_TYPE, {})
    before = rl.get_job(engine, due.id).next_run_at

    assert make_jobs_due(engine, job_ids=[later.id, due.id]) == [later.id]
    assert rl.get_job(engine, due.id).next_run_at == before
    assert next_run_in_seconds(engine, untouched.id) > 3000
    assert make_jobs_due(engine, job_ids=[]) == []


def test_make_jobs_due_returns_nothing_when_nothing_waits(engine):
    define(engine)
    rl.enqueue(engine, JOB_TYPE, {})
    assert make_jobs_due(engine) == []
