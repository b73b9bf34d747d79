"""Compare-and-requeue: a requeue that expects the job's status and run changes nothing when the row moved."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy

from runledger_sync.core.errors import (
    CompareAndRequeueUnsupportedIsolation,
    InvalidArgument,
    InvalidStateTransition,
    RequeueExpectationFailed,
)
from runledger_sync.core.records import JobDefinition
from runledger_sync.core.states import JobStatus
from runledger_sync.store.admin.actions import cancel_job, requeue_job
from runledger_sync.store.admin.jobs import get_job
from runledger_sync.store.definitions import sync_job_definitions
from tests.db.store.test_admin import EMAIL, REPORT, dead_lettered, pending, snapshot


@pytest.fixture
def db(engine):
    sync_job_definitions(engine, [JobDefinition(EMAIL, max_attempts=3), JobDefinition(REPORT, max_attempts=1)])
    return engine


def requeued_events(engine, job_id):
    with engine.connect() as connection:
        return connection.execute(sqlalchemy.text(
            "SELECT count(*) FROM job_events WHERE job_id = :id AND event_type = 'REQUEUED'"), {"id": job_id}).scalar()


def test_a_requeue_whose_expectation_holds_starts_the_next_run(db):
    job = dead_lettered(db)
    requeued = requeue_job(db, job.id, "looked at it", expected_status="DEAD_LETTERED", expected_run_number=1)
    assert (requeued.status, requeued.run_number, requeued.status_reason) == (JobStatus.PENDING, 2, "looked at it")
    assert requeued_events(db, job.id) == 1
    cancel_job(db, job.id)
    assert requeue_job(db, job.id, expected_status=JobStatus.CANCELED).run_number == 3


def test_a_job_requeued_and_ended_again_meanwhile_is_not_run_a_third_time(db):
    # The operator saw a dead letter in run 1; somebody else requeued it, and it was canceled in run 2.
    job = dead_lettered(db)
    requeue_job(db, job.id)
    cancel_job(db, job.id)
    before = snapshot(db)

    with pytest.raises(RequeueExpectationFailed) as caught:
        requeue_job(db, job.id, expected_status="DEAD_LETTERED", expected_run_number=1)

    assert caught.value.code == "job.requeue_expectation_failed"
    assert {key: caught.value.details[key] for key in ("status", "run_number", "expected_status", "expected_run_number")} \
        == {"status": "CANCELED", "run_number": 2, "expected_status": "DEAD_LETTERED", "expected_run_number": 1}
    assert snapshot(db) == before
    # The run alone is expected too: a requeue of run 2's end still works.
    assert requeue_job(db, job.id, expected_run_number=2).run_number == 3


def test_an_expectation_that_still_holds_on_an_unfinished_job_is_an_invalid_transition(db):
    job = pending(db)
    with pytest.raises(InvalidStateTransition):
        requeue_job(db, job.id, expected_status="PENDING", expected_run_number=1)
    with pytest.raises(RequeueExpectationFailed):
        requeue_job(db, job.id, expected_status="DEAD_LETTERED")


@pytest.mark.parametrize(("options", "argument"), [
    ({"expected_status": "DONE"}, "expected_status"),
    ({"expected_status": 3}, "expected_status"),
    ({"expected_run_number": 0}, "expected_run_number"),
    ({"expected_run_number": "1"}, "expected_run_number"),
])
def test_a_bad_expectation_is_refused_and_changes_nothing(db, options, argument):
    job = dead_lettered(db)
    before = snapshot(db)
    with pytest.raises(InvalidArgument) as caught:
        requeue_job(db, job.id, **options)
    assert caught.value.code == "job.invalid_argument"
    assert argument in str(caught.value)
    assert snapshot(db) == before


def test_two_racing_compare_and_requeues_requeue_once(db):
    job = dead_lettered(db)
    # The first holds the row locked in its open transaction; the second waits on the
    # lock, then finds the row moved: under READ COMMITTED it tests the row as the first left it.
    outcomes: list[object] = []
    with db.connect() as first:
        winner = requeue_job(first, job.id, expected_status="DEAD_LETTERED", expected_run_number=1)

        def second() -> None:
            try:
                outcomes.append(requeue_job(db, job.id, expected_status="DEAD_LETTERED", expected_run_number=1))
            except RequeueExpectationFailed as error:
                outcomes.append(error)

        waiting = threading.Thread(target=second)
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive()  # blocked on the first's row lock
        first.commit()
        waiting.join(10)
    assert winner.run_number == 2
    [lost] = outcomes
    assert isinstance(lost, RequeueExpectationFailed) and lost.details["run_number"] == 2
    assert get_job(db, job.id).run_number == 2
    assert requeued_events(db, job.id) == 1


def test_expectations_refuse_a_transaction_above_read_committed(db):
    job = dead_lettered(db)
    with db.connect() as connection:
        connection.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(CompareAndRequeueUnsupportedIsolation) as caught:
            requeue_job(connection, job.id, expected_status="DEAD_LETTERED")
        connection.rollback()
    assert caught.value.code == "job.compare_and_requeue_unsupported_isolation"
    assert get_job(db, job.id).status is JobStatus.DEAD_LETTERED
