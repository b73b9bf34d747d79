"""Batches: members added while OPEN, counts kept on the batch row, callbacks enqueued exactly once."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.core.batch import BatchStatus
from runledger_sync.core.batch_errors import BatchClosed, BatchFinished, BatchNotFound, InvalidBatchCallback
from runledger_sync.core.coordination import Debounce, Unique
from runledger_sync.core.coordination_errors import InvalidCoordination
from runledger_sync.core.errors import DefinitionNotFoundOrDisabled, InvalidArgument
from runledger_sync.core.records import JobSpec
from runledger_sync.core.types import JobFailure
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success
from runledger_sync.store.batches.batches import (
    cancel_batch,
    close_batch,
    get_batch,
    list_batch_members,
    list_batches,
    open_batch,
)
from runledger_sync.store.enqueue.enqueue import enqueue, enqueue_many, enqueue_many_ids
from runledger_sync.store.admin.actions import cancel_job, requeue_job
from runledger_sync.store.maintenance.reaper import reap_expired_leases
from tests.support import JOB_TYPE, claim_one, define, expire_lease, identity, rows, scalar, wait_until

REPORT = "test.report"
DONE = "test.done"


@pytest.fixture
def defined(engine):
    define(engine)
    define(engine, REPORT)
    define(engine, DONE)
    return engine


def counts(batch) -> tuple[int, int, int, int, int]:
    return batch.total, batch.pending, batch.succeeded, batch.failed, batch.canceled


def callbacks(engine, job_type: str) -> list:
    return rows(engine, "SELECT id, payload, meta FROM job_queue WHERE job_type = :t", t=job_type)


def succeed_one(engine):
    job = claim_one(engine)
    complete_job_success(engine, **identity(job))
    return job


def dead_letter_one(engine):
    job = claim_one(engine)
    complete_job_failure(engine, **identity(job), failure=JobFailure.terminal("test.boom", "boom"), retry_delay_ms=None)
    return job


# -- opening, adding, closing ---------------------------------------------------------------


def test_a_batch_opens_empty_and_counts_each_member_added(defined):
    batch = open_batch(defined, on_success=(REPORT, {"to": "ops"}), meta={"tenant": "acme"})
    assert batch.status is BatchStatus.OPEN and counts(batch) == (0, 0, 0, 0, 0)

    one = enqueue(defined, JOB_TYPE, {"n": 1}, batch=batch.id)
    enqueue_many(defined, [JobSpec(JOB_TYPE, {"n": n}, batch=batch.id) for n in range(2, 5)])
    enqueue_many_ids(defined, [JobSpec(JOB_TYPE, {"n": 5}, batch=str(batch.id)), JobSpec(JOB_TYPE, {"n": 6})])

    assert one.batch_id == batch.id
    assert counts(get_batch(defined, batch.id)) == (5, 5, 0, 0, 0)
    assert [job.payload["n"] for job in list_batch_members(defined, batch.id)] == [1, 2, 3, 4, 5]


def test_a_repeat_that_adds_no_job_adds_no_member(defined):
    batch = open_batch(defined)
    enqueue(defined, JOB_TYPE, {"n": 1}, batch=batch.id, idempotency_key="k")
    enqueue(defined, JOB_TYPE, {"n": 1}, batch=batch.id, idempotency_key="k")
    enqueue(defined, JOB_TYPE, {"n": 2}, batch=batch.id, unique=Unique())
    enqueue(defined, JOB_TYPE, {"n": 2}, batch=batch.id, unique=Unique())
    assert get_batch(defined, batch.id).total == 2


@pytest.mark.parametrize("finish", ["close", "cancel", "finish"])
def test_adding_to_a_batch_that_is_not_open_is_refused_and_writes_nothing(defined, finish):
    batch = open_batch(defined)
    if finish == "cancel":
        cancel_batch(defined, batch.id)
    else:
        if finish == "finish":
            enqueue(defined, JOB_TYPE, batch=batch.id)
        close_batch(defined, batch.id)
        if finish == "finish":
            succeed_one(defined)
    before = scalar(defined, "SELECT count(*) FROM job_queue")
    with pytest.raises(BatchClosed) as raised:
        enqueue(defined, JOB_TYPE, {"late": True}, batch=batch.id)
    assert raised.value.code == "batch.closed"
    with pytest.raises(BatchClosed):
        enqueue_many(defined, [JobSpec(JOB_TYPE), JobSpec(JOB_TYPE, batch=batch.id)])
    assert scalar(defined, "SELECT count(*) FROM job_queue") == before
    assert get_batch(defined, batch.id).total == (1 if finish == "finish" else 0)


def test_an_unknown_batch_is_refused_inside_the_callers_transaction_which_stays_usable(defined):
    with defined.begin() as conn:
        with pytest.raises(BatchNotFound) as raised:
            enqueue(conn, JOB_TYPE, batch="0190aaaa-0000-7000-8000-000000000000")
        assert raised.value.code == "batch.not_found"
        enqueue(conn, JOB_TYPE, {"after": "refusal"})
    assert scalar(defined, "SELECT count(*) FROM job_queue") == 1
    with pytest.raises(InvalidArgument):
        enqueue(defined, JOB_TYPE, batch="not-a-uuid")


def test_members_join_the_callers_transaction_and_a_rollback_leaves_the_counts(defined):
    batch = open_batch(defined)
    with defined.connect() as conn:
        with conn.begin() as tx:
            enqueue(conn, JOB_TYPE, batch=batch.id)
            enqueue(conn, JOB_TYPE, batch=batch.id)
            tx.rollback()
    assert get_batch(defined, batch.id).total == 0
    with defined.begin() as conn:
        opened = open_batch(conn)
        enqueue(conn, JOB_TYPE, batch=opened.id)
        close_batch(conn, opened.id)
    assert counts(get_batch(defined, opened.id)) == (1, 1, 0, 0, 0)


def test_a_debounce_cannot_join_a_batch(defined):
    batch = open_batch(defined)
    from datetime import timedelta
    with pytest.raises(InvalidCoordination):
        enqueue(defined, JOB_TYPE, batch=batch.id, debounce=Debounce("k", timedelta(seconds=1), timedelta(seconds=2)))


def test_callbacks_are_checked_when_the_batch_opens(defined):
    for bad in ("report", (REPORT,), (REPORT, [1, 2]), (REPORT, {"batch_id": "mine"})):
        with pytest.raises(InvalidBatchCallback):
            open_batch(defined, on_success=bad)
    with pytest.raises(DefinitionNotFoundOrDisabled):
        open_batch(defined, on_complete=("no.such.type", {}))
    assert scalar(defined, "SELECT count(*) FROM job_batches") == 0


def test_closing_twice_or_an_unknown_batch_is_a_coded_error(defined):
    batch = open_batch(defined)
    enqueue(defined, JOB_TYPE, batch=batch.id)
    assert close_batch(defined, batch.id).status is BatchStatus.CLOSED
    with pytest.raises(BatchClosed):
        close_batch(defined, batch.id)
    with pytest.raises(BatchNotFound):
        close_batch(defined, "0190aaaa-0000-7000-8000-000000000000")
    assert get_batch(defined, "0190aaaa-0000-7000-8000-000000000000") is None


# -- finishing and callbacks --------------------------------------------------------------


def test_the_last_member_of_a_closed_batch_enqueues_both_callbacks_with_the_batch_id(defined):
    batch = open_batch(defined, on_success=(REPORT, {"to": "ops"}), on_complete=(DONE, {}), meta={"tenant": "acme"})
    for n in range(3):
        enqueue(defined, JOB_TYPE, {"n": n}, batch=batch.id)
    close_batch(defined, batch.id)
    succeed_one(defined)
    succeed_one(defined)
    assert get_batch(defined, batch.id).status is BatchStatus.CLOSED
    assert callbacks(defined, REPORT) == []
    succeed_one(defined)

    done = get_batch(defined, batch.id)
    assert done.status is BatchStatus.SUCCEEDED and counts(done) == (3, 0, 3, 0, 0)
    assert done.finished_at is not None
    [report] = callbacks(defined, REPORT)
    [complete] = callbacks(defined, DONE)
    assert report.payload == {"to": "ops", "batch_id": str(batch.id)} and report.meta == {"tenant": "acme"}
    assert complete.payload == {"batch_id": str(batch.id)}
    assert (done.on_success_job_id, done.on_complete_job_id) == (report.id, complete.id)


def test_a_failed_member_skips_on_success_and_still_enqueues_on_complete(defined):
    batch = open_batch(defined, on_success=(REPORT, {}), on_complete=(DONE, {}))
    enqueue(defined, JOB_TYPE, batch=batch.id)
    enqueue(defined, JOB_TYPE, batch=batch.id)
    close_batch(defined, batch.id)
    dead_letter_one(defined)
    succeed_one(defined)

    done = get_batch(defined, batch.id)
    assert done.status is BatchStatus.COMPLETED_WITH_ERRORS and counts(done) == (2, 0, 1, 1, 0)
    assert callbacks(defined, REPORT) == [] and len(callbacks(defined, DONE)) == 1
    assert done.on_success_job_id is None and done.on_complete_job_id is not None


def test_closing_a_batch_whose_members_all_ended_finishes_it_in_the_close(defined):
    batch = open_batch(defined, on_success=(REPORT, {}))
    enqueue(defined, JOB_TYPE, batch=batch.id)
    succeed_one(defined)
    assert get_batch(defined, batch.id).status is BatchStatus.OPEN and callbacks(defined, REPORT) == []

    closed = close_batch(defined, batch.id)
    assert closed.status is BatchStatus.SUCCEEDED and len(callbacks(defined, REPORT)) == 1


def test_an_empty_batch_closed_is_finished_at_once(defined):
    batch = open_batch(defined, on_success=(REPORT, {}), on_complete=(DONE, {}))
    assert close_batch(defined, batch.id).status is BatchStatus.SUCCEEDED
    assert len(callbacks(defined, REPORT)) == 1 and len(callbacks(defined, DONE)) == 1


def test_a_close_rolled_back_enqueues_nothing(defined):
    batch = open_batch(defined, on_complete=(DONE, {}))
    with defined.connect() as conn:
        with conn.begin() as tx:
            assert close_batch(conn, batch.id).status is BatchStatus.SUCCEEDED
            tx.rollback()
    assert get_batch(defined, batch.id).status is BatchStatus.OPEN and callbacks(defined, DONE) == []


def test_a_member_may_add_members_while_the_batch_is_open(defined):
    batch = open_batch(defined, on_complete=(DONE, {}))
    enqueue(defined, JOB_TYPE, {"depth": 0}, batch=batch.id)
    parent = claim_one(defined)
    # What a handler does with ctx.batch_id: more members, in the outcome's transaction.
    with defined.begin() as conn:
        enqueue(conn, JOB_TYPE, {"depth": 1}, batch=parent.batch_id)
        complete_job_success(conn, **identity(parent))
    close_batch(defined, batch.id)
    assert counts(get_batch(defined, batch.id)) == (2, 1, 1, 0, 0) and callbacks(defined, DONE) == []
    succeed_one(defined)
    assert get_batch(defined, batch.id).status is BatchStatus.SUCCEEDED and len(callbacks(defined, DONE)) == 1


# -- every path that ends a member counts ---------------------------------------------------


def test_a_retry_keeps_a_member_pending_and_the_reaper_dead_letter_counts_as_failed(defined):
    batch = open_batch(defined, on_complete=(DONE, {}))
    enqueue(defined, JOB_TYPE, batch=batch.id, max_attempts=2)
    close_batch(defined, batch.id)
    job = claim_one(defined)
    complete_job_failure(defined, **identity(job), failure=JobFailure.retryable("test.again", "again"), retry_delay_ms=0)
    assert counts(get_batch(defined, batch.id)) == (1, 1, 0, 0, 0)

    job = claim_one(defined, prestart=False)  # started: its lost lease spends the attempt
    expire_lease(defined, job.id)
    reap_expired_leases(defined, limit=10, default_retry_delay_ms=1000)
    assert scalar(defined, "SELECT status FROM job_queue WHERE id = :id", id=job.id) == "DEAD_LETTERED"
    done = get_batch(defined, batch.id)
    assert done.status is BatchStatus.COMPLETED_WITH_ERRORS and counts(done) == (1, 0, 0, 1, 0)
    assert len(callbacks(defined, DONE)) == 1


def test_an_operator_cancel_of_the_last_member_finishes_the_batch_with_errors(defined):
    batch = open_batch(defined, on_success=(REPORT, {}), on_complete=(DONE, {}))
    job = enqueue(defined, JOB_TYPE, batch=batch.id)
    close_batch(defined, batch.id)
    cancel_job(defined, job.id, reason="not needed")
    done = get_batch(defined, batch.id)
    assert done.status is BatchStatus.COMPLETED_WITH_ERRORS and counts(done) == (1, 0, 0, 0, 1)
    assert callbacks(defined, REPORT) == [] and len(callbacks(defined, DONE)) == 1


def test_a_requeued_member_is_pending_again_and_a_finished_batch_stays_finished_without_new_callbacks(defined):
    batch = open_batch(defined, on_complete=(DONE, {}))
    enqueue(defined, JOB_TYPE, batch=batch.id)
    close_batch(defined, batch.id)
    job = dead_letter_one(defined)
    assert get_batch(defined, batch.id).status is BatchStatus.COMPLETED_WITH_ERRORS

    requeue_job(defined, job.id)
    assert counts(get_batch(defined, batch.id)) == (1, 1, 0, 0, 0)
    succeed_one(defined)
    again = get_batch(defined, batch.id)
    assert again.status is BatchStatus.COMPLETED_WITH_ERRORS and counts(again) == (1, 0, 1, 0, 0)
    assert len(callbacks(defined, DONE)) == 1


def test_a_requeue_before_the_close_is_counted_and_the_batch_finishes_on_its_new_end(defined):
    batch = open_batch(defined, on_success=(REPORT, {}))
    enqueue(defined, JOB_TYPE, batch=batch.id)
    job = dead_letter_one(defined)
    requeue_job(defined, job.id)
    close_batch(defined, batch.id)
    succeed_one(defined)
    done = get_batch(defined, batch.id)
    assert done.status is BatchStatus.SUCCEEDED and counts(done) == (1, 0, 1, 0, 0)
    assert len(callbacks(defined, REPORT)) == 1


def test_a_plain_job_never_touches_a_batch_row(defined):
    batch = open_batch(defined)
    enqueue(defined, JOB_TYPE)
    succeed_one(defined)
    assert scalar(defined, "SELECT updated_at = created_at FROM job_batches WHERE id = :id", id=batch.id)


# -- cancel -----------------------------------------------------------------------------------


def test_cancel_batch_cancels_pending_and_leased_members_and_enqueues_no_callback(defined):
    batch = open_batch(defined, on_success=(REPORT, {}), on_complete=(DONE, {}))
    enqueue(defined, JOB_TYPE, batch=batch.id)
    enqueue(defined, JOB_TYPE, batch=batch.id)
    enqueue(defined, JOB_TYPE, batch=batch.id)
    succeed_one(defined)
    leased = claim_one(defined)
    close_batch(defined, batch.id)

    canceled = cancel_batch(defined, batch.id, reason="stop")
    assert canceled.status is BatchStatus.CANCELED and canceled.status_reason == "stop"
    assert counts(canceled) == (3, 0, 1, 0, 2)
    assert scalar(defined, "SELECT status_reason FROM job_queue WHERE id = :id", id=leased.id) == "stop"
    with pytest.raises(rl.LeaseOwnerMismatch):
        complete_job_success(defined, **identity(leased))
    assert callbacks(defined, REPORT) == [] and callbacks(defined, DONE) == []
    # Again: nothing left to cancel, still CANCELED; a finished batch cannot be canceled.
    assert cancel_batch(defined, batch.id).status is BatchStatus.CANCELED
    finished = open_batch(defined)
    close_batch(defined, finished.id)
    with pytest.raises(BatchFinished):
        cancel_batch(defined, finished.id)
    with pytest.raises(BatchNotFound):
        cancel_batch(defined, "0190aaaa-0000-7000-8000-000000000000")


def test_list_batches_newest_first_by_status_and_paged(defined):
    first = open_batch(defined)
    second = open_batch(defined)
    close_batch(defined, first.id)
    assert [b.id for b in list_batches(defined)] == [second.id, first.id]
    assert [b.id for b in list_batches(defined, status="SUCCEEDED")] == [first.id]
    assert [b.id for b in list_batches(defined, before=list_batches(defined, limit=1)[0])] == [first.id]
    with pytest.raises(InvalidArgument):
        list_batches(defined, status="DONE")


# -- exactly once under concurrency -------------------------------------------------------------


def test_many_members_ending_at_once_from_threads_finish_the_batch_once_with_exact_counts(defined):
    members = 64
    batch = open_batch(defined, on_success=(REPORT, {}), on_complete=(DONE, {}))
    enqueue_many(defined, [JobSpec(JOB_TYPE, {"n": n}, batch=batch.id) for n in range(members)])
    close_batch(defined, batch.id)
    leases = [claim_one(defined, worker_id=f"w{n}") for n in range(members)]
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def end(part):
        try:
            start.wait()
            for n, job in part:
                if n % 8 == 0:
                    complete_job_failure(defined, **identity(job), failure=JobFailure.terminal("test.boom", "x"), retry_delay_ms=None)
                else:
                    complete_job_success(defined, **identity(job))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    parts = [[(n, job) for n, job in enumerate(leases) if n % 8 == t] for t in range(8)]
    threads = [threading.Thread(target=end, args=(part,)) for part in parts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    done = get_batch(defined, batch.id)
    assert done.status is BatchStatus.COMPLETED_WITH_ERRORS
    assert counts(done) == (members, 0, members - 8, 8, 0)
    assert callbacks(defined, REPORT) == [] and len(callbacks(defined, DONE)) == 1


@pytest.mark.parametrize("close_first", [True, False])
def test_a_close_racing_the_last_members_end_enqueues_the_callbacks_once(defined, close_first):
    for _ in range(5):
        batch = open_batch(defined, on_complete=(DONE, {"round": str(_)}))
        enqueue(defined, JOB_TYPE, batch=batch.id)
        job = claim_one(defined)
        go = threading.Barrier(2)

        def close(go=go, batch=batch):
            go.wait()
            close_batch(defined, batch.id)

        def end(go=go, job=job):
            go.wait()
            complete_job_success(defined, **identity(job))

        threads = [threading.Thread(target=f) for f in ((close, end) if close_first else (end, close))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert get_batch(defined, batch.id).status is BatchStatus.SUCCEEDED
    assert len(callbacks(defined, DONE)) == 5
    assert {row.payload["round"] for row in callbacks(defined, DONE)} == {"0", "1", "2", "3", "4"}


def test_a_member_write_past_the_check_is_refused_by_the_trigger(defined):
    batch = open_batch(defined)
    close_batch(defined, batch.id)
    with pytest.raises(Exception) as raised:
        with defined.begin() as conn:
            conn.execute(text(
                "INSERT INTO job_queue (id, job_type, max_attempts, batch_id) "
                "VALUES (gen_random_uuid(), :t, 1, :b)"), {"t": JOB_TYPE, "b": batch.id})
    assert "takes no more members" in str(raised.value)
    assert wait_until(lambda: get_batch(defined, batch.id).total == 0)


# -- retention -----------------------------------------------------------------------------------


def age_batch(engine, batch_id, days: int) -> None:
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_batches SET finished_at = finished_at - make_interval(days => :d) WHERE id = :id"),
                     {"d": days, "id": batch_id})


def test_prune_deletes_an_old_finished_batch_with_its_members_and_keeps_the_others(defined):
    keep_ages = dict(succeeded=None, canceled=None, dead_lettered=None, workflow_runs=None, dashboard_rollup=None)
    old = open_batch(defined)
    enqueue(defined, JOB_TYPE, batch=old.id)
    close_batch(defined, old.id)
    succeed_one(defined)
    young = open_batch(defined)
    close_batch(defined, young.id)
    still_open = open_batch(defined)
    enqueue(defined, JOB_TYPE, batch=still_open.id)
    requeued = open_batch(defined)
    member = enqueue(defined, JOB_TYPE, batch=requeued.id)
    close_batch(defined, requeued.id)
    cancel_job(defined, member.id)
    requeue_job(defined, member.id)  # a live member keeps its finished batch
    for batch in (old, requeued):
        age_batch(defined, batch.id, 40)

    dry = rl.prune(defined, rl.Retention(**keep_ages), dry_run=True)
    assert (dry.job_batches, dry.jobs) == (1, {"SUCCEEDED": 1})
    result = rl.prune(defined, rl.Retention(**keep_ages))
    assert (result.job_batches, result.jobs) == (1, {"SUCCEEDED": 1})
    assert get_batch(defined, old.id) is None
    assert {b.id for b in list_batches(defined)} == {young.id, still_open.id, requeued.id}
    assert scalar(defined, "SELECT count(*) FROM job_queue") == 2
    assert rl.prune(defined, rl.Retention(**keep_ages)).job_batches == 0


def test_members_pruned_by_their_own_age_leave_the_batch_counts_as_they_were(defined):
    batch = open_batch(defined)
    enqueue(defined, JOB_TYPE, batch=batch.id)
    close_batch(defined, batch.id)
    job = succeed_one(defined)
    with defined.begin() as conn:
        conn.execute(text("UPDATE job_queue SET finished_at = now() - interval '10 days' WHERE id = :id"), {"id": job.id})
    assert rl.prune(defined, rl.Retention(job_batches=None)).jobs == {"SUCCEEDED": 1}
    assert counts(get_batch(defined, batch.id)) == (1, 0, 1, 0, 0)
