"""Completion-progress rules against a real PostgreSQL (hypothesis, small example counts).

Spec section 4, "Complete success": the handler's values are checked alone,
then coalesced with the stored progress (None keeps the stored value) and
checked again; either failure is ``job.invalid_completion_progress`` and rolls
everything back (the job stays LEASED, no event). Otherwise the job is
SUCCEEDED with the coalesced progress, and ``progress_pct`` is
round(done * 100 / total, 2) when total > 0, else NULL. Progress updates
coalesce the same way and refuse with ``job.invalid_progress``.
"""

from __future__ import annotations

import os
from decimal import ROUND_HALF_UP, Decimal
from typing import Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import runledger_sync as rl
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.store.claim.claim import claim_jobs
from runledger_sync.store.attempt.ends import complete_job_success
from runledger_sync.store.attempt.running import update_job_progress
from tests.support import define, scalar

JOB_TYPE = "prop.progress"
BIGINT_MAX = 2**63 - 1
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

counts = st.none() | st.integers(min_value=-2, max_value=20) | st.sampled_from([BIGINT_MAX, BIGINT_MAX + 1])
valid_stored = st.tuples(st.integers(min_value=0, max_value=20), st.integers(min_value=0, max_value=20)).map(
    lambda pair: (min(pair), max(pair))
) | st.just((None, None))


def alone_valid(done: Optional[int], total: Optional[int]) -> bool:
    in_range = all(value is None or 0 <= value <= BIGINT_MAX for value in (done, total))
    return in_range and (done is None or total is None or done <= total)


def expected_pct(done: Optional[int], total: Optional[int]) -> Optional[Decimal]:
    if done is None or total is None or total <= 0:
        return None
    return (Decimal(done) * 100 / Decimal(total)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


@pytest.fixture(scope="module")
def engine(pg_server, template_database):
    name = f"rl_prop_progress_{os.getpid()}"
    engine = rl.create_engine(pg_server.create_database(name, template=template_database, drop_existing=True))
    define(engine, JOB_TYPE)
    yield engine
    engine.dispose()
    pg_server.drop_database(name)


def leased_job(engine, stored: tuple[Optional[int], Optional[int]]) -> LeaseIdentity:
    job = rl.enqueue(engine, JOB_TYPE, {}, priority=1_000_000)
    claimed = claim_jobs(engine, worker_id="prop", lease_ttl_seconds=120, limit=1, job_types=[JOB_TYPE])
    assert [c.id for c in claimed] == [job.id]
    identity = LeaseIdentity.of(claimed[0])
    if stored != (None, None):
        update_job_progress(engine, **identity.keywords(), progress_done=stored[0], progress_total=stored[1])
    return identity


def event_count(engine, job_id) -> int:
    return scalar(engine, "SELECT count(*) FROM job_events WHERE job_id = :id", id=job_id)


@SETTINGS
@given(stored=valid_stored, done=counts, total=counts)
def test_success_stores_the_coalesced_progress_or_refuses_and_writes_nothing(engine, stored, done, total):
    identity = leased_job(engine, stored)
    effective = (stored[0] if done is None else done, stored[1] if total is None else total)
    valid = alone_valid(done, total) and alone_valid(*effective)
    events_before = event_count(engine, identity.job_id)
    completion = rl.JobCompletion(progress_done=done, progress_total=total)

    if valid:
        result = complete_job_success(engine, **identity.keywords(), completion=completion)
        assert result.status is rl.JobStatus.SUCCEEDED
        assert (result.progress_done, result.progress_total) == effective
        pct = scalar(engine, "SELECT progress_pct FROM job_queue WHERE id = :id", id=identity.job_id)
        assert pct == expected_pct(*effective)
    else:
        with pytest.raises(rl.errors.InvalidCompletionProgress) as caught:
            complete_job_success(engine, **identity.keywords(), completion=completion)
        assert caught.value.code == "job.invalid_completion_progress"
        job = rl.get_job(engine, identity.job_id)
        assert job.status is rl.JobStatus.LEASED
        assert (job.progress_done, job.progress_total) == stored
        assert event_count(engine, identity.job_id) == events_before


@SETTINGS
@given(stored=valid_stored, done=counts, total=counts)
def test_progress_updates_coalesce_and_refuse_by_the_same_rule(engine, stored, done, total):
    identity = leased_job(engine, stored)
    effective = (stored[0] if done is None else done, stored[1] if total is None else total)
    valid = alone_valid(done, total) and alone_valid(*effective)
    events_before = event_count(engine, identity.job_id)

    if valid:
        result = update_job_progress(engine, **identity.keywords(), progress_done=done, progress_total=total)
        assert (result.progress_done, result.progress_total) == effective
        assert result.status is rl.JobStatus.LEASED
    else:
        with pytest.raises(rl.errors.InvalidProgress) as caught:
            update_job_progress(engine, **identity.keywords(), progress_done=done, progress_total=total)
        assert caught.value.code == "job.invalid_progress"
        job = rl.get_job(engine, identity.job_id)
        assert (job.progress_done, job.progress_total) == stored
        assert event_count(engine, identity.job_id) == events_before


@SETTINGS
@given(steps=st.lists(st.tuples(counts, counts), min_size=1, max_size=6))
def test_stored_progress_never_breaks_the_rule_whatever_the_sequence(engine, steps):
    # Whatever a handler sends, in any order, what is stored always satisfies the rule.
    identity = leased_job(engine, (None, None))
    for done, total in steps:
        try:
            update_job_progress(engine, **identity.keywords(), progress_done=done, progress_total=total)
        except rl.errors.InvalidProgress:
            pass
        job = rl.get_job(engine, identity.job_id)
        assert alone_valid(job.progress_done, job.progress_total)
