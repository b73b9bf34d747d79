"""Group commit in a running worker: fewer transactions, the same outcome for every job."""

from __future__ import annotations

import threading

import pytest

from runledger_sync.core.records import JobSpec
from runledger_sync.core.types import JobCompletion
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.attempt import run as execution
from runledger_sync.runtime.attempt.state import Attempt
from runledger_sync.runtime.attempt.completer import GroupWriter
from runledger_sync.runtime.worker.loop import WorkerLoop
from runledger_sync.store.enqueue.enqueue import enqueue_many
from tests.handlers import fast_config
from tests.support import JOB_TYPE, rows, run_worker_until, scalar

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
    loop = WorkerLoop(engine, registry, fast_config(max_global_concurrency=CONCURRENCY, claim_batch_size=CONCURRENCY,
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


def answers_of(writer, posts):
    """Post each list of items on its own; return every item's answer once all have come."""
    answers: dict[int, object] = {}
    done = threading.Event()
    total = sum(len(items) for items in posts)

    def on_written(item, result):
        answers[item] = result
        if len(answers) == total:
            done.set()

    for items in posts:
        writer.post(items, on_written)
    assert done.wait(5)
    return answers


def test_group_writer_gives_each_item_its_own_result_or_error():
    writer: GroupWriter[int, int] = GroupWriter(
        "test-group", lambda items: [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items])
    answers = answers_of(writer, [[i] for i in range(6)])
    writer.close()
    assert {i: str(a) if isinstance(a, ValueError) else a for i, a in answers.items()} == {
        0: 0, 1: "odd 1", 2: 20, 3: "odd 3", 4: 40, 5: "odd 5"}
    assert writer.waiting == 0


def test_posted_items_are_written_in_one_group_and_each_gets_its_own_result_on_the_writer_thread():
    release = threading.Event()
    groups: list[list[int]] = []
    answered: dict[int, tuple[object, str]] = {}
    all_answered = threading.Event()

    def write(items):
        release.wait(5)
        groups.append(items)
        return [i * 10 for i in items]

    def on_written(item, result):
        answered[item] = (result, threading.current_thread().name)
        if len(answered) == 3:
            all_answered.set()

    writer: GroupWriter[int, int] = GroupWriter("test-post", write)
    writer.post([1, 2, 3], on_written)
    # Posting does not wait: nothing is written until the writer is let go.
    assert not answered and writer.waiting == 3
    release.set()
    assert all_answered.wait(5)
    assert answered == {1: (10, "test-post"), 2: (20, "test-post"), 3: (30, "test-post")}
    writer.close()
    assert groups == [[1, 2, 3]] and writer.waiting == 0


def test_a_post_after_close_is_refused_and_a_crashing_callback_costs_the_others_nothing(logs):
    answered = []

    def on_written(item, result):
        if item == 1:
            raise RuntimeError("broken callback")
        answered.append((item, result))

    writer: GroupWriter[int, int] = GroupWriter("test-callbacks", lambda items: [i * 10 for i in items])
    writer.post([1, 2], on_written)
    writer.close()
    assert answered == [(2, 20)]
    assert "group write callback crashed" in [r.getMessage() for r in logs.records]
    with pytest.raises(RuntimeError, match="closed"):
        writer.post([3], on_written)


def test_group_writer_that_fails_as_a_whole_answers_every_item_with_the_error():
    def broken(items):
        raise ConnectionError("database went away")

    writer: GroupWriter[int, int] = GroupWriter("test-broken", broken)
    answers = answers_of(writer, [[1], [2, 3]])
    writer.close()
    assert sorted(answers) == [1, 2, 3] and all(isinstance(a, ConnectionError) for a in answers.values())

