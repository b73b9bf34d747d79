"""Dead letters chosen by a filter (store.admin.dead_letters): list by error code and exception type, count, replay in batches."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional
from uuid import UUID

import pytest
import sqlalchemy

from runledger_sync.core.errors import InvalidArgument
from runledger_sync.core.records import JobDefinition, JobRecord, LeaseIdentity
from runledger_sync.core.states import JobStatus
from runledger_sync.core.types import JobFailure
from runledger_sync.core.workflow import Workflow
from runledger_sync.store.admin.dead_letters import count_dead_letters, list_dead_letters, replay_dead_letters
from runledger_sync.store.admin.jobs import get_job, list_events
from runledger_sync.store.claim.claim import claim_jobs
from runledger_sync.store.enqueue.enqueue import enqueue
from runledger_sync.store.definitions import sync_job_definitions
from runledger_sync.store.attempt.ends import complete_job_failure
from runledger_sync.store.workflows.enqueue import enqueue_workflow

EMAIL = "letters.email"
TOP = 1_000_000


@pytest.fixture
def db(engine):
    sync_job_definitions(engine, [JobDefinition(EMAIL, max_attempts=1)])
    return engine


def dead(db: Any, code: str, error_type: Optional[str], organization_id: Optional[str] = None) -> JobRecord:
    job = enqueue(db, EMAIL, {"n": 1}, priority=TOP, organization_id=organization_id)
    return fail(db, job, code, error_type)


def fail(db: Any, job: JobRecord, code: str, error_type: Optional[str]) -> JobRecord:
    [claimed] = claim_jobs(db, worker_id="w", lease_ttl_seconds=60, limit=1, job_types=[job.job_type])
    assert claimed.id == job.id
    return complete_job_failure(db, **LeaseIdentity.of(claimed).keywords(), failure=JobFailure.terminal(code, "no"),
                                retry_delay_ms=None, error_type=error_type,
                                traceback=None if error_type is None else f"Traceback\n{error_type}: no\n")


def statuses(db: Any, jobs: list[JobRecord]) -> list[tuple[JobStatus, int, Optional[str]]]:
    found = [get_job(db, job.id) for job in jobs]
    return [(job.status, job.run_number, job.status_reason) for job in found if job is not None]


def requeued_events(db: Any, job_id: UUID) -> list[Any]:
    return [e.payload for e in list_events(db, job_id) if e.event_type == "REQUEUED"]


def test_list_filters_by_error_code_and_exception_type(db):
    timeout = dead(db, "http.timeout", "TimeoutError")
    refused = dead(db, "http.timeout", "ConnectionRefusedError")
    declined = dead(db, "card.declined", None)

    def listed(**filters: Any) -> list[tuple[UUID, Optional[str], Optional[str]]]:
        return [(d.job_id, d.error_code, d.error_type) for d in list_dead_letters(db, **filters)]

    assert listed(error_code="http.timeout") == [
        (refused.id, "http.timeout", "ConnectionRefusedError"),
        (timeout.id, "http.timeout", "TimeoutError")]
    assert listed(error_type="TimeoutError") == [(timeout.id, "http.timeout", "TimeoutError")]
    assert listed(error_code="card.declined", error_type="TimeoutError") == []
    assert listed(error_code="card.declined") == [(declined.id, "card.declined", None)]


def test_a_builtin_type_filtered_as_builtins_dot_name_matches_the_failures_stored_under_its_name(db):
    # The worker stores a builtin's type without its module (KeyError); the docs once said builtins.KeyError.
    key_errors = [dead(db, "order.incomplete", "KeyError") for _ in range(2)]
    dead(db, "order.incomplete", "myapp.KeyError")

    assert count_dead_letters(db, error_type="builtins.KeyError") == count_dead_letters(
        db, error_type="KeyError") == 2
    assert {d.job_id for d in list_dead_letters(db, error_type="builtins.KeyError")} == {j.id for j in key_errors}
    assert replay_dead_letters(db, error_type="builtins.KeyError") == 2
    assert statuses(db, key_errors) == [(JobStatus.PENDING, 2, "DEAD_LETTER_REPLAY")] * 2


def test_a_hostile_filter_value_is_bound_and_matches_only_itself(db):
    dead(db, "http.timeout", "TimeoutError")
    hostile = "x' OR '1'='1"

    assert list_dead_letters(db, error_code=hostile) == []
    assert list_dead_letters(db, error_type=hostile) == []
    assert count_dead_letters(db, error_code=hostile) == 0
    assert replay_dead_letters(db, error_type=hostile) == 0


def test_replay_requeues_exactly_the_filtered_jobs_in_batches(db):
    timeouts = [dead(db, "http.timeout", "TimeoutError") for _ in range(5)]
    other_type = dead(db, "http.timeout", "OSError")
    other_code = dead(db, "card.declined", "TimeoutError")
    assert count_dead_letters(db, error_code="http.timeout", error_type="TimeoutError") == 5

    replayed = replay_dead_letters(db, error_code="http.timeout", error_type="TimeoutError", batch_size=2)

    assert replayed == 5
    assert statuses(db, timeouts) == [(JobStatus.PENDING, 2, "DEAD_LETTER_REPLAY")] * 5
    assert statuses(db, [other_type, other_code]) == [(JobStatus.DEAD_LETTERED, 1, "TERMINAL")] * 2
    assert all(requeued_events(db, job.id) == [{"reason": "DEAD_LETTER_REPLAY"}] for job in timeouts)
    # The dead-letter rows stay (they are the record of the failure); the count follows the jobs.
    assert len(list_dead_letters(db, error_type="TimeoutError")) == 6
    assert count_dead_letters(db, error_code="http.timeout", error_type="TimeoutError") == 0
    assert replay_dead_letters(db, error_code="http.timeout", error_type="TimeoutError") == 0


def test_two_replays_at_once_requeue_each_job_once(db):
    jobs = [dead(db, "http.timeout", None) for _ in range(40)]
    with ThreadPoolExecutor(2) as pool:
        counts = list(pool.map(lambda _: replay_dead_letters(db, batch_size=3), range(2)))

    assert sum(counts) == 40
    assert statuses(db, jobs) == [(JobStatus.PENDING, 2, "DEAD_LETTER_REPLAY")] * 40
    assert all(len(requeued_events(db, job.id)) == 1 for job in jobs)


def test_replay_stops_at_its_limit_most_recent_failure_first(db):
    jobs = [dead(db, "http.timeout", None) for _ in range(4)]

    assert replay_dead_letters(db, error_code="http.timeout", batch_size=3, limit=2) == 2

    assert [s for s, _, _ in statuses(db, jobs)] == [JobStatus.DEAD_LETTERED] * 2 + [JobStatus.PENDING] * 2
    assert count_dead_letters(db, error_code="http.timeout") == 2
    assert count_dead_letters(db, error_code="http.timeout", at_most=1) == 1


def test_replay_keeps_to_the_organization_and_leaves_a_replayed_job_that_failed_again_once(db):
    ours = dead(db, "http.timeout", None, organization_id="org-a")
    theirs = dead(db, "http.timeout", None, organization_id="org-b")

    assert replay_dead_letters(db, organization_id="org-a") == 1
    assert statuses(db, [ours, theirs]) == [(JobStatus.PENDING, 2, "DEAD_LETTER_REPLAY"), (JobStatus.DEAD_LETTERED, 1, "TERMINAL")]
    # Dead again on its second run: one job, one replay, whatever rows its runs left.
    fail(db, get_job(db, ours.id), "http.timeout", None)
    assert count_dead_letters(db, organization_id="org-a") == 1
    assert replay_dead_letters(db, organization_id="org-a") == 1
    assert statuses(db, [ours]) == [(JobStatus.PENDING, 3, "DEAD_LETTER_REPLAY")]


def test_replay_leaves_a_workflows_job_alone(db):
    workflow = Workflow("letters.flow")
    workflow.job("only", EMAIL, {"n": 1}, priority=TOP)
    run = enqueue_workflow(db, workflow)
    step_job = get_job(db, run.step("only").job_id)
    fail(db, step_job, "http.timeout", None)

    assert count_dead_letters(db) == 0
    assert replay_dead_letters(db) == 0
    assert get_job(db, step_job.id).status is JobStatus.DEAD_LETTERED


@pytest.mark.parametrize("arguments", [
    {"error_code": ""}, {"error_type": "x" * 300}, {"error_code": "a\x00b"}, {"batch_size": 0},
    {"batch_size": 10_001}, {"limit": 0}, {"reason": " "}, {"since": sqlalchemy.func.now()},
])
def test_replay_refuses_bad_arguments_and_requeues_nothing(db, arguments):
    job = dead(db, "http.timeout", None)

    with pytest.raises(InvalidArgument):
        replay_dead_letters(db, **arguments)

    assert statuses(db, [job]) == [(JobStatus.DEAD_LETTERED, 1, "TERMINAL")]
