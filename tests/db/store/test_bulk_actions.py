"""Bulk actions by filter (store.admin.bulk): each follows its one-job rule, in batches, with a dry run and an audit row."""

from __future__ import annotations

import select as selectors
import threading
from datetime import datetime, timedelta, timezone

import psycopg2
import pytest
import sqlalchemy

import runledger_sync as rl
from runledger_sync.core.bulk_errors import EmptyJobFilter, InvalidJobFilter, InvalidJobUpdate
from runledger_sync.core.errors import InvalidMeta
from runledger_sync.core.records import JobDefinition
from runledger_sync.store.admin import bulk
from runledger_sync.store.definitions import sync_job_definitions
from runledger_sync.store.notify import CANCELED_CHANNEL
from tests.db.store.test_admin import EMAIL, REPORT, dead_lettered, leased, pending, snapshot, succeeded
from tests.db.store.test_workflows_lifecycle import A, B, C, chain, statuses, succeed
from tests.support import events, scalar

ACME = {"tenant": "acme"}


@pytest.fixture
def db(engine):
    sync_job_definitions(engine, [JobDefinition(EMAIL, max_attempts=3), JobDefinition(REPORT, max_attempts=1)]
                         + [JobDefinition(t, max_attempts=2) for t in (A, B, C)])
    return engine


def operations_count(db) -> int:
    return scalar(db, "SELECT count(*) FROM job_operations")


def status_of(db, job) -> rl.JobStatus:
    return rl.get_job(db, job.id).status


# -- cancel ---------------------------------------------------------------------------------


def test_a_dry_run_counts_what_a_cancel_would_take_and_changes_and_records_nothing(db):
    for _ in range(3):
        pending(db, meta=ACME)
    leased(db, meta=ACME)
    pending(db, meta={"tenant": "globex"})
    succeeded(db, meta=ACME)
    before = snapshot(db)

    result = rl.cancel_jobs(db, rl.JobFilter(meta=ACME), reason="offboarding", dry_run=True)

    assert (result.matched, result.changed, result.dry_run, result.operation_id) == (4, 0, True, None)
    assert snapshot(db) == before
    assert operations_count(db) == 0


def test_cancel_jobs_cancels_the_matching_pending_and_leased_jobs_as_cancel_job_does(db):
    waiting = [pending(db, meta=ACME) for _ in range(2)]
    running = leased(db, meta={**ACME, "region": "eu"})
    other = pending(db, meta={"tenant": "globex"})
    done = succeeded(db, meta=ACME)

    result = rl.cancel_jobs(db, rl.JobFilter(meta=ACME), reason="tenant offboarded", actor="alice")

    assert (result.action, result.matched, result.changed, result.skipped) == ("cancel", 3, 3, {})
    for job in [*waiting, running]:
        record = rl.get_job(db, job.id)
        assert (record.status, record.status_reason) == (rl.JobStatus.CANCELED, "tenant offboarded")
        assert events(db, job.id)[-1][0] == "CANCELED"
        assert events(db, job.id)[-1][2] == {"reason": "tenant offboarded"}
    # The running job's attempt is closed, as cancel_job closes it.
    assert scalar(db, "SELECT finished_at IS NOT NULL FROM job_attempts WHERE job_id = :id", id=running.id)
    assert status_of(db, other) is rl.JobStatus.PENDING
    assert status_of(db, done) is rl.JobStatus.SUCCEEDED
    [operation] = rl.list_operations(db)
    assert (operation.id, operation.action, operation.actor, operation.reason) == (
        result.operation_id, "cancel", "alice", "tenant offboarded")
    assert (operation.filter, operation.matched, operation.changed, operation.status) == (
        {"meta": ACME}, 3, 3, "SUCCEEDED")
    assert operation.finished_at >= operation.started_at


def test_a_bulk_cancel_notifies_the_worker_running_a_canceled_job(db, fresh_database):
    running = leased(db, meta=ACME)
    url = sqlalchemy.engine.make_url(fresh_database)
    # The whole URL as libpq reads it: the embedded server's socket directory is in its query.
    listener = psycopg2.connect(url.set(drivername="postgresql").render_as_string(hide_password=False))
    listener.autocommit = True
    try:
        listener.cursor().execute(f"LISTEN {CANCELED_CHANNEL}")
        rl.cancel_jobs(db, rl.JobFilter(meta=ACME), reason="stop")
        selectors.select([listener], [], [], 10)
        listener.poll()
        assert str(running.id) in {notice.payload for notice in listener.notifies}
    finally:
        listener.close()


def test_a_cancel_runs_in_batches_and_records_how_far_it_got(db, monkeypatch):
    monkeypatch.setattr(bulk, "BATCH_SIZE", 7)
    jobs = rl.enqueue_many(db, [rl.JobSpec(EMAIL, {"n": n}, meta=ACME) for n in range(30)])

    result = rl.cancel_jobs(db, rl.JobFilter(job_types=[EMAIL]), reason="batches")

    assert (result.matched, result.changed) == (30, 30)
    assert scalar(db, "SELECT count(*) FROM job_queue WHERE status = 'CANCELED'") == 30
    [operation] = rl.list_operations(db)
    newest = max((job.created_at, job.id) for job in rl.list_jobs(db, limit=100))
    assert operation.cursor["status"] == "PENDING"
    assert (operation.cursor["created_at"], operation.cursor["id"]) == (newest[0].isoformat(), str(newest[1]))
    assert len(jobs) == 30


def test_a_job_another_transaction_holds_is_passed_over_not_waited_for(db):
    held, free = pending(db, meta=ACME), pending(db, meta=ACME)
    with db.connect() as holder:
        holder.execute(sqlalchemy.text("SELECT 1 FROM job_queue WHERE id = :id FOR UPDATE"), {"id": held.id})
        done = threading.Event()
        outcome = {}

        def cancel():
            outcome["result"] = rl.cancel_jobs(db, rl.JobFilter(meta=ACME), reason="skip the held one")
            done.set()

        thread = threading.Thread(target=cancel)
        thread.start()
        # It finishes while the lock is still held: it never waited on it.
        assert done.wait(20), "the bulk cancel waited on a locked job"
        holder.rollback()
    thread.join()
    assert (outcome["result"].matched, outcome["result"].changed) == (2, 1)
    assert (status_of(db, held), status_of(db, free)) == (rl.JobStatus.PENDING, rl.JobStatus.CANCELED)


def test_a_job_passed_over_while_locked_is_taken_by_the_next_walk(db, monkeypatch):
    held, free = pending(db, meta=ACME), pending(db, meta=ACME)
    holder = db.connect()
    holder.execute(sqlalchemy.text("SELECT 1 FROM job_queue WHERE id = :id FOR UPDATE"), {"id": held.id})
    real = bulk._Plan.run_batch
    walks = []

    def releasing_before_the_second_walk(self, connection, **kwargs):
        walks.append(kwargs["passes"])
        if kwargs["passes"] == 2 and not holder.closed:
            holder.rollback()
            holder.close()
        return real(self, connection, **kwargs)

    monkeypatch.setattr(bulk._Plan, "run_batch", releasing_before_the_second_walk)
    try:
        result = rl.cancel_jobs(db, rl.JobFilter(meta=ACME), reason="both")
    finally:
        holder.close()

    assert (result.matched, result.changed) == (2, 2)
    assert (status_of(db, held), status_of(db, free)) == (rl.JobStatus.CANCELED, rl.JobStatus.CANCELED)
    # Walk 1 took the free job, walk 2 the one released, walk 3 found nothing left and ended it.
    assert sorted(set(walks)) == [1, 2, 3]


def test_a_bulk_cancel_of_a_workflow_job_cascades_as_the_spec_says(db):
    run = rl.enqueue_workflow(db, chain("on_success"))

    result = rl.cancel_jobs(db, rl.JobFilter(job_types=[A]), reason="stop the chain")

    assert result.changed == 1
    assert set(statuses(db, run.id).values()) == {rl.WorkflowStepStatus.CANCELED}


# -- retry, delete, update ------------------------------------------------------------------


def test_retry_jobs_requeues_finished_jobs_and_counts_a_workflows_jobs_as_refused(db):
    dead = [dead_lettered(db, meta=ACME) for _ in range(2)]
    done = succeeded(db, meta=ACME)
    waiting = pending(db, meta=ACME)
    workflow = rl.Workflow("tenant chain", meta=ACME)
    workflow.job("b", B, after=[workflow.job("a", A)])
    run = rl.enqueue_workflow(db, workflow)
    step_job = succeed(db, A)

    result = rl.retry_jobs(db, rl.JobFilter(meta=ACME), reason="provider back")

    assert (result.matched, result.changed) == (4, 3)
    assert result.skipped == {"job.workflow_requeue_not_supported": 1}
    for job in [*dead, done]:
        record = rl.get_job(db, job.id)
        assert (record.status, record.run_number, record.status_reason) == (rl.JobStatus.PENDING, 2, "provider back")
        assert events(db, job.id)[-1][0] == "REQUEUED"
    assert rl.get_job(db, waiting.id).run_number == 1
    assert (status_of(db, step_job), statuses(db, run.id)["a"]) == (
        rl.JobStatus.SUCCEEDED, rl.WorkflowStepStatus.SUCCEEDED)
    assert rl.list_operations(db)[0].skipped == {"job.workflow_requeue_not_supported": 1}


def test_retry_jobs_by_error_code_and_type_takes_only_those_dead_letters(db):
    dead = dead_lettered(db)
    canceled_job = rl.cancel_job(db, pending(db).id)

    assert rl.retry_jobs(db, rl.JobFilter(error_code="other.code"), reason="x").changed == 0
    result = rl.retry_jobs(db, rl.JobFilter(error_code="smtp.rejected", statuses=["DEAD_LETTERED"]), reason="x")

    assert (result.matched, result.changed) == (1, 1)
    assert status_of(db, dead) is rl.JobStatus.PENDING
    assert status_of(db, canceled_job) is rl.JobStatus.CANCELED


def test_a_job_retried_that_finishes_again_is_not_retried_twice(db):
    job = succeeded(db, meta=ACME)
    operation = rl.retry_jobs(db, rl.JobFilter(meta=ACME), reason="once")
    assert operation.changed == 1
    # Run 2 ends; a resumed or later pass of the same operation must not take it again.
    rl.cancel_job(db, job.id)
    plan = bulk._Plan.of("retry", rl.JobFilter(meta=ACME), "once")
    started_at = rl.list_operations(db)[0].started_at
    with db.begin() as connection:
        assert plan.run_batch(connection, operation.operation_id, rl.JobStatus.CANCELED, started_at, None, 2) is None
    assert rl.get_job(db, job.id).run_number == 2


def test_delete_jobs_deletes_finished_jobs_with_their_rows_and_leaves_the_rest(db):
    dead = dead_lettered(db, job_type=REPORT)
    done = succeeded(db, job_type=REPORT)
    waiting = pending(db, job_type=REPORT)
    running = leased(db, job_type=REPORT)

    result = rl.delete_jobs(db, rl.JobFilter(job_types=[REPORT]), reason="cleanup", actor="bob")

    assert (result.matched, result.changed) == (2, 2)
    for job in (dead, done):
        assert rl.get_job(db, job.id) is None
        for table in ("job_attempts", "job_events", "job_dead_letters"):
            assert scalar(db, f"SELECT count(*) FROM {table} WHERE job_id = :id", id=job.id) == 0
    assert (status_of(db, waiting), status_of(db, running)) == (rl.JobStatus.PENDING, rl.JobStatus.LEASED)


def test_delete_jobs_leaves_a_workflows_job_to_its_run(db):
    rl.enqueue_workflow(db, chain("on_terminal"))
    step_job = succeed(db, A)

    result = rl.delete_jobs(db, rl.JobFilter(job_types=[A]), reason="cleanup")

    assert (result.matched, result.changed, result.skipped) == (1, 0, {"job.workflow_delete_not_supported": 1})
    assert status_of(db, step_job) is rl.JobStatus.SUCCEEDED


def test_update_jobs_moves_pending_jobs_and_counts_only_the_ones_it_changed(db):
    soon = datetime.now(timezone.utc) + timedelta(hours=1)
    jobs = [pending(db, meta=ACME) for _ in range(3)]
    already = pending(db, meta=ACME, priority=500)
    running = leased(db, meta=ACME)

    result = rl.update_jobs(db, rl.JobFilter(meta=ACME), reason="month end", priority=500, run_at=soon)

    assert (result.matched, result.changed) == (4, 4)
    for job in [*jobs, already]:
        record = rl.get_job(db, job.id)
        assert (record.priority, record.next_run_at) == (500, soon)
    assert rl.get_job(db, running.id).priority == running.priority
    again = rl.update_jobs(db, rl.JobFilter(meta=ACME), reason="month end", priority=500)
    assert (again.matched, again.changed) == (4, 0)
    assert rl.list_operations(db)[0].changes == {"priority": 500}


def test_created_after_and_before_bound_what_an_action_takes(db):
    old = pending(db)
    middle = scalar(db, "SELECT clock_timestamp()")
    new = pending(db)

    assert rl.cancel_jobs(db, rl.JobFilter(created_before=middle), reason="old").changed == 1
    assert (status_of(db, old), status_of(db, new)) == (rl.JobStatus.CANCELED, rl.JobStatus.PENDING)
    assert rl.cancel_jobs(db, rl.JobFilter(created_after=middle), reason="new").changed == 1


# -- refused --------------------------------------------------------------------------------


ACTIONS = [rl.cancel_jobs, rl.retry_jobs, rl.delete_jobs,
           lambda db, f, **kw: rl.update_jobs(db, f, priority=1, **kw)]


@pytest.mark.parametrize("action", ACTIONS, ids=["cancel", "retry", "delete", "update"])
def test_an_empty_filter_is_refused_by_every_action_and_nothing_changes(db, action):
    pending(db)
    succeeded(db)
    before = snapshot(db)

    with pytest.raises(EmptyJobFilter) as caught:
        action(db, rl.JobFilter(), reason="everything")

    assert caught.value.code == "job.empty_filter"
    assert snapshot(db) == before
    assert operations_count(db) == 0


@pytest.mark.parametrize("make, code", [
    (lambda: rl.JobFilter(statuses=["RUNNING"]), "job.invalid_filter"),
    (lambda: rl.JobFilter(statuses=[]), "job.invalid_filter"),
    (lambda: rl.JobFilter(job_types="one.type"), "job.invalid_filter"),
    (lambda: rl.JobFilter(job_types=["  "]), "job.invalid_filter"),
    (lambda: rl.JobFilter(meta={}), "job.invalid_filter"),
    (lambda: rl.JobFilter(meta={"tenant": 7}), "job.invalid_meta"),
    (lambda: rl.JobFilter(meta=["tenant"]), "job.invalid_meta"),
    (lambda: rl.JobFilter(created_after=datetime(2026, 1, 1)), "job.invalid_filter"),
    (lambda: rl.JobFilter(created_after=datetime(2026, 2, 1, tzinfo=timezone.utc),
                          created_before=datetime(2026, 1, 1, tzinfo=timezone.utc)), "job.invalid_filter"),
    (lambda: rl.JobFilter(organization_id=""), "job.invalid_filter"),
])
def test_a_malformed_filter_is_refused_when_it_is_made(make, code):
    with pytest.raises(rl.ValidationError) as caught:
        make()
    assert caught.value.code == code


@pytest.mark.parametrize("call, error", [
    (lambda db: rl.cancel_jobs(db, rl.JobFilter(statuses=["SUCCEEDED"]), reason="x"), InvalidJobFilter),
    (lambda db: rl.retry_jobs(db, rl.JobFilter(statuses=["PENDING", "DEAD_LETTERED"]), reason="x"), InvalidJobFilter),
    (lambda db: rl.delete_jobs(db, rl.JobFilter(statuses=["LEASED"]), reason="x"), InvalidJobFilter),
    (lambda db: rl.cancel_jobs(db, {"meta": ACME}, reason="x"), InvalidJobFilter),
    (lambda db: rl.cancel_jobs(db, rl.JobFilter(meta=ACME), reason="  "), rl.InvalidArgument),
    (lambda db: rl.cancel_jobs(db, rl.JobFilter(meta=ACME), reason="x", actor=""), rl.InvalidArgument),
    (lambda db: rl.update_jobs(db, rl.JobFilter(meta=ACME), reason="x"), InvalidJobUpdate),
    (lambda db: rl.update_jobs(db, rl.JobFilter(meta=ACME), reason="x", priority=10**7), InvalidJobUpdate),
    (lambda db: rl.update_jobs(db, rl.JobFilter(meta=ACME), reason="x", priority=True), InvalidJobUpdate),
    (lambda db: rl.update_jobs(db, rl.JobFilter(meta=ACME), reason="x", run_at=datetime(2030, 1, 1)), InvalidJobUpdate),
])
def test_a_refused_action_changes_and_records_nothing(db, call, error):
    pending(db, meta=ACME)
    succeeded(db, meta=ACME)
    before = snapshot(db)

    with pytest.raises(error):
        call(db)

    assert snapshot(db) == before
    assert operations_count(db) == 0


# -- the audit trail and resuming -----------------------------------------------------------


def test_list_operations_lists_every_action_newest_first_with_its_actor(db):
    pending(db, meta=ACME)
    succeeded(db, meta=ACME)
    rl.update_jobs(db, rl.JobFilter(meta=ACME), reason="one", priority=3, actor="carol")
    rl.retry_jobs(db, rl.JobFilter(meta=ACME), reason="two")
    rl.cancel_jobs(db, rl.JobFilter(meta=ACME), reason="three", actor="dave")

    listed = rl.list_operations(db)

    assert [(op.action, op.reason) for op in listed] == [("cancel", "three"), ("retry", "two"), ("update", "one")]
    assert [op.actor for op in listed] == ["dave", bulk.default_actor(), "carol"]
    assert "@" in bulk.default_actor()
    assert len(rl.list_operations(db, limit=1)) == 1


class _Killed(BaseException):
    """Stands for the process dying between two batches: nothing of ours catches it."""


def test_an_interrupted_operation_stays_running_with_its_cursor_and_resumes_from_there(db, monkeypatch):
    monkeypatch.setattr(bulk, "BATCH_SIZE", 4)
    rl.enqueue_many(db, [rl.JobSpec(EMAIL, {"n": n}, meta=ACME) for n in range(10)])
    batches = []
    real = bulk._Plan.run_batch

    def dies_after_two(self, connection, **kwargs):
        if len(batches) == 2:
            raise _Killed()
        batches.append(kwargs)
        return real(self, connection, **kwargs)

    monkeypatch.setattr(bulk._Plan, "run_batch", dies_after_two)
    with pytest.raises(_Killed):
        rl.cancel_jobs(db, rl.JobFilter(meta=ACME), reason="half")
    monkeypatch.setattr(bulk._Plan, "run_batch", real)

    [stopped] = rl.list_operations(db)
    assert (stopped.status, stopped.changed, stopped.finished_at) == ("RUNNING", 8, None)
    assert stopped.cursor["status"] == "PENDING"
    # A job enqueued after the operation began is not its to cancel.
    late = pending(db, meta=ACME)

    result = rl.resume_operation(db, stopped.id)

    assert (result.matched, result.changed) == (10, 10)
    [finished] = rl.list_operations(db)
    assert (finished.status, finished.changed) == ("SUCCEEDED", 10)
    assert status_of(db, late) is rl.JobStatus.PENDING
    with pytest.raises(rl.InvalidArgument):
        rl.resume_operation(db, stopped.id)


def test_a_failed_batch_marks_the_operation_failed_with_the_code(db, monkeypatch):
    pending(db, meta=ACME)

    def refused(self, connection, **kwargs):
        raise rl.errors.WorkflowReleaseConflict("a run is being cancelled")

    monkeypatch.setattr(bulk._Plan, "run_batch", refused)
    with pytest.raises(rl.errors.WorkflowReleaseConflict):
        rl.cancel_jobs(db, rl.JobFilter(meta=ACME), reason="x")

    [operation] = rl.list_operations(db)
    assert (operation.status, operation.error_code) == ("FAILED", "workflow.release_conflict")


# -- metadata search ------------------------------------------------------------------------


def test_list_jobs_by_meta_finds_the_jobs_whose_metadata_contains_it(db):
    acme = [pending(db, meta={**ACME, "order": str(n)}) for n in range(3)]
    pending(db, meta={"tenant": "globex"})
    pending(db)

    assert {job.id for job in rl.list_jobs(db, meta=ACME)} == {job.id for job in acme}
    assert [job.id for job in rl.list_jobs(db, meta={"tenant": "acme", "order": "1"})] == [acme[1].id]
    assert rl.list_jobs(db, meta={"tenant": "acme", "order": "9"}) == []
    with pytest.raises(InvalidMeta):
        rl.list_jobs(db, meta={"tenant": 1})
