"""Operator reads and actions (store.admin) against a real PostgreSQL.

Jobs are put into each state with the real store calls (enqueue, claim, mark
running, complete), and every assertion reads rows and events back.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Optional
from uuid import UUID

import pytest
import sqlalchemy

from runledger_sync.core.errors import (
    InvalidArgument,
    InvalidStateTransition,
    JobNotFound,
    LeaseOwnerMismatch,
)
from runledger_sync.core.records import JobDefinition, JobRecord, LeaseIdentity
from runledger_sync.core.types import JobCompletion, JobFailure
from runledger_sync.core.states import JobStage, JobStatus
from runledger_sync.store.admin.jobs import count_jobs, get_dead_letter, get_job, list_attempts, list_events, list_jobs
from runledger_sync.store.admin.dead_letters import list_dead_letters
from runledger_sync.store.admin.actions import cancel_job, requeue_job
from runledger_sync.store.claim.claim import claim_jobs, claim_prestart_jobs_for_types
from runledger_sync.store.enqueue.enqueue import enqueue
from runledger_sync.store.definitions import sync_job_definitions
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success
from runledger_sync.store.attempt.running import heartbeat_job, mark_job_running, update_job_progress
from runledger_sync.store.admin.stats import pending_timing_statement, queue_stats

EMAIL = "admin.email"
REPORT = "admin.report"
WORKER = "worker-admin-1"
# Jobs driven past PENDING are enqueued at the top priority so the claim that
# follows picks exactly them; the helpers assert it did.
TOP = 1_000_000
UNKNOWN_ID = UUID("00000000-0000-7000-8000-000000000000")


@pytest.fixture
def db(engine):
    sync_job_definitions(engine, [JobDefinition(EMAIL, max_attempts=3), JobDefinition(REPORT, max_attempts=1)])
    return engine


# -- building jobs in a given state -------------------------------------------------


def pending(db, job_type: str = EMAIL, **options: Any) -> JobRecord:
    return enqueue(db, job_type, options.pop("payload", {"n": 1}), **options)


def leased(
    db,
    job_type: str = EMAIL,
    *,
    prestart: bool = True,
    running: bool = True,
    worker: str = WORKER,
    lease: float = 60,
    **options: Any,
) -> JobRecord:
    """A LEASED job: a prestart claim marked running (the worker's way) unless told otherwise."""
    job = enqueue(db, job_type, options.pop("payload", {"n": 1}), priority=TOP, **options)
    claim = claim_prestart_jobs_for_types if prestart else claim_jobs
    claimed = claim(db, worker_id=worker, lease_ttl_seconds=lease, limit=1, job_types=[job_type])
    assert [c.id for c in claimed] == [job.id]
    if running:
        return mark_job_running(db, LeaseIdentity.of(claimed[0]))
    return claimed[0]


def succeeded(db, job_type: str = EMAIL, **options: Any) -> JobRecord:
    job = leased(db, job_type, **options)
    completion = JobCompletion(progress_done=2, progress_total=3, checkpoint={"page": 2}, output={"sent": True})
    return complete_job_success(db, **LeaseIdentity.of(job).keywords(), completion=completion)


def dead_lettered(db, job_type: str = EMAIL, **options: Any) -> JobRecord:
    job = leased(db, job_type, **options)
    identity = LeaseIdentity.of(job)
    update_job_progress(db, **identity.keywords(), progress_done=1, progress_total=4, checkpoint={"at": 1})
    failure = JobFailure.terminal("smtp.rejected", "mailbox does not exist")
    return complete_job_failure(db, **identity.keywords(), failure=failure, retry_delay_ms=None)


def canceled(db, job_type: str = EMAIL, **options: Any) -> JobRecord:
    return cancel_job(db, pending(db, job_type, **options).id)


def db_now(db) -> Any:
    with db.connect() as connection:
        return connection.execute(sqlalchemy.text("SELECT now()")).scalar_one()


def events_of(db, job_id: UUID) -> list[tuple[str, int, Optional[int], Any]]:
    return [(e.event_type, e.run_number, e.attempt, e.payload) for e in list_events(db, job_id)]


def snapshot(db) -> tuple[Any, ...]:
    """Everything a write could change, to show that a refused call wrote nothing."""
    with db.connect() as connection:
        jobs = connection.execute(
            sqlalchemy.text("SELECT id, status, run_number, attempt, updated_at FROM job_queue ORDER BY id")
        ).all()
        events = connection.execute(sqlalchemy.text("SELECT count(*), max(id) FROM job_events")).one()
        attempts = connection.execute(sqlalchemy.text("SELECT id, finished_at FROM job_attempts ORDER BY id")).all()
    return tuple(jobs), tuple(events), tuple(attempts)


# -- get_job -------------------------------------------------------------------------


def test_get_job_returns_the_stored_row(db):
    job = pending(db, payload={"to": "a@b.c"}, organization_id="org-1")

    found = get_job(db, job.id)

    assert found == job
    assert found.payload == {"to": "a@b.c"}
    assert get_job(db, str(job.id)) == job


def test_a_finished_job_shows_the_completed_stage_and_keeps_the_stage_it_stopped_at(db):
    jobs = {"pending": pending(db), "leased": leased(db), "succeeded": succeeded(db),
            "dead_lettered": dead_lettered(db), "canceled": canceled(db)}

    read = {name: get_job(db, job.id) for name, job in jobs.items()}

    assert {name: (job.stage, job.stage_shown) for name, job in read.items()} == {
        "pending": (JobStage.QUEUED, JobStage.QUEUED),
        "leased": (JobStage.RUNNING, JobStage.RUNNING),
        "succeeded": (JobStage.COMPLETED, JobStage.COMPLETED),
        "dead_lettered": (JobStage.RUNNING, JobStage.COMPLETED),
        "canceled": (JobStage.QUEUED, JobStage.COMPLETED),
    }


def test_get_job_is_none_for_an_unknown_id_or_another_organization(db):
    job = pending(db, organization_id="org-1")

    assert get_job(db, UNKNOWN_ID) is None
    assert get_job(db, job.id, organization_id="org-2") is None
    assert get_job(db, job.id, organization_id="org-1") == job


@pytest.mark.parametrize("bad_id", ["not-a-uuid", 42, None, b"\x00" * 16])
def test_get_job_rejects_a_malformed_id(db, bad_id):
    with pytest.raises(InvalidArgument) as caught:
        get_job(db, bad_id)
    assert caught.value.code == "job.invalid_argument"


# -- list_jobs / count_jobs ------------------------------------------------------------


@pytest.fixture
def mixed(db) -> dict[str, JobRecord]:
    """Seven jobs over two types, two organizations and every status, oldest first."""
    jobs = {
        "succeeded": succeeded(db, EMAIL, organization_id="org-1"),
        "dead": dead_lettered(db, REPORT),
        "leased": leased(db, EMAIL, organization_id="org-2"),
        "canceled": canceled(db, REPORT, organization_id="org-1"),
        "pending_email_org1": pending(db, EMAIL, organization_id="org-1"),
        "pending_report": pending(db, REPORT),
        "pending_email": pending(db, EMAIL),
    }
    return jobs


def ids(records: list[JobRecord]) -> list[UUID]:
    return [r.id for r in records]


def test_list_jobs_returns_newest_first(db, mixed):
    listed = list_jobs(db)

    assert ids(listed) == [job.id for job in reversed(list(mixed.values()))]
    assert [r.created_at for r in listed] == sorted((r.created_at for r in listed), reverse=True)


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({"status": JobStatus.PENDING}, ["pending_email", "pending_report", "pending_email_org1"]),
        ({"status": "SUCCEEDED"}, ["succeeded"]),
        ({"status": JobStatus.DEAD_LETTERED}, ["dead"]),
        ({"status": "LEASED"}, ["leased"]),
        ({"status": "CANCELED"}, ["canceled"]),
        ({"job_type": REPORT}, ["pending_report", "canceled", "dead"]),
        ({"organization_id": "org-1"}, ["pending_email_org1", "canceled", "succeeded"]),
        ({"organization_id": "org-2"}, ["leased"]),
        ({"organization_id": "org-nobody"}, []),
        ({"status": "PENDING", "job_type": EMAIL}, ["pending_email", "pending_email_org1"]),
        ({"status": "PENDING", "job_type": EMAIL, "organization_id": "org-1"}, ["pending_email_org1"]),
    ],
)
def test_list_and_count_jobs_apply_every_filter(db, mixed, filters, expected):
    assert ids(list_jobs(db, **filters)) == [mixed[name].id for name in expected]
    assert count_jobs(db, **filters) == len(expected)


def test_count_jobs_without_filters_counts_everything(db, mixed):
    assert count_jobs(db) == len(mixed)


def test_list_jobs_pages_with_limit_and_offset(db, mixed):
    newest_first = [job.id for job in reversed(list(mixed.values()))]

    pages = [ids(list_jobs(db, limit=3, offset=offset)) for offset in (0, 3, 6, 9)]

    assert pages == [newest_first[0:3], newest_first[3:6], newest_first[6:7], []]
    assert ids(list_jobs(db, status="PENDING", limit=1, offset=1)) == [mixed["pending_report"].id]



def test_list_jobs_pages_by_keyset_from_the_last_job_shown(db, mixed):
    newest_first = [job.id for job in reversed(list(mixed.values()))]
    pages, before = [], None
    while True:
        page = list_jobs(db, limit=3, before=before)
        if not page:
            break
        pages.append(ids(page))
        before = page[-1]
    assert pages == [newest_first[0:3], newest_first[3:6], newest_first[6:7]]
    [first_pending, *_] = list_jobs(db, status="PENDING", limit=1)
    assert ids(list_jobs(db, status="PENDING", limit=1, before=first_pending)) == [mixed["pending_report"].id]


@pytest.mark.parametrize(
    ("filters", "argument"),
    [
        ({"before": "01a2"}, "before"),
        ({"status": "RUNNING"}, "status"),
        ({"status": "pending"}, "status"),
        ({"limit": 0}, "limit"),
        ({"limit": -5}, "limit"),
        ({"limit": True}, "limit"),
        ({"limit": "10"}, "limit"),
        ({"offset": -1}, "offset"),
        ({"offset": 1.5}, "offset"),
        ({"job_type": ""}, "job_type"),
        ({"job_type": 7}, "job_type"),
        ({"organization_id": "   "}, "organization_id"),
    ],
)
def test_list_jobs_rejects_bad_filters_without_writing(db, mixed, filters, argument):
    before = snapshot(db)

    with pytest.raises(InvalidArgument) as caught:
        list_jobs(db, **filters)

    assert caught.value.argument == argument
    assert caught.value.code in ("job.invalid_argument", "job.invalid_job_type")
    if argument != "job_type":
        assert caught.value.code == "job.invalid_argument"
    assert snapshot(db) == before


@pytest.mark.parametrize(
    "filters", [{"status": "NOPE"}, {"job_type": " "}, {"organization_id": ""}, {"organization_id": 5}]
)
def test_count_jobs_rejects_bad_filters(db, filters):
    with pytest.raises(InvalidArgument):
        count_jobs(db, **filters)


# -- cancel_job (T12) ----------------------------------------------------------------


def test_cancel_pending_job(db):
    job = pending(db)

    result = cancel_job(db, job.id)

    stored = get_job(db, job.id)
    assert result == stored
    assert stored.status is JobStatus.CANCELED
    assert stored.status_reason == "CANCELED"
    assert stored.finished_at is not None and stored.finished_at >= job.created_at
    assert stored.worker_id is None and stored.last_heartbeat_at is None
    assert (stored.run_number, stored.attempt, stored.stage) == (1, 0, JobStage.QUEUED)
    assert events_of(db, job.id)[-1] == ("CANCELED", 1, None, {"reason": "CANCELED"})
    assert list_attempts(db, job.id) == []


def test_cancel_leased_job_closes_the_attempt_and_fences_the_worker(db):
    job = leased(db)
    identity = LeaseIdentity.of(job)
    assert list_attempts(db, job.id)[0].finished_at is None

    result = cancel_job(db, job.id, reason="operator: wrong recipient")

    stored = get_job(db, job.id)
    assert result == stored
    assert stored.status is JobStatus.CANCELED
    assert stored.status_reason == "operator: wrong recipient"
    assert stored.finished_at is not None
    assert stored.worker_id is None and stored.last_heartbeat_at is None
    assert stored.stage is JobStage.RUNNING  # cancel keeps the stage
    (attempt,) = list_attempts(db, job.id)
    assert attempt.finished_at is not None
    assert (attempt.outcome, attempt.error_code, attempt.retry_delay_ms) == (None, None, None)
    events = list_events(db, job.id)
    assert (events[-1].event_type, events[-1].run_number, events[-1].attempt, events[-1].payload) == (
        "CANCELED", 1, 1, {"reason": "operator: wrong recipient"}
    )
    assert events[-1].stage == "running"

    before = snapshot(db)
    with pytest.raises(LeaseOwnerMismatch) as caught:
        heartbeat_job(db, **identity.keywords(), lease_ttl_seconds=60)
    assert caught.value.code == "job.lease_owner_mismatch"
    with pytest.raises(LeaseOwnerMismatch):
        update_job_progress(db, **identity.keywords(), progress_done=1, progress_total=2)
    with pytest.raises(LeaseOwnerMismatch):
        complete_job_success(db, **identity.keywords(), completion=JobCompletion(output={"late": True}))
    with pytest.raises(LeaseOwnerMismatch):
        complete_job_failure(
            db, **identity.keywords(), failure=JobFailure.retryable("x.y", "late"), retry_delay_ms=0
        )
    assert snapshot(db) == before
    assert get_job(db, job.id).status is JobStatus.CANCELED


def test_cancel_unstarted_prestart_claim(db):
    job = leased(db, running=False)
    assert list_attempts(db, job.id)[0].claim_origin == "WORKER_PRESTART"

    cancel_job(db, job.id)

    assert get_job(db, job.id).status is JobStatus.CANCELED
    assert list_attempts(db, job.id)[0].finished_at is not None
    assert events_of(db, job.id)[-1] == ("CANCELED", 1, 1, {"reason": "CANCELED"})


@pytest.mark.parametrize("make", [succeeded, dead_lettered, canceled], ids=["SUCCEEDED", "DEAD_LETTERED", "CANCELED"])
def test_cancel_finished_job_is_an_invalid_state_transition(db, make):
    job = make(db)
    before = snapshot(db)

    with pytest.raises(InvalidStateTransition) as caught:
        cancel_job(db, job.id)

    assert caught.value.code == "job.invalid_state_transition"
    assert caught.value.details["status"] == job.status.value
    assert snapshot(db) == before
    assert get_job(db, job.id) == job


@pytest.mark.parametrize("action", [cancel_job, requeue_job], ids=["cancel", "requeue"])
def test_unknown_job_is_not_found(db, action):
    pending(db)
    before = snapshot(db)

    with pytest.raises(JobNotFound) as caught:
        action(db, UNKNOWN_ID)

    assert caught.value.code == "job.not_found"
    assert snapshot(db) == before


@pytest.mark.parametrize(
    ("action", "make"),
    [(cancel_job, pending), (cancel_job, leased), (requeue_job, succeeded), (requeue_job, canceled)],
    ids=["cancel-pending", "cancel-leased", "requeue-succeeded", "requeue-canceled"],
)
def test_another_organizations_job_is_not_found_when_scoped(db, action, make):
    job = make(db, organization_id="org-1")
    before = snapshot(db)

    with pytest.raises(JobNotFound) as caught:
        action(db, job.id, organization_id="org-2")

    assert caught.value.code == "job.not_found"
    assert snapshot(db) == before

    done = action(db, job.id, organization_id="org-1")
    assert done.status in (JobStatus.CANCELED, JobStatus.PENDING)
    assert done.status != job.status


@pytest.mark.parametrize("action", [cancel_job, requeue_job], ids=["cancel", "requeue"])
@pytest.mark.parametrize(
    ("job_id", "options"),
    [("nope", {}), (None, {}), ("job", {"reason": ""}), ("job", {"reason": "  "}), ("job", {"reason": 3}),
     ("job", {"reason": "x" * 256}), ("job", {"organization_id": ""})],
)
def test_cancel_and_requeue_reject_bad_arguments_without_writing(db, action, job_id, options):
    job = canceled(db) if action is requeue_job else pending(db)
    before = snapshot(db)

    with pytest.raises(InvalidArgument) as caught:
        action(db, job.id if job_id == "job" else job_id, **options)

    assert caught.value.code == "job.invalid_argument"
    assert snapshot(db) == before


# -- requeue_job (T13) ----------------------------------------------------------------


def assert_fresh_run(record: JobRecord, previous: JobRecord, reason: str) -> None:
    assert record.status is JobStatus.PENDING
    assert record.stage is JobStage.QUEUED
    assert record.run_number == previous.run_number + 1
    assert record.attempt == 0
    assert (record.progress_done, record.progress_total, record.progress_pct) == (None, None, None)
    assert (record.checkpoint, record.output) == (None, None)
    assert (record.lease_expires_at, record.last_heartbeat_at, record.worker_id) == (None, None, None)
    assert (record.started_at, record.finished_at) == (None, None)
    assert record.status_reason == reason
    assert (record.last_error_code, record.last_error_message) == (None, None)
    assert record.payload == previous.payload
    assert record.max_attempts == previous.max_attempts


def test_requeue_succeeded_job_starts_a_new_run(db):
    job = succeeded(db)
    assert (job.progress_done, job.checkpoint, job.output) == (2, {"page": 2}, {"sent": True})

    result = requeue_job(db, job.id)

    stored = get_job(db, job.id)
    assert result == stored
    assert_fresh_run(stored, job, "REQUEUED")
    assert stored.next_run_at <= db_now(db)
    assert events_of(db, job.id)[-1] == ("REQUEUED", 1, 1, {"reason": "REQUEUED"})


def test_requeue_dead_lettered_job_with_a_reason(db):
    job = dead_lettered(db)
    assert job.last_error_code == "smtp.rejected"

    requeue_job(db, job.id, reason="fixed the mailbox")

    stored = get_job(db, job.id)
    assert_fresh_run(stored, job, "fixed the mailbox")
    assert events_of(db, job.id)[-1] == ("REQUEUED", 1, 1, {"reason": "fixed the mailbox"})


def test_requeue_canceled_job_that_never_ran_records_no_attempt(db):
    job = canceled(db)

    requeue_job(db, job.id)

    assert_fresh_run(get_job(db, job.id), job, "REQUEUED")
    assert events_of(db, job.id)[-1] == ("REQUEUED", 1, None, {"reason": "REQUEUED"})


def test_requeue_canceled_leased_job_records_the_previous_attempt(db):
    job = leased(db)
    cancel_job(db, job.id)

    requeue_job(db, job.id)

    assert events_of(db, job.id)[-1] == ("REQUEUED", 1, 1, {"reason": "REQUEUED"})


def test_requeued_job_runs_again_as_the_next_run(db):
    first = succeeded(db)
    requeue_job(db, first.id)

    (claimed,) = claim_jobs(db, worker_id="worker-2", lease_ttl_seconds=60, limit=1, job_types=[EMAIL])
    assert (claimed.id, claimed.run_number, claimed.attempt) == (first.id, 2, 1)
    complete_job_success(db, **LeaseIdentity.of(claimed).keywords())
    second = requeue_job(db, first.id)

    assert (second.run_number, second.attempt) == (3, 0)
    attempts = list_attempts(db, first.id)
    assert [(a.run_number, a.attempt, a.worker_id) for a in attempts] == [(1, 1, WORKER), (2, 1, "worker-2")]
    requeued = [(run, attempt) for kind, run, attempt, _ in events_of(db, first.id) if kind == "REQUEUED"]
    assert requeued == [(1, 1), (2, 1)]


@pytest.mark.parametrize("make", [pending, leased], ids=["PENDING", "LEASED"])
def test_requeue_of_an_unfinished_job_is_an_invalid_state_transition(db, make):
    job = make(db)
    before = snapshot(db)

    with pytest.raises(InvalidStateTransition) as caught:
        requeue_job(db, job.id)

    assert caught.value.code == "job.invalid_state_transition"
    assert caught.value.details["status"] == job.status.value
    assert snapshot(db) == before


# -- history: attempts, events, dead letters ---------------------------------------------


def test_list_attempts_returns_each_claim_in_order(db):
    job = leased(db)
    complete_job_failure(
        db, **LeaseIdentity.of(job).keywords(), failure=JobFailure.retryable("smtp.busy", "421"), retry_delay_ms=0
    )
    (again,) = claim_jobs(db, worker_id="worker-2", lease_ttl_seconds=60, limit=1, job_types=[EMAIL])
    complete_job_success(db, **LeaseIdentity.of(again).keywords())
    other = pending(db)

    attempts = list_attempts(db, job.id)

    assert [(a.run_number, a.attempt, a.worker_id, a.claim_origin) for a in attempts] == [
        (1, 1, WORKER, "WORKER_PRESTART"),
        (1, 2, "worker-2", "DIRECT"),
    ]
    assert (attempts[0].outcome, attempts[0].error_code, attempts[0].error_message, attempts[0].retry_delay_ms) == (
        "RETRYABLE", "smtp.busy", "421", 0
    )
    assert attempts[0].execution_started_persisted_at is not None
    assert (attempts[1].outcome, attempts[1].error_code) == (None, None)
    assert all(a.finished_at is not None for a in attempts)
    assert list_attempts(db, other.id) == []


def test_list_events_returns_the_log_in_write_order(db):
    job = pending(db, event_log="full")
    (claimed,) = claim_jobs(db, worker_id=WORKER, lease_ttl_seconds=30, limit=1, job_types=[EMAIL], event_log="full")
    complete_job_success(db, **LeaseIdentity.of(claimed).keywords())
    pending(db)

    events = list_events(db, job.id)

    assert [(e.event_type, e.attempt) for e in events] == [("ENQUEUED", None), ("LEASED", 1), ("SUCCEEDED", 1)]
    assert [e.id for e in events] == sorted(e.id for e in events)
    assert {e.job_id for e in events} == {job.id}
    assert events[0].payload == {"job_type": EMAIL}
    assert events[1].payload == {"worker_id": WORKER, "lease_duration_seconds": 30}


def test_get_dead_letter_returns_the_snapshot(db):
    job = dead_lettered(db, payload={"to": "x@y.z"}, organization_id="org-9")
    alive = succeeded(db)

    letter = get_dead_letter(db, job.id)

    assert letter is not None
    assert (letter.job_id, letter.job_type, letter.organization_id, letter.run_number, letter.attempt) == (
        job.id, EMAIL, "org-9", 1, 1
    )
    assert (letter.error_code, letter.error_message) == ("smtp.rejected", "mailbox does not exist")
    assert letter.payload_snapshot == {"to": "x@y.z"}
    assert letter.checkpoint_snapshot == {"at": 1}
    assert letter.failed_at == job.finished_at
    assert get_dead_letter(db, alive.id) is None
    assert get_dead_letter(db, UNKNOWN_ID) is None


def test_list_dead_letters_filters_by_type_organization_and_since(db):
    old_email = dead_lettered(db, EMAIL, organization_id="org-1")
    old_report = dead_lettered(db, REPORT)
    between = db_now(db)
    new_email = dead_lettered(db, EMAIL)
    succeeded(db)

    def listed(**filters: Any) -> list[UUID]:
        return [d.job_id for d in list_dead_letters(db, **filters)]

    assert listed() == [new_email.id, old_report.id, old_email.id]
    assert listed(job_type=EMAIL) == [new_email.id, old_email.id]
    assert listed(job_type=REPORT) == [old_report.id]
    assert listed(organization_id="org-1") == [old_email.id]
    assert listed(since=between) == [new_email.id]
    assert listed(since=between - timedelta(days=1), job_type=REPORT) == [old_report.id]
    assert listed(since=between + timedelta(days=1)) == []
    assert listed(limit=2) == [new_email.id, old_report.id]


@pytest.mark.parametrize(
    "filters",
    [{"limit": 0}, {"job_type": ""}, {"since": "yesterday"}, {"since": sqlalchemy.func.now()}, {"organization_id": " "}],
)
def test_list_dead_letters_rejects_bad_filters(db, filters):
    with pytest.raises(InvalidArgument):
        list_dead_letters(db, **filters)


def test_list_dead_letters_rejects_a_naive_since(db):
    naive = db_now(db).replace(tzinfo=None)
    with pytest.raises(InvalidArgument) as caught:
        list_dead_letters(db, since=naive)
    assert caught.value.code == "job.invalid_argument"


# -- queue_stats --------------------------------------------------------------------------


def test_queue_stats_on_an_empty_queue(db):
    stats = queue_stats(db)

    assert stats.by_status == {status.value: 0 for status in JobStatus}
    assert stats.by_type_and_status == {}
    assert stats.oldest_pending_age_seconds is None
    assert stats.expired_leases == 0


def test_queue_stats_counts_by_status_and_type(db):
    now = db_now(db)
    succeeded(db, REPORT)
    dead_lettered(db, EMAIL)
    leased(db, EMAIL, organization_id="org-1")
    canceled(db, REPORT)
    pending(db, EMAIL, run_at=now - timedelta(hours=1))
    pending(db, EMAIL, organization_id="org-1")
    pending(db, REPORT, delay_seconds=3600)  # not due yet: not "waiting"

    stats = queue_stats(db)

    assert stats.by_status == {"PENDING": 3, "LEASED": 1, "SUCCEEDED": 1, "DEAD_LETTERED": 1, "CANCELED": 1}
    assert stats.by_type_and_status == {
        (EMAIL, "PENDING"): 2,
        (EMAIL, "LEASED"): 1,
        (EMAIL, "DEAD_LETTERED"): 1,
        (REPORT, "PENDING"): 1,
        (REPORT, "SUCCEEDED"): 1,
        (REPORT, "CANCELED"): 1,
    }
    assert 3600 <= stats.oldest_due_age_seconds < 3600 + 120
    assert stats.oldest_pending_age_seconds == stats.oldest_due_age_seconds
    assert (stats.due_now, stats.scheduled_for_later) == (2, 1)
    assert now + timedelta(seconds=3500) < stats.next_scheduled_at < now + timedelta(seconds=3700)
    assert stats.expired_leases == 0

    scoped = queue_stats(db, organization_id="org-1")
    assert scoped.by_status == {"PENDING": 1, "LEASED": 1, "SUCCEEDED": 0, "DEAD_LETTERED": 0, "CANCELED": 0}
    assert scoped.by_type_and_status == {(EMAIL, "PENDING"): 1, (EMAIL, "LEASED"): 1}
    assert 0 <= scoped.oldest_pending_age_seconds < 120
    assert (scoped.due_now, scoped.scheduled_for_later, scoped.next_scheduled_at) == (1, 0, None)


def test_queue_stats_counts_expired_leases(db):
    live = leased(db, EMAIL)
    short = leased(db, REPORT, prestart=False, running=False, lease=0.05)
    time.sleep(0.2)

    stats = queue_stats(db)

    assert stats.by_status["LEASED"] == 2
    assert stats.expired_leases == 1
    assert get_job(db, short.id).lease_expires_at < db_now(db) < get_job(db, live.id).lease_expires_at
    assert stats.oldest_pending_age_seconds is None


def test_queue_stats_counts_pending_jobs_that_are_not_due_yet_apart(db):
    later = pending(db, EMAIL, delay_seconds=3600)
    pending(db, EMAIL, delay_seconds=7200)

    stats = queue_stats(db)

    assert stats.by_status["PENDING"] == 2
    assert (stats.due_now, stats.oldest_due_age_seconds) == (0, None)
    assert (stats.scheduled_for_later, stats.next_scheduled_at) == (2, later.next_run_at)


@pytest.mark.parametrize("organization_id", [None, "org-1"])
def test_the_pending_timing_pass_reads_an_index_of_resting_rows(db, organization_id):
    # With sequential scans off, the plan names a partial index only if the
    # statement's predicate matches its WHERE. The claim index leaves out jobs held
    # back by their concurrency key, which the pass counts: it reads the PENDING
    # entries of the resting-status index instead.
    pending(db, EMAIL)
    pending(db, EMAIL, delay_seconds=60)
    statement = pending_timing_statement(organization_id)
    sql = str(statement.compile(dialect=db.dialect, compile_kwargs={"literal_binds": True}))

    with db.begin() as conn:
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        plan = "\n".join(row[0] for row in conn.exec_driver_sql("EXPLAIN " + sql))

    # Scoped to an organization, its own listing index (organization, status, ...)
    # reads fewer rows still: that organization's PENDING jobs only.
    expected = "idx_job_queue_resting_status" if organization_id is None else "idx_job_queue_resting_org"
    assert expected in plan and "Seq Scan" not in plan, plan
