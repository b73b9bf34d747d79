"""The completer: every decided outcome written in groups, split and retried by itself, answered once durable."""

from __future__ import annotations

import threading
import time

from runledger_sync.core.errors import InvalidCompletionProgress
from runledger_sync.core.outcomes import Retry, Succeed
from runledger_sync.core.records import JobSpec, LeaseIdentity
from runledger_sync.core.types import JobCompletion, JobFailure
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.attempt.completer import LANDED_AFTER_LOST_REPLY, Completer
from runledger_sync.store.enqueue.enqueue import enqueue_many
from runledger_sync.store.claim.claim import claim_prestart_jobs_for_types
from runledger_sync.store.attempt.running import update_job_progress
from runledger_sync.store.driver import driver_for
from tests.db.runtime.test_success_reply_lost import group_reply_lost, outage  # noqa: F401 - the fixture
from tests.handlers import fast_config
from tests.support import JOB_TYPE, define, event_types, rows, run_worker_until, scalar

JOBS = 16


def claimed(engine, count):
    define(engine, max_attempts=5)
    enqueue_many(engine, [JobSpec(JOB_TYPE, {"n": n}) for n in range(count)])
    return claim_prestart_jobs_for_types(engine, worker_id="worker-a", lease_ttl_seconds=30, limit=count,
                                         job_types=[JOB_TYPE])


def post_all(completer, outcomes):
    """Post every (identity, transition) at once; return each answer and the thread that gave it."""
    answers: dict[int, tuple[object, str]] = {}
    done = threading.Event()

    def answer_for(index):
        def on_answer(result):
            answers[index] = (result, threading.current_thread().name)
            if len(answers) == len(outcomes):
                done.set()
        return on_answer

    for index, (identity, transition) in enumerate(outcomes):
        completer.post(identity, transition, give_up_at=time.monotonic() + 10, on_answer=answer_for(index))
    assert done.wait(15)
    return [answers[index] for index in range(len(outcomes))]


def test_failures_that_end_together_share_one_transaction(engine):
    registry = JobRegistry()
    together = threading.Barrier(8, timeout=10)

    @registry.job(JOB_TYPE, max_attempts=5)
    def fails_in_step(ctx, payload):
        together.wait()
        raise JobFailure.retryable("test.busy", "try later")

    registry.sync_definitions(engine)
    enqueue_many(engine, [JobSpec(JOB_TYPE, {"n": n}) for n in range(JOBS)])
    run_worker_until(engine, registry, fast_config(max_global_concurrency=8, claim_batch_size=8),
                     lambda: scalar(engine, "SELECT count(*) FROM job_queue WHERE status = 'PENDING' "
                                            "AND last_error_code = 'test.busy'") == JOBS)
    assert scalar(engine, "SELECT count(*) FROM job_events WHERE event_type = 'RETRY_SCHEDULED'") == JOBS
    # now() is the transaction's start: one value per transaction that wrote retries.
    assert scalar(engine, "SELECT count(DISTINCT occurred_at) FROM job_events "
                          "WHERE event_type = 'RETRY_SCHEDULED'") <= JOBS // 2


def test_a_group_refused_as_a_whole_is_split_by_the_completer_down_to_the_one_job(engine):
    jobs = claimed(engine, 5)
    bad = jobs[2]
    update_job_progress(engine, **LeaseIdentity.of(bad).keywords(), progress_done=1, progress_total=2)
    completer = Completer(driver_for(engine), "completer-under-test")
    try:
        answers = post_all(completer, [
            (LeaseIdentity.of(job), Succeed(JobCompletion(progress_done=5) if job is bad else JobCompletion()))
            for job in jobs])
    finally:
        completer.close()
    results = [result for result, _ in answers]
    assert [result is None for result in results] == [True, True, False, True, True]
    assert isinstance(results[2], InvalidCompletionProgress)
    # Every answer came from the completer's own thread: nothing went back to a pool.
    assert {thread for _, thread in answers} == {"completer-under-test"}
    assert dict(rows(engine, "SELECT id, status FROM job_queue")) == {
        job.id: "LEASED" if job is bad else "SUCCEEDED" for job in jobs}


def test_a_failure_group_whose_reply_is_lost_is_read_back_not_written_twice(engine, outage):  # noqa: F811
    jobs = claimed(engine, 3)
    failure = JobFailure.retryable("test.busy", "try later")
    completer = Completer(driver_for(engine), "completer-under-test")
    try:
        with group_reply_lost(engine, outage):
            answers = post_all(completer, [(LeaseIdentity.of(job), Retry(failure, 0)) for job in jobs])
    finally:
        completer.close()
    assert outage.started.is_set()
    assert [result for result, _ in answers] == [LANDED_AFTER_LOST_REPLY] * 3
    for job in jobs:
        assert event_types(engine, job.id).count("RETRY_SCHEDULED") == 1
    assert rows(engine, "SELECT DISTINCT status, attempt FROM job_queue") == [("PENDING", 1)]
