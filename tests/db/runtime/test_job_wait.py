"""wait_for_job: returns the row once the job ends (woken by the end's notification), times out with its code."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from uuid import UUID

import pytest

import runledger_sync as rl
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.types import JobFailure
from runledger_sync.db.engine import create_engine
from runledger_sync.runtime import job_wait
from runledger_sync.store import notify
from runledger_sync.store import driver
from runledger_sync.store.attempt.ends import complete_job_failure
from runledger_sync.store.claim.claim import claim_prestart_jobs_for_types
from tests.support import write_successes
from tests.support import JOB_TYPE, claim_one, define, rows, terminate_backend, wait_until

#: A ceiling far above the notification's delivery, far below the periodic look made long here.
END_TO_RETURN_CEILING_SECONDS = 5.0


class Waiter:
    """wait_for_job on a thread of its own; keeps what it returned or raised, and when (wall clock)."""

    def __init__(self, engine, job_id, timeout: float = 30.0) -> None:
        self.result: rl.JobRecord | None = None
        self.error: BaseException | None = None
        self.returned_at: datetime | None = None
        self.thread = threading.Thread(target=self._run, args=(engine, job_id, timeout), daemon=True)
        self.thread.start()

    def _run(self, engine, job_id, timeout) -> None:
        try:
            self.result = rl.wait_for_job(engine, job_id, timeout=timeout)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            self.error = error
        self.returned_at = datetime.now(timezone.utc)

    def join(self) -> rl.JobRecord:
        self.thread.join(30)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def ended_listener_pids(engine) -> list[int]:
    return [row.pid for row in rows(
        engine, "SELECT pid FROM pg_stat_activity WHERE application_name = :name AND query = :query"
                " AND datname = current_database()",
        name=notify.LISTENER_APPLICATION_NAME, query=f"LISTEN {notify.ENDED_CHANNEL}")]


def ended_listeners(engine) -> int:
    return len(ended_listener_pids(engine))


@pytest.fixture
def no_periodic_look(monkeypatch):
    # Only the notification can then wake the waiter within the ceiling.
    monkeypatch.setattr(job_wait, "LISTENING_POLL_SECONDS", 120.0)


def test_a_finished_job_is_returned_at_once(engine):
    define(engine)
    job = rl.enqueue(engine, JOB_TYPE, {})
    rl.cancel_job(engine, job.id)
    done = rl.wait_for_job(engine, job.id, timeout=0)
    assert (done.id, done.status) == (job.id, rl.JobStatus.CANCELED)


def test_waiter_returns_after_the_success_is_written_woken_by_its_notification(engine, no_periodic_look):
    define(engine)
    job = rl.enqueue(engine, JOB_TYPE, {})
    waiter = Waiter(engine, job.id)
    wait_until(lambda: ended_listeners(engine) == 1, what="the waiter's LISTEN")
    claimed = claim_one(engine)
    [written] = write_successes(engine, [(LeaseIdentity.of(claimed), rl.JobCompletion(output={"n": 1}))])
    assert written is None
    done = waiter.join()
    assert (done.status, done.output) == (rl.JobStatus.SUCCEEDED, {"n": 1})
    assert done.finished_at <= waiter.returned_at
    assert (waiter.returned_at - done.finished_at).total_seconds() < END_TO_RETURN_CEILING_SECONDS
    assert ended_listeners(engine) == 0  # its LISTEN connection is closed


def test_a_dead_letter_ends_the_wait_and_a_retry_does_not(engine, no_periodic_look):
    define(engine, max_attempts=2)
    job = rl.enqueue(engine, JOB_TYPE, {})
    waiter = Waiter(engine, job.id)
    wait_until(lambda: ended_listeners(engine) == 1, what="the waiter's LISTEN")
    complete_job_failure(engine, **LeaseIdentity.of(claim_one(engine)).keywords(),
                                   failure=JobFailure.retryable("api.busy", "429"), retry_delay_ms=1)
    assert rl.get_job(engine, job.id).status is rl.JobStatus.PENDING
    assert waiter.thread.is_alive()
    [claimed] = wait_until(lambda: claim_prestart_jobs_for_types(
        engine, worker_id="worker-a", lease_ttl_seconds=30, limit=1, job_types=[JOB_TYPE]), what="the retry claimed")
    complete_job_failure(engine, **LeaseIdentity.of(claimed).keywords(),
                                   failure=JobFailure.terminal("bad.input", "no"), retry_delay_ms=None)
    done = waiter.join()
    assert (done.status, done.last_error_code, done.attempt) == (rl.JobStatus.DEAD_LETTERED, "bad.input", 2)
    assert done.finished_at <= waiter.returned_at


def test_an_operator_cancel_ends_the_wait(engine, no_periodic_look):
    define(engine)
    job = rl.enqueue(engine, JOB_TYPE, {})
    waiter = Waiter(engine, job.id)
    wait_until(lambda: ended_listeners(engine) == 1, what="the waiter's LISTEN")
    rl.cancel_job(engine, job.id, reason="not needed")
    done = waiter.join()
    assert (done.status, done.status_reason) == (rl.JobStatus.CANCELED, "not needed")
    assert (waiter.returned_at - done.finished_at).total_seconds() < END_TO_RETURN_CEILING_SECONDS


def test_a_workflow_runs_cancel_ends_the_wait_of_its_pending_job(engine, no_periodic_look):
    define(engine)
    workflow = rl.Workflow("one-step")
    workflow.job("only", JOB_TYPE, {})
    run = rl.enqueue_workflow(engine, workflow)
    [job] = rl.list_jobs(engine, job_type=JOB_TYPE)
    waiter = Waiter(engine, job.id)
    wait_until(lambda: ended_listeners(engine) == 1, what="the waiter's LISTEN")
    rl.cancel_workflow_run(engine, run.id)
    done = waiter.join()
    assert done.status is rl.JobStatus.CANCELED
    assert (waiter.returned_at - done.finished_at).total_seconds() < END_TO_RETURN_CEILING_SECONDS


def test_a_lost_listener_falls_back_to_polling(engine, no_periodic_look):
    define(engine)
    job = rl.enqueue(engine, JOB_TYPE, {})
    waiter = Waiter(engine, job.id)
    [pid] = wait_until(lambda: ended_listener_pids(engine), what="the waiter's LISTEN")
    terminate_backend(engine, pid)
    rl.cancel_job(engine, job.id)
    assert waiter.join().status is rl.JobStatus.CANCELED


def test_a_job_still_pending_at_the_deadline_raises_wait_timeout(engine):
    define(engine)
    job = rl.enqueue(engine, JOB_TYPE, {})
    with pytest.raises(rl.JobWaitTimeout) as raised:
        rl.wait_for_job(engine, job.id, timeout=0.2)
    assert raised.value.code == "job.wait_timeout"
    assert raised.value.details == {"job_id": str(job.id), "status": "PENDING", "timeout_seconds": 0.2}
    assert isinstance(raised.value, rl.RunledgerError)
    assert ended_listeners(engine) == 0


def test_an_unknown_job_raises_not_found(engine):
    with pytest.raises(rl.JobNotFound) as raised:
        rl.wait_for_job(engine, UUID(int=1), timeout=5)
    assert raised.value.code == "job.not_found"


@pytest.mark.parametrize("timeout", [-1, float("nan"), float("inf"), "5", True])
def test_a_bad_timeout_is_refused(engine, timeout):
    with pytest.raises(rl.InvalidArgument) as raised:
        rl.wait_for_job(engine, UUID(int=1), timeout=timeout)
    assert raised.value.argument == "timeout"


def test_behind_transaction_pooling_it_polls_without_listening(fresh_database, monkeypatch):
    # Recorders around the real calls: which the waiter makes, and when it has read the job once.
    opened, read = [], threading.Event()
    real_open, real_get = driver.open_listener, driver.get_job
    monkeypatch.setattr(driver, "open_listener", lambda *args, **kw: opened.append(args) or real_open(*args, **kw))
    monkeypatch.setattr(driver, "get_job", lambda *args, **kw: (real_get(*args, **kw), read.set())[0])
    pooled = create_engine(fresh_database, pool_mode="transaction")
    try:
        define(pooled)
        job = rl.enqueue(pooled, JOB_TYPE, {})
        waiter = Waiter(pooled, job.id)
        assert read.wait(10)
        rl.cancel_job(pooled, job.id)
        assert waiter.join().status is rl.JobStatus.CANCELED
        assert opened == []
    finally:
        pooled.dispose()


def test_one_group_write_sends_one_notification_naming_its_ended_jobs(engine):
    define(engine)
    jobs = [rl.enqueue(engine, JOB_TYPE, {"n": n}) for n in range(3)]
    listener = notify.open_listener(engine, (notify.ENDED_CHANNEL,))
    try:
        claimed = [claim_one(engine) for _ in jobs]
        write_successes(engine, [(LeaseIdentity.of(job), None) for job in claimed])
        received = wait_until(lambda: notify.read_notifications(listener).get(notify.ENDED_CHANNEL))
        assert len(received) == 1
        assert notify.ended_job_ids(received) == {str(job.id) for job in jobs}
    finally:
        notify.close_listener(listener)


def test_a_retry_sends_no_notification(engine):
    define(engine)
    job = rl.enqueue(engine, JOB_TYPE, {})
    listener = notify.open_listener(engine, (notify.ENDED_CHANNEL, "runledger_marker"))
    try:
        complete_job_failure(engine, **LeaseIdentity.of(claim_one(engine)).keywords(),
                                       failure=JobFailure.retryable("x.y", "z"), retry_delay_ms=60_000)
        # A marker sent after the retry committed: once it arrives, anything the retry sent has too.
        notify.send_probe(engine, "runledger_marker", "after")
        received = wait_until(lambda: notify.read_notifications(listener) or None, what="the marker")
        assert received == {"runledger_marker": {"after"}}
        assert rl.get_job(engine, job.id).status is rl.JobStatus.PENDING
    finally:
        notify.close_listener(listener)


def test_ended_ids_of_an_empty_payload_mean_look_again():
    assert notify.ended_job_ids({"a,b", "c"}) == {"a", "b", "c"}
    assert notify.ended_job_ids({"a", ""}) is None
