"""store.admin.overview (the dashboard's recent figures), list_jobs(search=) and job_statuses against a real PostgreSQL."""

from __future__ import annotations

from sqlalchemy import text

import pytest

import runledger_sync as rl
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.store.admin.jobs import job_statuses, list_jobs
from runledger_sync.store.claim.claim import claim_jobs
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success
from runledger_sync.store.admin.overview import recent_overview
from tests.support import JOB_TYPE, define, expire_lease


@pytest.fixture
def db(engine):
    define(engine, max_attempts=1)
    return engine


def finish(db, *, fail: bool = False, code: str = "x.failed", organization_id: str | None = None) -> rl.JobRecord:
    job = rl.enqueue(db, JOB_TYPE, {}, organization_id=organization_id, priority=10**6)
    [claimed] = claim_jobs(db, worker_id="w", lease_ttl_seconds=60, limit=1, job_types=[JOB_TYPE])
    assert claimed.id == job.id
    identity = LeaseIdentity.of(claimed).keywords()
    if fail:
        return complete_job_failure(db, **identity, failure=rl.JobFailure.terminal(code, "m"), retry_delay_ms=None)
    return complete_job_success(db, **identity, completion=rl.JobCompletion.success())


def age_events(db, job: rl.JobRecord, minutes: int) -> None:
    with db.begin() as conn:
        conn.execute(text("UPDATE job_events SET occurred_at = now() - make_interval(mins => :m) WHERE job_id = :id"),
                     {"m": minutes, "id": job.id})


def test_throughput_counts_finished_attempts_per_minute_within_the_window(db):
    recent, old = finish(db), finish(db)
    finish(db, fail=True)
    age_events(db, recent, 3)
    age_events(db, old, 90)
    overview = recent_overview(db)
    assert (overview.succeeded, overview.failed) == (1, 1)
    assert len(overview.finished_per_minute) == 2  # this minute's failure, and the success 3 minutes ago
    assert overview.finished_per_minute == sorted(overview.finished_per_minute)
    assert recent_overview(db, window_minutes=120).succeeded == 2


def test_failures_are_grouped_by_code_most_frequent_first(db):
    for code in ("a.timeout", "b.refused", "b.refused"):
        finish(db, fail=True, code=code)
    assert recent_overview(db).failures_by_code == [("b.refused", 2), ("a.timeout", 1)]


def test_workers_are_seen_from_their_leases_with_heartbeats_and_expired_ones(db):
    rl.enqueue_many(db, [rl.JobSpec(JOB_TYPE, {}) for _ in range(3)])
    claim_jobs(db, worker_id="busy", lease_ttl_seconds=60, limit=2, job_types=[JOB_TYPE])
    [stalled] = claim_jobs(db, worker_id="stalled", lease_ttl_seconds=60, limit=1, job_types=[JOB_TYPE])
    expire_lease(db, stalled.id)
    workers = {w.worker_id: (w.leased_jobs, w.expired_leases) for w in recent_overview(db).workers}
    assert workers == {"busy": (2, 0), "stalled": (1, 1)}
    assert [w.worker_id for w in recent_overview(db).workers] == ["busy", "stalled"]


def test_an_organization_sees_only_its_jobs_events_and_workers(db):
    finish(db, organization_id="org-a")
    finish(db, fail=True, organization_id="org-b")
    mine = recent_overview(db, organization_id="org-a")
    assert (mine.succeeded, mine.failed, mine.failures_by_code) == (1, 0, [])
    assert recent_overview(db, organization_id="org-b").failures_by_code == [("x.failed", 1)]


@pytest.mark.parametrize("window", [0, 24 * 60 + 1, "60"])
def test_a_window_out_of_range_is_refused(db, window):
    with pytest.raises(rl.InvalidArgument) as refused:
        recent_overview(db, window_minutes=window)
    assert refused.value.argument == "window_minutes"


def test_search_finds_a_whole_id_or_a_key_prefix_with_wildcards_taken_literally(db):
    percent = rl.enqueue(db, JOB_TYPE, {}, idempotency_key="100%-off")
    underscore = rl.enqueue(db, JOB_TYPE, {}, idempotency_key="a_b")
    plain = rl.enqueue(db, JOB_TYPE, {}, idempotency_key="axb")
    assert [j.id for j in list_jobs(db, search=str(plain.id))] == [plain.id]
    assert [j.id for j in list_jobs(db, search="100%")] == [percent.id]
    assert [j.id for j in list_jobs(db, search="a_")] == [underscore.id]
    assert [j.id for j in list_jobs(db, search="a")] == [plain.id, underscore.id]


@pytest.mark.parametrize("search", ["", "   ", 42, "x" * 600])
def test_a_malformed_search_is_refused(db, search):
    with pytest.raises(rl.InvalidArgument) as refused:
        list_jobs(db, search=search)
    assert refused.value.argument == "search"


def test_job_statuses_reads_the_jobs_in_scope(db):
    done = finish(db, organization_id="org-a")
    other = finish(db, fail=True, organization_id="org-b")
    missing = "00000000-0000-7000-8000-000000000000"
    assert job_statuses(db, [done.id, str(other.id), missing]) == {
        done.id: rl.JobStatus.SUCCEEDED, other.id: rl.JobStatus.DEAD_LETTERED}
    assert job_statuses(db, [done.id, other.id], organization_id="org-a") == {done.id: rl.JobStatus.SUCCEEDED}
    assert job_statuses(db, []) == {}
