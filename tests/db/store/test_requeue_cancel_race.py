"""A compare-and-requeue racing a cancel: exactly one wins, and the other gets its code.

A cancel takes only PENDING or LEASED jobs and a requeue only finished ones, so the
two meet over one finished job: the operator who saw it dead-lettered in run 1
requeues it expecting just that, while somebody else requeues it and cancels the new
run (or cancels a run that somebody else's requeue started). Each interleaving is
forced: one side holds the row locked in its open transaction, and the other starts
only when it is seen waiting for that lock (or, when it need not wait, is seen
answering at once).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest
import sqlalchemy

from runledger_sync.core.errors import InvalidStateTransition, RequeueExpectationFailed, RunledgerError
from runledger_sync.core.records import JobDefinition
from runledger_sync.core.states import JobStatus
from runledger_sync.store.admin.actions import cancel_job, requeue_job
from runledger_sync.store.admin.jobs import get_job
from runledger_sync.store.definitions import sync_job_definitions
from tests.db.store.test_admin import EMAIL, dead_lettered
from tests.support import scalar, wait_until

SAW = dict(expected_status="DEAD_LETTERED", expected_run_number=1)


@pytest.fixture
def db(engine):
    sync_job_definitions(engine, [JobDefinition(EMAIL, max_attempts=3)])
    return engine


def events(engine, job_id) -> dict[str, int]:
    with engine.connect() as connection:
        return dict(connection.execute(sqlalchemy.text(
            "SELECT event_type, count(*) FROM job_events WHERE job_id = :id "
            "AND event_type IN ('REQUEUED', 'CANCELED') GROUP BY event_type"), {"id": job_id}).all())


def state(engine, job_id) -> tuple[JobStatus, int]:
    job = get_job(engine, job_id)
    return job.status, job.run_number


class Contender:
    """One side of a race, run in a thread on a connection of its own and committed when it succeeds."""

    def __init__(self, engine, work: Callable[[Any], Any]) -> None:
        self.engine, self.work = engine, work
        self.pid: list[int] = []
        self.outcome: list[Any] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.pid, what="the contender's connection")

    def _run(self) -> None:
        with self.engine.connect() as connection:
            self.pid.append(connection.execute(sqlalchemy.text("SELECT pg_backend_pid()")).scalar())
            try:
                self.outcome.append(self.work(connection))
                connection.commit()
            except RunledgerError as error:
                connection.rollback()
                self.outcome.append(error)

    def wait_event(self) -> Any:
        return scalar(self.engine, "SELECT wait_event FROM pg_stat_activity "
                                   "WHERE pid = :pid AND wait_event_type = 'Lock'", pid=self.pid[0])

    def blocked(self) -> None:
        """Return once the contender waits for a row lock: on the holder's transaction, or on the row."""
        assert wait_until(self.wait_event, what="the contender waiting for the row lock") in ("transactionid", "tuple")

    def result(self) -> Any:
        self.thread.join(10)
        assert not self.thread.is_alive(), "the contender never finished"
        [outcome] = self.outcome
        return outcome


def test_a_requeue_and_cancel_committed_first_make_the_waiting_compare_and_requeue_fail_its_expectation(db):
    job = dead_lettered(db)
    with db.connect() as other:
        # Somebody else requeues the dead letter and cancels its new run, in one open transaction.
        assert requeue_job(other, job.id).run_number == 2
        assert cancel_job(other, job.id).status is JobStatus.CANCELED
        operator = Contender(db, lambda connection: requeue_job(connection, job.id, "looked at it", **SAW))
        operator.blocked()
        other.commit()
        lost = operator.result()

    # Re-tested against the row as the winner left it (CANCELED in run 2), the
    # expectation fails: without it the operator would start a third run.
    assert isinstance(lost, RequeueExpectationFailed) and lost.code == "job.requeue_expectation_failed"
    assert {key: lost.details[key] for key in ("status", "run_number")} == {"status": "CANCELED", "run_number": 2}
    assert state(db, job.id) == (JobStatus.CANCELED, 2)
    assert events(db, job.id) == {"REQUEUED": 1, "CANCELED": 1}


@pytest.mark.parametrize(("expectations", "code"), [
    (SAW, "job.requeue_expectation_failed"),
    ({}, "job.invalid_state_transition"),
])
def test_a_compare_and_requeue_committed_first_makes_the_waiting_requeue_lose_and_cancel_nothing(
    db, expectations, code,
):
    job = dead_lettered(db)
    cancels: list[Any] = []

    def requeue_then_cancel(connection: Any) -> Any:
        requeue_job(connection, job.id, **expectations)
        # Reached only when the requeue won: then this run is the one to cancel.
        cancels.append(cancel_job(connection, job.id))
        return cancels[-1]

    with db.connect() as operator:
        won = requeue_job(operator, job.id, "looked at it", **SAW)
        other = Contender(db, requeue_then_cancel)
        other.blocked()
        operator.commit()
        lost = other.result()

    assert (won.status, won.run_number) == (JobStatus.PENDING, 2)
    assert isinstance(lost, RunledgerError) and lost.code == code
    assert lost.details["status"] == "PENDING"
    assert cancels == []
    assert state(db, job.id) == (JobStatus.PENDING, 2)
    assert events(db, job.id) == {"REQUEUED": 1}


def test_a_cancel_while_a_compare_and_requeue_is_uncommitted_finds_the_job_finished_and_is_refused(db):
    # The cancel reads the dead letter as committed and does not wait: it cannot take a
    # finished job. Once the requeue commits, run 2 is the requeue's, not canceled.
    job = dead_lettered(db)
    with db.connect() as operator:
        requeue_job(operator, job.id, "looked at it", **SAW)
        canceller = Contender(db, lambda connection: cancel_job(connection, job.id))
        lost = canceller.result()
        assert state(db, job.id) == (JobStatus.DEAD_LETTERED, 1)
        operator.commit()

    assert isinstance(lost, InvalidStateTransition) and lost.code == "job.invalid_state_transition"
    assert lost.details["status"] == "DEAD_LETTERED"
    assert state(db, job.id) == (JobStatus.PENDING, 2)
    assert events(db, job.id) == {"REQUEUED": 1}


def test_a_compare_and_requeue_of_a_run_being_canceled_is_refused_and_the_cancel_stands(db):
    # Somebody requeued the dead letter (run 2); an operator cancels run 2 while another,
    # expecting run 2 to have ended, requeues it: run 2 has not ended in what it reads.
    job = dead_lettered(db)
    requeue_job(db, job.id)
    with db.connect() as canceller:
        cancel_job(canceller, job.id, reason="stuck")
        requeuer = Contender(db, lambda connection: requeue_job(connection, job.id, expected_run_number=2))
        lost = requeuer.result()
        canceller.commit()

    assert isinstance(lost, InvalidStateTransition) and lost.details["status"] == "PENDING"
    assert state(db, job.id) == (JobStatus.CANCELED, 2)
    assert events(db, job.id) == {"REQUEUED": 1, "CANCELED": 1}
    # Now that run 2 ended, the same expectation holds.
    assert requeue_job(db, job.id, expected_run_number=2).run_number == 3
