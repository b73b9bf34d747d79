"""The lease lifecycle (spec sections 3-4: T2-T11) against a real PostgreSQL."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import text

from runledger_sync.core import errors
from runledger_sync.core.records import JobSpec, LeaseIdentity
from runledger_sync.core.store_errors import StoreError
from runledger_sync.core.types import JobCompletion, JobFailure
from runledger_sync.core.states import JobStage, JobStatus
from runledger_sync.db.engine import create_engine
from runledger_sync.store.enqueue.enqueue import enqueue, enqueue_many
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success, release_unstarted_job_claim
from runledger_sync.store.admin.actions import requeue_job
from runledger_sync.store.claim.claim import claim_jobs, claim_prestart_jobs_for_types
from runledger_sync.store.attempt.running import heartbeat_job, mark_job_running, update_job_progress
from runledger_sync.store.maintenance.reaper import reap_expired_leases
from tests.support import (
    JOB_TYPE,
    attempts,
    claim_one,
    define,
    event_types,
    events,
    expire_lease,
    identity,
    rows,
    scalar,
)


@pytest.fixture
def pending(engine):
    define(engine, max_attempts=3)
    # Every event of the spec, so the tests below can read each transition's row.
    return enqueue(engine, JOB_TYPE, {"n": 1}, event_log="full")


def db_now(engine):
    return scalar(engine, "SELECT now()")


# -- T2 claim ---------------------------------------------------------------------


def test_claim_leases_the_job_and_records_attempt_and_event(engine, pending):
    job = claim_one(engine, worker_id="w-1", lease_ttl_seconds=30, event_log="full")
    assert (job.id, job.status, job.attempt, job.worker_id) == (pending.id, JobStatus.LEASED, 1, "w-1")
    assert job.stage is JobStage.QUEUED  # claim keeps the stage
    assert timedelta(seconds=29) < job.lease_expires_at - job.last_heartbeat_at <= timedelta(seconds=30)
    assert job.started_at is not None
    [attempt] = attempts(engine, job.id)
    assert (attempt.attempt, attempt.worker_id, attempt.claim_origin) == (1, "w-1", "WORKER_PRESTART")
    assert attempt.execution_started_persisted_at is None and attempt.finished_at is None
    assert events(engine, job.id)[-1] == ("LEASED", 1, {"worker_id": "w-1", "lease_duration_seconds": 30.0})


def test_direct_claim_records_direct_origin(engine, pending):
    job = claim_one(engine, prestart=False)
    assert attempts(engine, job.id)[0].claim_origin == "DIRECT"


def test_claim_orders_by_priority_then_due_time_then_fifo(engine):
    define(engine)
    low = enqueue_many(engine, [JobSpec(JOB_TYPE, {"n": i}, priority=1) for i in range(3)])
    high = enqueue(engine, JOB_TYPE, {"n": "high"}, priority=50)
    claimed = claim_jobs(engine, worker_id="w", lease_ttl_seconds=30, limit=10)
    assert [job.id for job in claimed] == [high.id] + [job.id for job in low]


def test_claim_skips_jobs_not_yet_due_and_other_types(engine):
    define(engine)
    define(engine, "other.job")
    enqueue(engine, JOB_TYPE, {}, delay_seconds=3600)
    enqueue(engine, "other.job", {})
    due = enqueue(engine, JOB_TYPE, {})
    claimed = claim_prestart_jobs_for_types(engine, worker_id="w", lease_ttl_seconds=30, limit=10,
                                                      job_types=[JOB_TYPE])
    assert [job.id for job in claimed] == [due.id]


def test_claim_with_no_types_returns_nothing_without_touching_the_database():
    unreachable = create_engine("postgresql://nobody@127.0.0.1:9/none")
    assert claim_prestart_jobs_for_types(unreachable, worker_id="w", lease_ttl_seconds=30, limit=5,
                                                   job_types=[]) == []
    unreachable.dispose()


@pytest.mark.parametrize("lease", [0, -1, 0.0, "30", None])
def test_claim_with_a_non_positive_lease_is_refused(engine, pending, lease):
    with pytest.raises(errors.InvalidLeaseDuration) as caught:
        claim_jobs(engine, worker_id="w", lease_ttl_seconds=lease, limit=1)
    assert caught.value.code == "job.invalid_lease_duration"
    assert scalar(engine, "SELECT status FROM job_queue") == "PENDING"


@pytest.mark.parametrize("arguments", [{"limit": 0}, {"limit": 1001}, {"worker_id": " "}, {"job_types": [""]}])
def test_claim_bad_arguments_are_refused(engine, pending, arguments):
    call = {"worker_id": "w", "lease_ttl_seconds": 30, "limit": 1, "job_types": [JOB_TYPE]} | arguments
    with pytest.raises(errors.ValidationError):
        claim_prestart_jobs_for_types(engine, **call)
    assert scalar(engine, "SELECT status FROM job_queue") == "PENDING"


def test_claim_skips_rows_locked_by_another_transaction(engine):
    define(engine)
    locked, free = enqueue_many(engine, [JobSpec(JOB_TYPE, {}), JobSpec(JOB_TYPE, {})])
    with engine.connect() as holder:
        holder.execute(text("SELECT 1 FROM job_queue WHERE id = :id FOR UPDATE"), {"id": locked.id})
        started = time.monotonic()
        claimed = claim_jobs(engine, worker_id="w", lease_ttl_seconds=30, limit=10)
        assert time.monotonic() - started < 2
        holder.rollback()
    assert [job.id for job in claimed] == [free.id]


def test_concurrent_claimers_never_get_the_same_job(engine):
    define(engine)
    enqueue_many(engine, [JobSpec(JOB_TYPE, {"i": i}) for i in range(300)])
    barrier = threading.Barrier(4)
    claimed: dict[str, list] = {}

    def claimer(name: str) -> None:
        barrier.wait()
        mine = claimed.setdefault(name, [])
        while True:
            batch = claim_jobs(engine, worker_id=name, lease_ttl_seconds=30, limit=7)
            if not batch:
                return
            mine.extend(job.id for job in batch)

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [job_id for ids in claimed.values() for job_id in ids]
    assert len(every) == len(set(every)) == 300
    assert scalar(engine, "SELECT count(*) FROM job_attempts") == 300
    assert scalar(engine, "SELECT count(*) FROM job_queue WHERE status = 'LEASED' AND attempt = 1") == 300


# -- T3-T5 running, heartbeat, progress ----------------------------------------


def test_mark_running_persists_stage_and_execution_marker(engine, pending):
    job = claim_one(engine, event_log="full")
    running = mark_job_running(engine, LeaseIdentity.of(job), event_log="full")
    assert running.stage is JobStage.RUNNING and running.status is JobStatus.LEASED
    assert attempts(engine, job.id)[0].execution_started_persisted_at is not None
    assert event_types(engine, job.id)[-1] == "STAGE_CHANGED"


def test_heartbeat_extends_the_lease_and_records_an_event(engine, pending):
    job = claim_one(engine, lease_ttl_seconds=5, event_log="full")
    time.sleep(0.05)
    beat = heartbeat_job(engine, **identity(job), lease_ttl_seconds=60, event_log="full")
    assert beat.lease_expires_at > job.lease_expires_at + timedelta(seconds=50)
    assert beat.last_heartbeat_at > job.last_heartbeat_at
    assert events(engine, job.id)[-1] == ("HEARTBEAT", 1, {"worker_id": "worker-a"})


def test_progress_is_stored_with_percentage_and_event(engine, pending):
    job = claim_one(engine)
    updated = update_job_progress(engine, **identity(job), progress_done=1, progress_total=3,
                                            checkpoint={"page": 7})
    assert (updated.progress_done, updated.progress_total, float(updated.progress_pct)) == (1, 3, 33.33)
    assert updated.checkpoint == {"page": 7}
    kept = update_job_progress(engine, **identity(job), progress_done=2)
    assert (kept.progress_done, kept.progress_total, kept.checkpoint) == (2, 3, {"page": 7})
    assert event_types(engine, job.id)[-2:] == ["PROGRESS", "PROGRESS"]


@pytest.mark.parametrize("done, total", [(-1, None), (None, -2), (5, 4), (True, 3)])
def test_invalid_progress_is_refused_before_writing(engine, pending, done, total):
    job = claim_one(engine)
    with pytest.raises(errors.InvalidProgress) as caught:
        update_job_progress(engine, **identity(job), progress_done=done, progress_total=total)
    assert caught.value.code == "job.invalid_progress"
    assert scalar(engine, "SELECT progress_done FROM job_queue") is None


def test_progress_that_breaks_the_stored_total_is_refused(engine, pending):
    job = claim_one(engine)
    update_job_progress(engine, **identity(job), progress_done=5, progress_total=10)
    with pytest.raises(errors.InvalidProgress):
        update_job_progress(engine, **identity(job), progress_done=20)
    assert rows(engine, "SELECT progress_done, progress_total FROM job_queue") == [(5, 10)]


# -- T6 success -----------------------------------------------------------------


def test_success_stores_progress_checkpoint_output_and_closes_the_attempt(engine, pending):
    job = claim_one(engine)
    mark_job_running(engine, LeaseIdentity.of(job))
    done = complete_job_success(
        engine, **identity(job), completion=JobCompletion(2, 3, {"cursor": "c"}, {"sent": 2})
    )
    assert (done.status, done.stage) == (JobStatus.SUCCEEDED, JobStage.COMPLETED)
    assert (done.progress_done, done.progress_total, done.checkpoint, done.output) == (2, 3, {"cursor": "c"}, {"sent": 2})
    assert done.lease_expires_at is None and done.worker_id is None and done.last_heartbeat_at is None
    assert done.finished_at is not None
    [attempt] = attempts(engine, job.id)
    assert attempt.finished_at is not None and attempt.outcome is None and attempt.retry_delay_ms is None
    assert events(engine, job.id)[-1] == ("SUCCEEDED", 1, {})


def test_success_works_under_a_repeatable_read_session_default(engine, pending):
    job = claim_one(engine)
    with engine.connect() as conn:
        conn.exec_driver_sql("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.commit()
        complete_job_success(conn, **identity(job), completion=JobCompletion(2, 3, None, {"ok": 1}))
        conn.commit()
        conn.exec_driver_sql("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED")
        conn.commit()
    assert rows(engine, "SELECT status, output FROM job_queue") == [("SUCCEEDED", {"ok": 1})]


@pytest.mark.parametrize("completion", [JobCompletion(4, 3), JobCompletion(-1, None), JobCompletion(None, -1)])
def test_success_with_invalid_progress_is_refused_and_row_stays_leased(engine, pending, completion):
    job = claim_one(engine)
    with pytest.raises(errors.InvalidCompletionProgress) as caught:
        complete_job_success(engine, **identity(job), completion=completion)
    assert caught.value.code == "job.invalid_completion_progress"
    assert scalar(engine, "SELECT status FROM job_queue") == "LEASED"
    assert "SUCCEEDED" not in event_types(engine, job.id)


def test_success_whose_progress_merged_with_stored_is_invalid_is_refused(engine, pending):
    job = claim_one(engine)
    update_job_progress(engine, **identity(job), progress_done=5, progress_total=10)
    with pytest.raises(errors.InvalidCompletionProgress):
        complete_job_success(engine, **identity(job), completion=JobCompletion(progress_done=20))
    assert rows(engine, "SELECT status, progress_done FROM job_queue") == [("LEASED", 5)]


def test_success_output_must_be_json(engine, pending):
    job = claim_one(engine)
    with pytest.raises(errors.InvalidPayload):
        complete_job_success(engine, **identity(job), completion=JobCompletion(output={1, 2}))
    assert scalar(engine, "SELECT status FROM job_queue") == "LEASED"


# -- T7 / T8 failure ----------------------------------------------------------------


def test_retryable_failure_schedules_a_retry(engine, pending):
    job = claim_one(engine)
    failed = complete_job_failure(
        engine, **identity(job), failure=JobFailure.retryable("smtp.busy", "421"), retry_delay_ms=60_000
    )
    assert failed.status is JobStatus.PENDING and failed.attempt == 1
    assert (failed.status_reason, failed.last_error_code, failed.last_error_message) == ("RETRYABLE", "smtp.busy", "421")
    assert failed.worker_id is None and failed.lease_expires_at is None and failed.finished_at is None
    assert timedelta(seconds=59) < failed.next_run_at - db_now(engine) <= timedelta(seconds=60)
    [attempt] = attempts(engine, job.id)
    assert (attempt.outcome, attempt.error_code, attempt.error_message, attempt.retry_delay_ms) == (
        "RETRYABLE", "smtp.busy", "421", 60_000)
    assert attempt.finished_at is not None
    failed_event, scheduled = events(engine, job.id)[-2:]
    assert failed_event == ("FAILED", 1, {"kind": "RETRYABLE", "error_code": "smtp.busy", "error_message": "421"})
    assert scheduled[0] == "RETRY_SCHEDULED" and scheduled[2]["retry_delay_ms"] == 60_000
    assert "next_run_at" in scheduled[2]


def test_retry_with_missing_or_negative_delay_is_due_at_once(engine, pending):
    job = claim_one(engine)
    complete_job_failure(engine, **identity(job), failure=JobFailure.timeout("job.timeout_exceeded", "t"),
                                   retry_delay_ms=-5)
    again = claim_one(engine)
    assert (again.id, again.attempt) == (job.id, 2)


@pytest.mark.parametrize("factory, kind", [(JobFailure.terminal, "TERMINAL"), (JobFailure.panicked, "PANICKED")])
def test_non_retryable_failure_dead_letters_with_snapshots(engine, pending, factory, kind):
    job = claim_one(engine)
    update_job_progress(engine, **identity(job), checkpoint={"step": 2})
    dead = complete_job_failure(engine, **identity(job), failure=factory("bad.input", "nope"),
                                          retry_delay_ms=None)
    assert dead.status is JobStatus.DEAD_LETTERED and dead.status_reason == kind
    assert dead.finished_at is not None and dead.worker_id is None
    [letter] = rows(engine, "SELECT * FROM job_dead_letters")
    assert (letter.job_id, letter.job_type, letter.attempt, letter.error_code) == (job.id, JOB_TYPE, 1, "bad.input")
    assert letter.payload_snapshot == {"n": 1} and letter.checkpoint_snapshot == {"step": 2}
    assert event_types(engine, job.id)[-2:] == ["FAILED", "DEAD_LETTERED"]
    assert events(engine, job.id)[-1][2] == {"kind": kind, "error_code": "bad.input"}
    assert attempts(engine, job.id)[0].retry_delay_ms is None


def test_retryable_failure_on_the_last_attempt_dead_letters(engine):
    define(engine, max_attempts=1)
    enqueue(engine, JOB_TYPE, {})
    job = claim_one(engine)
    dead = complete_job_failure(engine, **identity(job), failure=JobFailure.retryable("x.y", "m"),
                                          retry_delay_ms=1000)
    assert (dead.status, dead.status_reason) == (JobStatus.DEAD_LETTERED, "RETRYABLE")


TRANSIENT = JobFailure.retryable("job.handler_transient_error", "OperationalError: server closed the connection")


def test_a_transient_failure_spends_no_attempt_and_the_next_ordinary_one_spends_the_only_one(engine):
    define(engine, max_attempts=1)
    enqueue(engine, JOB_TYPE, {})
    first = claim_one(engine)
    retried = complete_job_failure(engine, **identity(first), failure=TRANSIENT, retry_delay_ms=0)
    assert (retried.status, retried.attempt) == (JobStatus.PENDING, 1)
    second = claim_one(engine)
    dead = complete_job_failure(engine, **identity(second), failure=JobFailure.retryable("x.y", "m"),
                                          retry_delay_ms=1000)
    assert (dead.status, dead.attempt, dead.last_error_code) == (JobStatus.DEAD_LETTERED, 2, "x.y")


def test_handler_failure_coded_like_lease_loss_is_persisted_normally(engine, pending):
    job = claim_one(engine)
    dead = complete_job_failure(
        engine, **identity(job), failure=JobFailure.terminal("job.lease_owner_mismatch", "handler's own code"),
        retry_delay_ms=None,
    )
    assert (dead.status, dead.last_error_code, dead.lease_expires_at) == (
        JobStatus.DEAD_LETTERED, "job.lease_owner_mismatch", None)


def test_a_later_dead_letter_overwrites_the_earlier_one(engine, pending):

    job = claim_one(engine)
    complete_job_failure(engine, **identity(job), failure=JobFailure.terminal("first", "1"), retry_delay_ms=None)
    requeue_job(engine, job.id)
    again = claim_one(engine)
    complete_job_failure(engine, **identity(again), failure=JobFailure.terminal("second", "2"),
                                   retry_delay_ms=None)
    assert rows(engine, "SELECT run_number, error_code FROM job_dead_letters") == [(2, "second")]


# -- fencing (spec 16, 17, identity fields) ----------------------------------------


def test_expired_lease_refuses_the_writes_that_keep_a_job_running_and_row_stays_leased(engine, pending):
    job = claim_one(engine, event_log="full")
    expire_lease(engine, job.id)
    ident = identity(job)
    calls = [
        lambda: heartbeat_job(engine, **ident, lease_ttl_seconds=30, event_log="full"),
        lambda: update_job_progress(engine, **ident, progress_done=1),
    ]
    for call in calls:
        with pytest.raises(errors.LeaseOwnerMismatch) as caught:
            call()
        assert caught.value.code == "job.lease_owner_mismatch"
    assert rows(engine, "SELECT status, worker_id FROM job_queue") == [("LEASED", "worker-a")]
    assert event_types(engine, job.id) == ["ENQUEUED", "LEASED"]


@pytest.mark.parametrize("outcome", ["success", "failure"])
def test_an_outcome_lands_past_the_lease_while_nobody_else_took_the_job(engine, pending, outcome):
    job = claim_one(engine)
    expire_lease(engine, job.id)
    ident = identity(job)
    if outcome == "success":
        written = complete_job_success(engine, **ident)
        assert written.status is JobStatus.SUCCEEDED
    else:
        written = complete_job_failure(engine, **ident, failure=JobFailure.retryable("a.b", "c"),
                                                 retry_delay_ms=10)
        assert written.status is JobStatus.PENDING
    assert scalar(engine, "SELECT count(*) FROM job_attempts WHERE job_id = :id", id=job.id) == 1


def test_an_outcome_past_the_lease_is_refused_once_the_reaper_handed_the_job_on(engine, pending):
    job = claim_one(engine)
    expire_lease(engine, job.id)
    assert reap_expired_leases(engine, limit=10, default_retry_delay_ms=1000).processed == 1
    with pytest.raises(errors.LeaseOwnerMismatch):
        complete_job_success(engine, **identity(job))
    assert scalar(engine, "SELECT status FROM job_queue") != "SUCCEEDED"


@pytest.mark.parametrize("field, value", [("run_number", 2), ("attempt", 2), ("worker_id", "intruder")])
def test_any_identity_field_mismatch_is_refused(engine, pending, field, value):
    job = claim_one(engine)
    ident = identity(job) | {field: value}
    with pytest.raises(errors.LeaseOwnerMismatch):
        complete_job_success(engine, **ident)
    assert scalar(engine, "SELECT status FROM job_queue") == "LEASED"


def test_heartbeat_waiting_briefly_on_a_row_lock_succeeds(engine, pending):
    job = claim_one(engine, lease_ttl_seconds=30)
    outcome: list = []
    with engine.connect() as holder:
        holder.execute(text("SELECT 1 FROM job_queue WHERE id = :id FOR UPDATE"), {"id": job.id})
        thread = threading.Thread(
            target=lambda: outcome.append(heartbeat_job(engine, **identity(job), lease_ttl_seconds=30))
        )
        thread.start()
        time.sleep(0.2)
        holder.commit()
        thread.join(10)
    assert outcome and outcome[0].status is JobStatus.LEASED


def test_heartbeat_stuck_past_its_lock_timeout_fails_with_query_failed(engine, pending):
    job = claim_one(engine, lease_ttl_seconds=30)
    with engine.connect() as holder:
        holder.execute(text("SELECT 1 FROM job_queue WHERE id = :id FOR UPDATE"), {"id": job.id})
        started = time.monotonic()
        with pytest.raises(StoreError) as caught:
            heartbeat_job(engine, **identity(job), lease_ttl_seconds=30, lock_timeout_ms=200)
        elapsed = time.monotonic() - started
        holder.rollback()
    assert caught.value.code == "db.query_failed"
    assert 0.15 < elapsed < 3


# -- T9 unstarted release (spec 5, 6) --------------------------------------------------


def test_release_unstarted_returns_the_claim_without_spending_the_attempt(engine, pending):
    job = claim_one(engine)
    released = release_unstarted_job_claim(engine, **identity(job), reason="RUNNING_PROGRESS_PERSIST_FAILED",
                                                     delay_ms=1000)
    assert (released.status, released.attempt, released.worker_id, released.started_at) == (
        JobStatus.PENDING, 0, None, None)
    assert timedelta(milliseconds=900) < released.next_run_at - db_now(engine) <= timedelta(seconds=1)
    assert attempts(engine, job.id) == []
    assert events(engine, job.id)[-1] == ("REQUEUED", 1, {"reason": "RUNNING_PROGRESS_PERSIST_FAILED"})


def test_release_after_running_was_persisted_is_not_applicable(engine, pending):
    job = claim_one(engine)
    mark_job_running(engine, LeaseIdentity.of(job))
    with pytest.raises(errors.UnstartedClaimReleaseNotApplicable) as caught:
        release_unstarted_job_claim(engine, **identity(job), reason="R", delay_ms=0)
    assert caught.value.code == "job.unstarted_claim_release_not_applicable"
    assert scalar(engine, "SELECT status FROM job_queue") == "LEASED"


def test_release_of_a_direct_claim_is_not_applicable(engine, pending):
    job = claim_one(engine, prestart=False)
    with pytest.raises(errors.UnstartedClaimReleaseNotApplicable):
        release_unstarted_job_claim(engine, **identity(job), reason="R", delay_ms=0)


def test_release_by_a_non_owner_is_a_lease_mismatch(engine, pending):
    job = claim_one(engine)
    with pytest.raises(errors.LeaseOwnerMismatch):
        release_unstarted_job_claim(engine, **identity(job) | {"worker_id": "other"}, reason="R", delay_ms=0)
    assert scalar(engine, "SELECT attempt FROM job_queue") == 1


def test_release_of_a_second_attempt_keeps_started_at(engine, pending):
    first = claim_one(engine)
    complete_job_failure(engine, **identity(first), failure=JobFailure.retryable("a.b", "c"), retry_delay_ms=0)
    second = claim_one(engine)
    released = release_unstarted_job_claim(engine, **identity(second), reason="R", delay_ms=0)
    assert released.attempt == 1 and released.started_at is not None
    assert [a.attempt for a in attempts(engine, first.id)] == [1]


# -- T10 / T11 reaper (spec 7, 8) ---------------------------------------------------------


def reap(engine, delay_ms=30_000):
    return reap_expired_leases(engine, limit=16, default_retry_delay_ms=delay_ms)


def test_reaper_releases_an_expired_claim_that_never_started(engine):
    define(engine, max_attempts=1)
    enqueue(engine, JOB_TYPE, {})
    job = claim_one(engine)
    expire_lease(engine, job.id)
    result = reap(engine)
    assert (result.processed, result.released_unstarted) == (1, 1)
    assert rows(engine, "SELECT status, attempt FROM job_queue") == [("PENDING", 0)]
    assert events(engine, job.id)[-1] == ("REQUEUED", 1, {"reason": "LEASE_EXPIRED_BEFORE_RUNNING_PERSISTED"})
    rerun = claim_one(engine)
    assert rerun.attempt == 1


def test_reaper_keeps_the_attempt_of_a_failed_first_try_when_the_second_never_starts(engine, pending):
    first = claim_one(engine)
    mark_job_running(engine, LeaseIdentity.of(first))
    complete_job_failure(engine, **identity(first), failure=JobFailure.retryable("a.b", "c"), retry_delay_ms=0)
    second = claim_one(engine)
    expire_lease(engine, second.id)
    reap(engine)
    assert rows(engine, "SELECT status, attempt FROM job_queue") == [("PENDING", 1)]
    assert claim_one(engine).attempt == 2


def test_reaper_retries_an_expired_started_attempt_with_its_delay(engine, pending):
    job = claim_one(engine)
    mark_job_running(engine, LeaseIdentity.of(job))
    expire_lease(engine, job.id)
    result = reap(engine, delay_ms=45_000)
    assert (result.processed, result.retried) == (1, 1)
    row = rows(engine, "SELECT status, attempt, last_error_code, status_reason, next_run_at - now() AS wait FROM job_queue")[0]
    assert (row.status, row.attempt, row.last_error_code, row.status_reason) == ("PENDING", 1, "job.lease_expired",
                                                                                   "LEASE_EXPIRED")
    assert timedelta(seconds=44) < row.wait <= timedelta(seconds=45)
    [attempt] = attempts(engine, job.id)
    assert (attempt.outcome, attempt.error_code, attempt.error_message) == (
        "LEASE_EXPIRED", "job.lease_expired", "Job lease expired before completion.")
    failed, scheduled = events(engine, job.id)[-2:]
    assert failed[2]["started_without_renewal_heartbeat"] is True
    assert scheduled[0] == "RETRY_SCHEDULED" and scheduled[2]["kind"] == "LEASE_EXPIRED"


def test_reaper_dead_letters_an_expired_last_attempt(engine):
    define(engine, max_attempts=1)
    enqueue(engine, JOB_TYPE, {"p": 1}, organization_id="org-9")
    job = claim_one(engine, prestart=False)
    expire_lease(engine, job.id)
    result = reap(engine)
    assert len(result.dead_lettered) == 1
    dead = result.dead_lettered[0]
    assert (dead.job_id, dead.job_type, dead.organization_id, dead.attempt, dead.payload) == (
        job.id, JOB_TYPE, "org-9", 1, {"p": 1})
    assert rows(engine, "SELECT status, status_reason FROM job_queue") == [("DEAD_LETTERED", "LEASE_EXPIRED")]
    assert rows(engine, "SELECT error_code FROM job_dead_letters") == [("job.lease_expired",)]


def test_reaper_does_not_count_an_earlier_transient_failure_against_max_attempts(engine):
    define(engine, max_attempts=2)
    enqueue(engine, JOB_TYPE, {})
    first = claim_one(engine, prestart=False)
    complete_job_failure(engine, **identity(first), failure=TRANSIENT, retry_delay_ms=0)
    second = claim_one(engine, prestart=False)
    expire_lease(engine, second.id)
    result = reap(engine)
    # The lost lease spends the first of the two attempts: the job is retried, not dead-lettered.
    assert (result.retried, result.dead_lettered) == (1, ())
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET next_run_at = now()"))
    third = claim_one(engine, prestart=False)
    expire_lease(engine, third.id)
    assert len(reap(engine).dead_lettered) == 1
    assert rows(engine, "SELECT status, attempt FROM job_queue") == [("DEAD_LETTERED", 3)]


def test_reaper_leaves_live_leases_alone(engine, pending):
    claim_one(engine, lease_ttl_seconds=60)
    assert reap(engine).processed == 0
    assert scalar(engine, "SELECT status FROM job_queue") == "LEASED"


def test_reaper_pushes_back_a_poison_row_and_processes_the_rest(engine):
    define(engine)
    poison, healthy = enqueue_many(engine, [JobSpec(JOB_TYPE, {}), JobSpec(JOB_TYPE, {})])
    for job in claim_jobs(engine, worker_id="w", lease_ttl_seconds=30, limit=2):
        expire_lease(engine, job.id)
    with engine.begin() as conn:
        conn.execute(text(
            "CREATE FUNCTION reject_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF NEW.job_id = '{poison.id}' THEN RAISE EXCEPTION 'poison'; END IF; RETURN NEW; END $$"
        ))
        conn.execute(text("CREATE TRIGGER poison BEFORE INSERT ON job_events FOR EACH ROW EXECUTE FUNCTION reject_poison()"))
    result = reap(engine, delay_ms=60_000)
    assert (result.processed, result.failed_rows, result.retried) == (2, 1, 1)
    states = dict(rows(engine, "SELECT id, status FROM job_queue"))
    assert states == {poison.id: "LEASED", healthy.id: "PENDING"}
    assert scalar(engine, "SELECT lease_expires_at > now() + interval '50 seconds' FROM job_queue WHERE id = :id",
                  id=poison.id)


@pytest.mark.parametrize("delay", [0, -1, True, 1.5])
def test_reaper_with_a_non_positive_delay_is_refused(engine, delay):
    with pytest.raises(errors.InvalidRetryDelay) as caught:
        reap_expired_leases(engine, limit=1, default_retry_delay_ms=delay)
    assert caught.value.code == "job.invalid_retry_delay"


def test_claim_statement_uses_the_partial_claim_index(engine):
    define(engine)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO job_queue (id, job_type, max_attempts, status) "
            "SELECT gen_random_uuid(), :t, 3, CASE WHEN g % 10 = 0 THEN 'PENDING' ELSE 'SUCCEEDED' END "
            "FROM generate_series(1, 20000) g"), {"t": JOB_TYPE})
        conn.execute(text("ANALYZE job_queue"))
    plan = "\n".join(
        row[0] for row in rows(
            engine,
            "EXPLAIN SELECT id FROM job_queue WHERE queue = 'default' AND status = 'PENDING' AND NOT blocked_by_key "
            "AND next_run_at <= now() "
            "AND job_type = ANY(ARRAY[:t]) ORDER BY priority DESC, next_run_at, created_at, id LIMIT 16 "
            "FOR UPDATE SKIP LOCKED", t=JOB_TYPE,
        )
    )
    assert "idx_job_queue_claim" in plan, plan
