"""Audited replays: a requeue recorded in job_replays, idempotent by its key, across racing callers."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy

import runledger_sync as rl
from runledger_sync.core.errors import (
    CompareAndRequeueUnsupportedIsolation,
    InvalidStateTransition,
    JobNotFound,
    RequeueExpectationFailed,
)
from runledger_sync.core.records import JobDefinition
from runledger_sync.core.replay_errors import (
    ReplayIdempotencyConflict,
    ReplayIdempotencyConflictMissingExisting,
    ReplayKeyBlank,
    ReplayKeyTooLong,
    ReplayReasonBlank,
)
from runledger_sync.core.states import JobStatus
from runledger_sync.store.admin.actions import cancel_job
from runledger_sync.store.admin.jobs import get_job
from runledger_sync.store.admin.replays import list_replays, replay_job
from runledger_sync.store.definitions import sync_job_definitions
from tests.db.store.test_admin import EMAIL, REPORT, dead_lettered, pending, snapshot, succeeded
from tests.db.store import test_workflows_lifecycle as workflows
from tests.db.store.test_compare_and_requeue import requeued_events
from tests.support import define


@pytest.fixture
def db(engine):
    sync_job_definitions(engine, [JobDefinition(EMAIL, max_attempts=3), JobDefinition(REPORT, max_attempts=1)])
    return engine


def replay_rows(engine) -> list[tuple]:
    with engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sqlalchemy.text(
            "SELECT job_id, replay_key, actor, reason, expected_status, expected_run_number, run_number "
            "FROM job_replays ORDER BY created_at, id"))]


def everything(engine) -> tuple:
    return snapshot(engine), replay_rows(engine)


def test_a_replay_requeues_the_job_and_records_who_why_and_the_run_it_started(db):
    job = dead_lettered(db)

    replay = replay_job(db, job.id, replay_key="incident-7", reason="mailbox fixed", actor="alice",
                        expected_status="DEAD_LETTERED", expected_run_number=1)

    assert (replay.job_id, replay.replay_key, replay.actor, replay.reason) == (job.id, "incident-7", "alice", "mailbox fixed")
    assert (replay.expected_status, replay.expected_run_number, replay.run_number) == ("DEAD_LETTERED", 1, 2)
    assert replay.disposition == "created"
    again = get_job(db, job.id)
    assert (again.status, again.run_number, again.attempt, again.status_reason) == (JobStatus.PENDING, 2, 0, "mailbox fixed")
    assert requeued_events(db, job.id) == 1
    assert list_replays(db, job.id) == [replay]
    assert list_replays(db, job.id)[0].disposition is None


def test_the_same_key_and_request_returns_the_recorded_replay_and_requeues_nothing_more(db):
    job = dead_lettered(db)
    first = replay_job(db, job.id, replay_key="k", reason="retry it")
    # Run 2 ends too; a repeat of the request (a retried script) must not start run 3.
    cancel_job(db, job.id)
    before = everything(db)

    repeated = replay_job(db, str(job.id), replay_key="k", reason="retry it")

    assert repeated == first and repeated.disposition == "existing"
    assert everything(db) == before
    assert get_job(db, job.id).status is JobStatus.CANCELED
    # Another key is another replay.
    assert replay_job(db, job.id, replay_key="k2", reason="retry it").run_number == 3


@pytest.mark.parametrize("differs", [
    {"reason": "another reason"},
    {"actor": "bob"},
    {"expected_status": "DEAD_LETTERED"},
    {"expected_run_number": 1},
])
def test_the_same_key_for_another_request_is_a_conflict_and_changes_nothing(db, differs):
    job = dead_lettered(db)
    first = replay_job(db, job.id, replay_key="k", reason="retry it")
    cancel_job(db, job.id)
    before = everything(db)

    with pytest.raises(ReplayIdempotencyConflict) as caught:
        replay_job(db, job.id, **{"replay_key": "k", "reason": "retry it", **differs})

    assert caught.value.code == "job.replay_idempotency_conflict"
    assert caught.value.details["replay_id"] == str(first.id)
    assert everything(db) == before


@pytest.mark.parametrize(("options", "error", "code"), [
    ({"replay_key": ""}, ReplayKeyBlank, "job.replay_key_blank"),
    ({"replay_key": " \t"}, ReplayKeyBlank, "job.replay_key_blank"),
    ({"replay_key": "k" * 256}, ReplayKeyTooLong, "job.replay_key_too_long"),
    ({"reason": ""}, ReplayReasonBlank, "job.replay_reason_blank"),
    ({"reason": "   "}, ReplayReasonBlank, "job.replay_reason_blank"),
    ({"replay_key": 7}, rl.InvalidArgument, "job.invalid_argument"),
    ({"reason": None}, rl.InvalidArgument, "job.invalid_argument"),
    ({"actor": "a" * 256}, rl.InvalidArgument, "job.invalid_argument"),
    ({"expected_run_number": 0}, rl.InvalidArgument, "job.invalid_argument"),
])
def test_a_bad_key_reason_or_expectation_is_refused_with_its_code_and_changes_nothing(db, options, error, code):
    job = dead_lettered(db)
    before = everything(db)
    with pytest.raises(error) as caught:
        replay_job(db, job.id, **{"replay_key": "k", "reason": "why", **options})
    assert caught.value.code == code
    assert everything(db) == before


def test_a_key_of_255_characters_is_kept_whole(db):
    job = dead_lettered(db)
    key = "\N{GRINNING FACE}" * 255
    assert replay_job(db, job.id, replay_key=key, reason="why").replay_key == key


def test_a_failed_expectation_is_the_requeues_code_and_records_nothing(db):
    job = dead_lettered(db)
    replay_job(db, job.id, replay_key="first", reason="why")
    cancel_job(db, job.id)
    before = everything(db)

    with pytest.raises(RequeueExpectationFailed) as caught:
        replay_job(db, job.id, replay_key="second", reason="why", expected_status="DEAD_LETTERED", expected_run_number=1)

    assert caught.value.details["status"] == "CANCELED" and caught.value.details["run_number"] == 2
    assert everything(db) == before


def test_an_unfinished_or_missing_job_is_refused_as_a_requeue_is(db):
    job = pending(db)
    before = everything(db)
    with pytest.raises(InvalidStateTransition):
        replay_job(db, job.id, replay_key="k", reason="why")
    with pytest.raises(JobNotFound):
        replay_job(db, "00000000-0000-7000-8000-000000000000", replay_key="k", reason="why")
    assert everything(db) == before


def test_a_workflow_managed_job_is_refused(engine):
    for job_type in (workflows.A, workflows.B, workflows.C):
        define(engine, job_type)
    run = rl.enqueue_workflow(engine, workflows.chain("on_terminal"))
    job = workflows.succeed(engine, workflows.A)
    before = everything(engine)

    with pytest.raises(rl.errors.WorkflowRequeueNotSupported) as caught:
        replay_job(engine, job.id, replay_key="k", reason="why")

    assert caught.value.code == "job.workflow_requeue_not_supported"
    assert everything(engine) == before
    assert workflows.statuses(engine, run.id)["b"].value == "ENQUEUED"


def test_a_transaction_above_read_committed_is_refused(db):
    job = succeeded(db)
    with db.connect() as connection:
        connection.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(CompareAndRequeueUnsupportedIsolation):
            replay_job(connection, job.id, replay_key="k", reason="why")
        connection.rollback()
    assert replay_rows(db) == [] and get_job(db, job.id).run_number == 1


def test_a_replay_in_the_callers_transaction_rolls_back_with_it(db):
    job = succeeded(db)
    with db.connect() as connection:
        replay_job(connection, job.id, replay_key="k", reason="why")
        connection.rollback()
    assert replay_rows(db) == [] and get_job(db, job.id).status is JobStatus.SUCCEEDED


def test_a_second_caller_that_waited_for_the_first_gets_its_replay(db):
    job = dead_lettered(db)
    outcomes: list[object] = []
    with db.connect() as first:
        winner = replay_job(first, job.id, replay_key="k", reason="why", actor="alice")

        def second() -> None:
            try:
                outcomes.append(replay_job(db, job.id, replay_key="k", reason="why", actor="alice"))
            except rl.RunledgerError as error:
                outcomes.append(error)

        waiting = threading.Thread(target=second)
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive()  # blocked on the first's row lock
        first.commit()
        waiting.join(10)
    [answer] = outcomes
    assert answer == winner and answer.disposition == "existing"
    assert get_job(db, job.id).run_number == 2
    assert requeued_events(db, job.id) == 1
    assert len(replay_rows(db)) == 1


def test_a_key_recorded_while_the_job_finished_again_is_found_and_requeues_nothing(db):
    # The second caller looks the key up before the first commits, then waits on the row;
    # the first replays and cancels the new run in one transaction, so the row the second
    # then locks is finished again, and only the key's unique index stops a second run.
    job = dead_lettered(db)
    outcomes: list[object] = []
    with db.connect() as first:
        winner = replay_job(first, job.id, replay_key="k", reason="why")
        cancel_job(first, job.id)

        def second() -> None:
            try:
                outcomes.append(replay_job(db, job.id, replay_key="k", reason="why"))
            except rl.RunledgerError as error:
                outcomes.append(error)

        waiting = threading.Thread(target=second)
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive()
        first.commit()
        waiting.join(10)
    [answer] = outcomes
    assert answer == winner and answer.disposition == "existing"
    again = get_job(db, job.id)
    assert (again.status, again.run_number) == (JobStatus.CANCELED, 2)
    assert requeued_events(db, job.id) == 1


def test_many_callers_racing_one_key_requeue_once(db):
    job = dead_lettered(db)
    callers = 8
    start = threading.Barrier(callers)
    outcomes: list[object] = []
    lock = threading.Lock()

    def call() -> None:
        start.wait(10)
        try:
            outcome: object = replay_job(db, job.id, replay_key="k", reason="why")
        except Exception as error:  # noqa: BLE001 - any error fails the assertion below, with its name
            outcome = error
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=call) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)

    assert [type(outcome).__name__ for outcome in outcomes] == ["JobReplay"] * callers
    assert sorted(outcome.disposition for outcome in outcomes) == ["created"] + ["existing"] * (callers - 1)
    assert len({outcome.id for outcome in outcomes}) == 1
    assert get_job(db, job.id).run_number == 2
    assert requeued_events(db, job.id) == 1


def test_list_replays_is_newest_first_per_job_or_all(db):
    one, two = dead_lettered(db), succeeded(db)
    a = replay_job(db, one.id, replay_key="a", reason="first")
    b = replay_job(db, two.id, replay_key="b", reason="second")
    cancel_job(db, one.id)
    c = replay_job(db, one.id, replay_key="c", reason="third")

    assert [r.id for r in list_replays(db)] == [c.id, b.id, a.id]
    assert [r.id for r in list_replays(db, job_id=one.id)] == [c.id, a.id]
    assert [r.id for r in list_replays(db, limit=1)] == [c.id]
    assert rl.list_replays(db, str(two.id)) == [b]
    with pytest.raises(rl.InvalidArgument):
        list_replays(db, limit=0)


def test_a_deleted_job_takes_its_replays_with_it(db):
    job = dead_lettered(db)
    replay_job(db, job.id, replay_key="k", reason="why")
    with db.begin() as connection:
        connection.execute(sqlalchemy.text("DELETE FROM job_queue WHERE id = :id"), {"id": job.id})
    assert list_replays(db) == []


def test_a_key_collision_whose_replay_is_gone_is_the_missing_existing_code_and_changes_nothing(db):
    # A collision on the key whose row has vanished by the time it is read (its job deleted
    # meanwhile) is stood in for by a trigger that reports the key's index broken.
    job = dead_lettered(db)
    with db.begin() as connection:
        connection.exec_driver_sql(
            "CREATE FUNCTION collide() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION "
            "USING ERRCODE = 'unique_violation', CONSTRAINT = 'uq_job_replays_job_id_replay_key', "
            "MESSAGE = 'collided'; END $$")
        connection.exec_driver_sql(
            "CREATE TRIGGER collide BEFORE INSERT ON job_replays FOR EACH ROW EXECUTE FUNCTION collide()")
    before = everything(db)

    with pytest.raises(ReplayIdempotencyConflictMissingExisting) as caught:
        replay_job(db, job.id, replay_key="k", reason="why")

    assert caught.value.code == "job.replay_idempotency_conflict_missing_existing"
    assert caught.value.category == "internal"
    assert everything(db) == before
