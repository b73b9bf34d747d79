"""Group commit in a running worker: fewer transactions, the same outcome for every job."""

from __future__ import annotations

import threading
import time

import pytest

from runledger_sync.core.outcomes import Succeed
from runledger_sync.core.records import JobSpec, LeaseIdentity
from runledger_sync.core.types import JobCompletion
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.attempt import run as execution
from runledger_sync.runtime.attempt.state import Attempt
from runledger_sync.runtime.attempt.completer import Completer
from runledger_sync.runtime.worker.loop import WorkerLoop
from runledger_sync.store.claim.claim import claim_prestart_jobs_for_types
from runledger_sync.store.driver import StoreDriver, driver_for
from runledger_sync.store.enqueue.enqueue import enqueue_many
from tests.handlers import fast_config
from tests.support import JOB_TYPE, rows, run_worker_until, scalar, wait_until

JOBS = 24
CONCURRENCY = 8


def succeeded(engine):
    return scalar(engine, "SELECT count(*) FROM job_queue WHERE status = 'SUCCEEDED'")


def transactions_writing(engine, event_type):
    """Distinct transactions that wrote ``event_type`` events: now() is the transaction's start."""
    return scalar(engine, "SELECT count(DISTINCT occurred_at) FROM job_events WHERE event_type = :t", t=event_type)


def test_concurrent_jobs_share_running_and_success_transactions(engine):
    registry = JobRegistry()
    together = threading.Barrier(CONCURRENCY, timeout=10)

    @registry.job(JOB_TYPE)
    def in_step(ctx, payload):
        # Jobs that run at the same time finish at the same time, as no-op jobs do.
        together.wait()

    registry.sync_definitions(engine)
    enqueue_many(engine, [JobSpec(JOB_TYPE, {"n": n}) for n in range(JOBS)])
    # The full event log: the transactions that wrote STAGE_CHANGED rows are the running writes.
    run_worker_until(engine, registry, fast_config(max_global_concurrency=CONCURRENCY, claim_batch_size=CONCURRENCY,
                                                   event_log="full"),
                     lambda: succeeded(engine) == JOBS)
    assert rows(engine, "SELECT count(*) FROM job_events WHERE event_type = 'STAGE_CHANGED'")[0][0] == JOBS
    assert rows(engine, "SELECT count(*) FROM job_events WHERE event_type = 'SUCCEEDED'")[0][0] == JOBS
    assert rows(engine, "SELECT count(*) FROM job_attempts WHERE finished_at IS NOT NULL "
                        "AND execution_started_persisted_at IS NOT NULL")[0][0] == JOBS
    assert transactions_writing(engine, "STAGE_CHANGED") <= JOBS // 2
    assert transactions_writing(engine, "SUCCEEDED") <= JOBS // 2


def test_a_claimed_batch_is_marked_running_in_one_transaction_however_slowly_its_threads_start(engine, monkeypatch):
    registry = JobRegistry()
    registry.job(JOB_TYPE)(lambda ctx, payload: None)
    registry.sync_definitions(engine)
    enqueue_many(engine, [JobSpec(JOB_TYPE, {"n": n}) for n in range(CONCURRENCY)])

    class SlowToStart(Attempt):
        def __init__(self, *args, **kwargs):
            # Each pool thread takes far longer to start than any linger: the batch's running write must not wait on them.
            threading.Event().wait(0.02)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(execution, "Attempt", SlowToStart)
    loop = WorkerLoop(driver_for(engine), registry, fast_config(max_global_concurrency=CONCURRENCY, claim_batch_size=CONCURRENCY,
                                                    event_log="full"),
                      threading.Event(), listen=False)
    try:
        loop.turn()
    finally:
        loop.drain()
    assert succeeded(engine) == CONCURRENCY
    assert rows(engine, "SELECT count(*) FROM job_events WHERE event_type = 'STAGE_CHANGED'")[0][0] == CONCURRENCY
    assert transactions_writing(engine, "STAGE_CHANGED") == 1


def test_one_invalid_completion_in_a_group_fails_alone(engine):
    registry = JobRegistry()
    together = threading.Barrier(4, timeout=10)

    @registry.job(JOB_TYPE)
    def mostly_fine(ctx, payload):
        if payload["bad"]:
            ctx.report_progress(done=1, total=2)
        together.wait()
        # Merged with the stored total of 2, done=5 breaks done <= total: only the
        # database can tell, when the whole group's statement runs.
        return JobCompletion(progress_done=5) if payload["bad"] else None

    registry.sync_definitions(engine)
    enqueue_many(engine, [JobSpec(JOB_TYPE, {"bad": n == 2}) for n in range(4)])
    run_worker_until(engine, registry, fast_config(max_global_concurrency=4, claim_batch_size=4),
                     lambda: scalar(engine, "SELECT count(*) FROM job_queue WHERE status NOT IN ('PENDING', 'LEASED')") == 4)
    outcome = dict(rows(engine, "SELECT (payload->>'bad')::bool, array_agg(DISTINCT status) FROM job_queue GROUP BY 1"))
    assert outcome == {False: ["SUCCEEDED"], True: ["DEAD_LETTERED"]}
    assert scalar(engine, "SELECT last_error_code FROM job_queue WHERE (payload->>'bad')::bool") == \
        "job.invalid_completion_progress"


def test_a_refused_progress_dead_letters_through_the_completer_and_its_hook_runs_off_its_thread(engine):
    # The store refuses the success's progress when the group's statement runs; the
    # terminal failure replacing it is the completer's second item, and the dead
    # letters' hooks wait for one another: run from the completer's one thread,
    # one after another, the first would time out waiting for the rest.
    registry = JobRegistry()
    hooked: list[tuple[bool, str]] = []
    all_hooks_running = threading.Barrier(3, timeout=5)

    def on_dead_letter(ctx, payload, info):
        try:
            all_hooks_running.wait()
            together = True
        except threading.BrokenBarrierError:
            together = False
        hooked.append((together, info.failure.code))

    @registry.job(JOB_TYPE, on_dead_letter=on_dead_letter)
    def over_the_stored_total(ctx, payload):
        ctx.report_progress(done=1, total=2)
        return JobCompletion(progress_done=5)

    registry.sync_definitions(engine)
    enqueue_many(engine, [JobSpec(JOB_TYPE, {"n": n}) for n in range(3)])
    run_worker_until(engine, registry, fast_config(max_global_concurrency=3, claim_batch_size=3,
                                                   dead_letter_hook_timeout_seconds=10), lambda: len(hooked) == 3)
    assert rows(engine, "SELECT status, last_error_code, count(*) FROM job_queue GROUP BY 1, 2") == [
        ("DEAD_LETTERED", "job.invalid_completion_progress", 3)]
    assert scalar(engine, "SELECT count(*) FROM job_attempts") == 3
    assert hooked == [(True, "job.invalid_completion_progress")] * 3


class WatchedDriver(StoreDriver):
    """The store's driver, whose group writes can be held back, counted or broken by a test."""

    def __init__(self, bind, *, gate=None, groups=None, breaks=None):
        super().__init__(bind)
        self.gate, self.groups, self.breaks = gate, groups, breaks

    def held(self):
        held = super().held()
        return WatchedDriver(held.bind, gate=self.gate, groups=self.groups, breaks=self.breaks)

    def apply_transitions(self, items, **options):
        if self.groups is not None:
            self.groups.append(len(items))
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.breaks is not None:
            raise self.breaks
        return super().apply_transitions(items, **options)


def successes_of(engine, count):
    registry = JobRegistry()
    registry.job(JOB_TYPE)(lambda ctx, payload: None)
    registry.sync_definitions(engine)
    enqueue_many(engine, [JobSpec(JOB_TYPE, {"n": n}) for n in range(count)])
    jobs = claim_prestart_jobs_for_types(engine, worker_id="worker-a", lease_ttl_seconds=30, limit=count,
                                         job_types=[JOB_TYPE])
    return [(LeaseIdentity.of(job), Succeed(JobCompletion())) for job in jobs]


def post(completer, outcomes, on_answer, first=0):
    for index, (identity, transition) in enumerate(outcomes, start=first):
        completer.post(identity, transition, give_up_at=time.monotonic() + 10,
                       on_answer=lambda result, index=index: on_answer(index, result))


def test_posting_does_not_wait_and_what_was_queued_meanwhile_is_written_as_one_group_on_the_completer_thread(engine):
    outcomes = successes_of(engine, 4)
    gate, groups = threading.Event(), []
    answered: dict[int, tuple[object, str]] = {}
    all_answered = threading.Event()

    def on_answer(index, result):
        answered[index] = (result, threading.current_thread().name)
        if len(answered) == len(outcomes):
            all_answered.set()

    completer = Completer(WatchedDriver(engine, gate=gate, groups=groups), "test-post")
    try:
        post(completer, outcomes[:1], on_answer)
        wait_until(lambda: groups == [1])
        # The first outcome is held at its write; the other three queue behind it meanwhile.
        post(completer, outcomes[1:], on_answer, first=1)
        assert not answered and completer.waiting == 4
        assert scalar(engine, "SELECT count(*) FROM job_queue WHERE status = 'SUCCEEDED'") == 0
        gate.set()
        assert all_answered.wait(10)
    finally:
        completer.close()
    assert answered == {index: (None, "test-post") for index in range(4)}
    assert groups == [1, 3] and completer.waiting == 0
    assert scalar(engine, "SELECT count(*) FROM job_queue WHERE status = 'SUCCEEDED'") == 4


def test_a_crashing_answer_costs_the_others_nothing_and_a_post_after_close_is_refused(engine, logs):
    outcomes = successes_of(engine, 3)
    answered = []

    def on_answer(index, result):
        if index == 1:
            raise RuntimeError("broken callback")
        answered.append((index, result))

    completer = Completer(driver_for(engine), "test-callbacks")
    post(completer, outcomes[:2], on_answer)
    completer.close()
    assert answered == [(0, None)]
    assert "outcome answer callback crashed" in [r.getMessage() for r in logs.records]
    assert scalar(engine, "SELECT count(*) FROM job_queue WHERE status = 'SUCCEEDED'") == 2
    with pytest.raises(RuntimeError, match="closed"):
        post(completer, outcomes[2:], on_answer)
    assert scalar(engine, "SELECT count(*) FROM job_queue WHERE status = 'LEASED'") == 1


def test_a_group_write_that_breaks_as_a_whole_answers_every_outcome_with_the_error_and_writes_none(engine):
    outcomes = successes_of(engine, 3)
    answers: dict[int, object] = {}
    done = threading.Event()

    def on_answer(index, result):
        answers[index] = result
        if len(answers) == len(outcomes):
            done.set()

    completer = Completer(WatchedDriver(engine, breaks=RuntimeError("a bug in the write")), "test-broken")
    try:
        post(completer, outcomes, on_answer)
        assert done.wait(10)
    finally:
        completer.close()
    assert sorted(answers) == [0, 1, 2] and all(isinstance(a, RuntimeError) for a in answers.values())
    assert completer.waiting == 0
    assert scalar(engine, "SELECT count(*) FROM job_queue WHERE status = 'LEASED'") == 3
