"""The polling loop (spec sections 5 and 14): claims, slots, drain, exits, on real threads."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import pytest

from runledger_sync.config import JobsConfig
from runledger_sync.core.records import JobSpec
from runledger_sync.core.types import JobCompletion, RuntimeLoopExit
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.loops.reaper import reap_once
from runledger_sync.runtime.worker.loop import WorkerLoop, run_worker_loop
from runledger_sync.store.enqueue.enqueue import enqueue, enqueue_many
from runledger_sync.store.driver import driver_for
from tests import handlers as h
from tests.handlers import SECRET, fast_config
from tests.support import JOB_TYPE, attempts, event_types, expire_lease, rows, scalar, wait_until

PAYLOAD = {"secret": SECRET}


def status(engine, job_id):
    return scalar(engine, "SELECT status FROM job_queue WHERE id = :id", id=job_id)


def statuses(engine):
    return dict(rows(engine, "SELECT status, count(*) FROM job_queue GROUP BY status"))


def wait_status(engine, job_id, expected, timeout=10.0):
    wait_until(lambda: status(engine, job_id) == expected, timeout=timeout)


def holds(condition, seconds):
    """True if ``condition`` stays true on every check for ``seconds`` (for "nothing else happens")."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not condition():
            return False
        time.sleep(0.02)
    return True


def test_worker_with_shutdown_already_requested_returns_before_claiming(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    registry.sync_definitions(engine)
    job = enqueue(engine, JOB_TYPE, PAYLOAD)
    shutdown = threading.Event()
    shutdown.set()
    assert run_worker_loop(engine, registry, fast_config(), shutdown) is RuntimeLoopExit.SHUTDOWN
    assert status(engine, job.id) == "PENDING"
    assert event_types(engine, job.id) == []
    assert probe.calls == []


def test_worker_start_logs_one_warning_per_adjusted_environment_value(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    registry.sync_definitions(engine)
    config = JobsConfig.from_env({"JOBS_MAX_GLOBAL_CONCURRENCY": "abc", "JOBS_POLL_INTERVAL_MS": "0"})
    shutdown = threading.Event()
    shutdown.set()

    assert run_worker_loop(engine, registry, config, shutdown) is RuntimeLoopExit.SHUTDOWN

    warnings = [r for r in logs.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        "JOBS_POLL_INTERVAL_MS='0' is below the minimum of 1; using 1 instead",
        "JOBS_MAX_GLOBAL_CONCURRENCY='abc' is not a whole number; using the default, 32",
    ]
    assert [(r.variable, r.given, r.used) for r in warnings] == [
        ("JOBS_POLL_INTERVAL_MS", "0", 1), ("JOBS_MAX_GLOBAL_CONCURRENCY", "abc", 32)]
    assert [r.getMessage() for r in logs.records if r.levelno == logging.INFO] == ["worker started"]


@pytest.mark.parametrize("bad", [
    {"poll_interval_ms": 0}, {"max_global_concurrency": 0}, {"lease_ttl_seconds": 0.5},
    {"worker_id": "  "}, {"claim_batch_size": 1001}, {"job_types": (JOB_TYPE, "test.tpyo")},
])
def test_invalid_worker_config_returns_invalid_config_and_claims_nothing(engine, probe, logs, bad):
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    registry.sync_definitions(engine)
    job = enqueue(engine, JOB_TYPE, PAYLOAD)
    exit_reason = run_worker_loop(engine, registry, fast_config(**bad), threading.Event())
    assert exit_reason is RuntimeLoopExit.INVALID_CONFIG
    assert event_types(engine, job.id) == []
    assert [r.getMessage() for r in logs.records] == ["invalid jobs config; stopping worker loop"]


def test_worker_survives_a_panicking_handler_and_runs_the_next_job(engine, probe, start_loop, logs):
    registry = JobRegistry()
    registry.job("test.panic", max_attempts=3, dead_letter_on=RuntimeError)(h.raise_error(probe, RuntimeError("kaboom")))
    registry.job("test.ok")(h.ok(probe))
    registry.sync_definitions(engine)
    panicking = enqueue(engine, "test.panic", PAYLOAD, priority=500)
    worker = start_loop("worker", registry, fast_config(max_global_concurrency=1))
    wait_status(engine, panicking.id, "DEAD_LETTERED")
    following = enqueue(engine, "test.ok", PAYLOAD)
    wait_status(engine, following.id, "SUCCEEDED")
    assert rows(engine, "SELECT status_reason, last_error_code FROM job_queue WHERE id = :id", id=panicking.id) == [
        ("PANICKED", "job.handler_panic")]
    assert worker.thread.is_alive()
    assert worker.stop() is RuntimeLoopExit.SHUTDOWN


def test_worker_survives_a_handler_raising_system_exit(engine, probe, start_loop, logs):
    registry = JobRegistry()
    registry.job("test.exit")(h.kill_thread(probe))
    registry.job("test.ok")(h.ok(probe))
    registry.sync_definitions(engine)
    exiting = enqueue(engine, "test.exit", PAYLOAD, priority=500)
    following = enqueue(engine, "test.ok", PAYLOAD)
    worker = start_loop("worker", registry, fast_config(max_global_concurrency=1))
    wait_status(engine, following.id, "SUCCEEDED")
    assert rows(engine, "SELECT status, last_error_code FROM job_queue WHERE id = :id", id=exiting.id) == [
        ("DEAD_LETTERED", "job.handler_panic")]
    assert worker.thread.is_alive()
    assert worker.stop() is RuntimeLoopExit.SHUTDOWN


def test_worker_claims_no_more_jobs_than_it_has_free_slots(engine, probe, start_loop, logs):
    registry = h.registry_with(JOB_TYPE, h.hang(probe))
    registry.sync_definitions(engine)
    jobs = enqueue_many(engine, [JobSpec(JOB_TYPE, PAYLOAD) for _ in range(5)])
    start_loop("worker", registry, fast_config(max_global_concurrency=2, claim_batch_size=4))
    probe.wait_calls(2)
    assert holds(lambda: statuses(engine) == {"LEASED": 2, "PENDING": 3}, 0.3)
    probe.release.set()
    wait_until(lambda: statuses(engine) == {"SUCCEEDED": 5})
    assert probe.peak == 2
    assert sorted(len(attempts(engine, job.id)) for job in jobs) == [1] * 5


def test_concurrency_never_exceeds_max_global_concurrency(engine, probe, start_loop, logs):
    def body(ctx, payload, call):
        probe.note(scalar(engine, "SELECT count(*) FROM job_queue WHERE status = 'LEASED'"))
        time.sleep(0.2)  # the job's work: long enough for the others to pile up

    registry = h.registry_with(JOB_TYPE, h.scripted(probe, body))
    registry.sync_definitions(engine)
    enqueue_many(engine, [JobSpec(JOB_TYPE, PAYLOAD) for _ in range(9)])
    start_loop("worker", registry, fast_config(max_global_concurrency=3, claim_batch_size=2))
    wait_until(lambda: statuses(engine) == {"SUCCEEDED": 9}, timeout=20)
    assert probe.peak == 3
    assert max(probe.notes) <= 3


def test_each_pool_thread_keeps_one_timer_thread_and_long_jobs_are_still_renewed_and_timed_out(
        engine, probe, start_loop, logs):
    def short(ctx, payload, call):
        probe.note({t.name for t in threading.enumerate() if t.name.startswith("runledger-heartbeat")})

    registry = JobRegistry()
    registry.job("test.short")(h.scripted(probe, short))
    registry.job("test.long")(h.cooperative_sleep(probe, 1.0))
    registry.job("test.late", max_attempts=1, timeout_seconds=1)(h.cooperative_sleep(probe))
    registry.sync_definitions(engine)
    # Claimed in this order by priority: short jobs, then long ones, short again, then one that overruns.
    first = enqueue_many(engine, [JobSpec("test.short", PAYLOAD, priority=500) for _ in range(8)])
    long = enqueue_many(engine, [JobSpec("test.long", PAYLOAD, priority=400) for _ in range(2)])
    then = enqueue_many(engine, [JobSpec("test.short", PAYLOAD, priority=300) for _ in range(8)])
    late = enqueue(engine, "test.late", PAYLOAD, priority=200)
    # The full event log: its HEARTBEAT rows show the renewals.
    start_loop("worker", registry, fast_config(max_global_concurrency=2, claim_batch_size=2, event_log="full"))
    wait_status(engine, late.id, "DEAD_LETTERED", timeout=20)
    assert {status(engine, job.id) for job in first + long + then} == {"SUCCEEDED"}
    # Each job of 1 s outlived three renewal intervals of 0.3 s on a reused timer thread.
    assert [event_types(engine, job.id).count("HEARTBEAT") >= 2 for job in long] == [True, True]
    [attempt] = attempts(engine, late.id)
    assert (attempt.outcome, attempt.error_code) == ("TIMEOUT", "job.timeout_exceeded")
    # Two pool threads, two timer threads, whatever the number of jobs they ran.
    assert len(set().union(*probe.notes)) <= 2


class CrashingRegistry(JobRegistry):
    """A registry whose lookup fails for one type, as a bug in the pipeline would."""

    def get(self, job_type):
        if job_type == "test.crash":
            raise RuntimeError("registry lookup exploded")
        return super().get(job_type)


def test_a_crashed_job_task_frees_its_slot_and_leaves_the_lease_to_the_reaper(engine, probe, start_loop, logs):
    registry = CrashingRegistry()
    registry.job("test.crash", max_attempts=3)(h.ok(probe))
    registry.job("test.ok")(h.ok(probe))
    registry.sync_definitions(engine)
    crashed = enqueue(engine, "test.crash", PAYLOAD, priority=500)
    following = enqueue(engine, "test.ok", PAYLOAD)
    config = fast_config(max_global_concurrency=1, heartbeat_interval_seconds=0.2, event_log="full")
    start_loop("worker", registry, config)
    wait_status(engine, following.id, "SUCCEEDED")  # the only slot came back
    [crash_log] = [r for r in logs.records if r.getMessage() == "job task crashed"]
    assert "registry lookup exploded" in crash_log.error
    # Nobody runs the crashed job, so nobody may renew its lease.
    assert holds(lambda: "HEARTBEAT" not in event_types(engine, crashed.id), 0.6)
    assert status(engine, crashed.id) == "LEASED"
    expire_lease(engine, crashed.id)
    reap_once(driver_for(engine), registry, config, threading.Event())
    assert rows(engine, "SELECT status, last_error_code FROM job_queue WHERE id = :id", id=crashed.id) == [
        ("PENDING", "job.lease_expired")]


def test_shutdown_drains_in_flight_jobs_before_returning_and_claims_nothing_new(engine, probe, start_loop, logs):
    registry = h.registry_with(JOB_TYPE, h.hang(probe, JobCompletion(output={"drained": True})))
    registry.sync_definitions(engine)
    running = enqueue_many(engine, [JobSpec(JOB_TYPE, PAYLOAD) for _ in range(2)])
    worker = start_loop("worker", registry, fast_config(max_global_concurrency=2))
    probe.wait_calls(2)
    worker.shutdown.set()
    wait_until(lambda: any(r.getMessage() == "worker shutdown requested; draining in-flight jobs"
                           for r in logs.records))
    late = enqueue(engine, JOB_TYPE, PAYLOAD)
    assert holds(worker.thread.is_alive, 0.2)  # still draining: the handlers have not returned
    probe.release.set()
    worker.thread.join(10)
    assert worker.exits == [RuntimeLoopExit.SHUTDOWN]
    assert [status(engine, job.id) for job in running] == ["SUCCEEDED", "SUCCEEDED"]
    assert rows(engine, "SELECT output FROM job_queue WHERE status = 'SUCCEEDED'") == [({"drained": True},)] * 2
    assert event_types(engine, late.id) == []


def test_ignored_timeout_is_written_after_the_grace_and_the_slot_stays_taken_until_the_thread_returns(
        engine, probe, start_loop, logs):
    registry = JobRegistry()
    registry.job("test.stubborn", max_attempts=3, timeout_seconds=1)(h.ignore_cancel(probe))
    registry.job("test.next")(h.ok(probe))
    registry.sync_definitions(engine)
    stubborn = enqueue(engine, "test.stubborn", PAYLOAD, priority=500)
    waiting = enqueue(engine, "test.next", PAYLOAD)
    start_loop("worker", registry, fast_config(max_global_concurrency=1, timeout_grace_seconds=0.5, event_log="full"))
    [call] = probe.wait_calls(1)
    wait_status(engine, stubborn.id, "PENDING")
    timed_out_at = time.monotonic()
    [attempt] = attempts(engine, stubborn.id)
    assert (attempt.outcome, attempt.error_code) == ("TIMEOUT", "job.timeout_exceeded")
    # Deadline 1 s after start, then 0.5 s of grace; started_at is the claim, a bit earlier.
    assert (attempt.finished_at - attempt.started_at).total_seconds() >= 1.45
    assert timed_out_at - call.started < 4.0
    assert call.cancelled_at is not None and call.cancelled_at < timed_out_at
    heartbeats = event_types(engine, stubborn.id).count("HEARTBEAT")
    # The timed-out handler still runs, so its slot is still taken.
    assert holds(lambda: status(engine, waiting.id) == "PENDING", 0.4)
    assert event_types(engine, waiting.id) == []
    probe.release.set()
    wait_status(engine, waiting.id, "SUCCEEDED")
    row = rows(engine, "SELECT status, status_reason, last_error_code, output FROM job_queue WHERE id = :id",
               id=stubborn.id)[0]
    assert tuple(row) == ("PENDING", "TIMEOUT", "job.timeout_exceeded", None)
    types = event_types(engine, stubborn.id)
    assert "SUCCEEDED" not in types and types.count("HEARTBEAT") == heartbeats
    assert types[-2:] == ["FAILED", "RETRY_SCHEDULED"]
    assert [r for r in logs.records
            if r.getMessage() == "handler finished after its attempt was already decided; result discarded"]


def test_worker_logs_carry_the_job_fields_and_never_the_payload(engine, probe, start_loop, logs):
    registry = JobRegistry()
    registry.job("test.ok")(h.ok(probe))
    registry.job("test.bad")(h.fail_terminal(probe))
    registry.sync_definitions(engine)
    good = enqueue(engine, "test.ok", {"secret": SECRET, "card": SECRET})
    bad = enqueue(engine, "test.bad", {"secret": SECRET}, organization_id="org-7")
    logs.set_level(logging.DEBUG, logger="runledger_sync")  # the per-job lines are DEBUG
    start_loop("worker", registry, fast_config(worker_id="worker-logs"))
    wait_status(engine, good.id, "SUCCEEDED")
    wait_status(engine, bad.id, "DEAD_LETTERED")
    wait_until(lambda: len([r for r in logs.records if r.getMessage() == "job processed"]) == 2)
    processed = {r.job_id: r for r in logs.records if r.getMessage() == "job processed"}
    for job, job_type in ((good, "test.ok"), (bad, "test.bad")):
        record = processed[str(job.id)]
        assert (record.job_type, record.attempt, record.run_number, record.worker_id) == (
            job_type, 1, 1, "worker-logs")
        assert isinstance(record.elapsed_ms, int)
    [dead] = [r for r in logs.records if r.getMessage() == "job dead lettered after handler failure"]
    assert (dead.job_id, dead.job_type, dead.attempt, dead.worker_id, dead.organization_id) == (
        str(bad.id), "test.bad", 1, "worker-logs", "org-7")
    assert (dead.failure_code, dead.failure_kind, dead.dead_letter_reason) == (
        "test.terminal", "TERMINAL", "FAILURE_KIND_NON_RETRYABLE")
    assert [r for r in logs.records if r.getMessage() == "worker started"][0].worker_id == "worker-logs"
    for record in logs.records:
        assert SECRET not in record.getMessage()
        assert not any(SECRET in repr(value) for value in vars(record).values())


class Gate:
    """A handler that holds each job until :meth:`release` lets one through."""

    def __init__(self) -> None:
        self._permits = threading.Semaphore(0)

    def release(self, jobs: int) -> None:
        for _ in range(jobs):
            self._permits.release()

    def handler(self, _ctx, _payload) -> None:
        assert self._permits.acquire(timeout=h.MAX_BLOCK_SECONDS)


@contextmanager
def gated_loop(engine, queued: int, gather_seconds: float) -> Iterator[tuple[Gate, WorkerLoop]]:
    """A loop of 4 slots over ``queued`` jobs whose handlers wait for the gate; drained on exit."""
    gate = Gate()
    registry = JobRegistry()
    registry.job(JOB_TYPE)(gate.handler)
    registry.sync_definitions(engine)
    enqueue_many(engine, [JobSpec(JOB_TYPE, {"n": n}) for n in range(queued)])
    # The full event log: the LEASED rows show which jobs were claimed together.
    loop = WorkerLoop(driver_for(engine), registry, fast_config(max_global_concurrency=4, claim_batch_size=4, event_log="full"),
                      threading.Event(), listen=False)
    loop.claim_gather_seconds = gather_seconds
    try:
        yield gate, loop
    finally:
        # Enough for every job still in flight, so the drain does not wait on the gate.
        gate.release(loop.config.max_global_concurrency)
        loop.drain()


def claims(engine) -> int:
    return scalar(engine, "SELECT count(*) FROM job_attempts")


def test_a_backed_up_loop_waits_for_a_whole_batch_of_slots_and_claims_them_together(engine):
    with gated_loop(engine, queued=12, gather_seconds=h.MAX_BLOCK_SECONDS) as (gate, loop):
        assert loop.turn() is True  # 4 of 12 claimed: backed up
        assert loop.gather_target == 4
        gate.release(1)
        wait_until(lambda: loop.free_slots == 1)
        turn = threading.Thread(target=loop.turn)
        turn.start()
        # Fewer free slots than a batch: the claim waits instead of taking them alone.
        assert holds(lambda: turn.is_alive() and claims(engine) == 4, 0.3)
        gate.release(2)
        wait_until(lambda: loop.free_slots == 3)
        assert holds(lambda: turn.is_alive() and claims(engine) == 4, 0.3)
        gate.release(1)
        turn.join(timeout=10)
        assert not turn.is_alive()
        assert claims(engine) == 8
        leased_together = rows(engine, "SELECT occurred_at, count(*) FROM job_events WHERE event_type = 'LEASED' "
                                       "GROUP BY occurred_at ORDER BY occurred_at")
        assert [count for _, count in leased_together] == [4, 4]


def test_the_gather_wait_is_bounded_and_an_idle_loop_claims_at_once(engine):
    with gated_loop(engine, queued=12, gather_seconds=0.2) as (gate, loop):
        assert loop.turn() is True
        gate.release(1)
        wait_until(lambda: loop.free_slots == 1)
        started = time.monotonic()
        assert loop.turn() is True  # the one free slot, once the wait is over
        assert 0.19 <= time.monotonic() - started < 5
        assert claims(engine) == 5


def test_a_backed_up_loop_whose_handlers_are_slow_claims_its_free_slot_without_waiting_for_more(engine):
    with gated_loop(engine, queued=12, gather_seconds=0.5) as (gate, loop):
        assert loop.turn() is True
        time.sleep(1.0)  # the handlers' own running time: what makes them slow, not a wait for anything
        gate.release(1)  # a handler of a second: fewer than three more free within the gather time
        wait_until(lambda: loop.free_slots == 1)
        started = time.monotonic()
        assert loop.turn() is True
        assert time.monotonic() - started < 0.4
        assert claims(engine) == 5


def test_a_loop_that_is_not_backed_up_claims_into_a_single_free_slot_at_once(engine):
    with gated_loop(engine, queued=3, gather_seconds=h.MAX_BLOCK_SECONDS) as (gate, loop):
        assert loop.turn() is False  # 3 for 4 slots: the queue is drained, not backed up
        assert loop.free_slots == 1 < loop.gather_target
        enqueue(engine, JOB_TYPE, {})
        started = time.monotonic()
        assert loop.turn() is True
        assert time.monotonic() - started < 5
        assert claims(engine) == 4


@pytest.mark.parametrize("failure", ["refused", "connection lost"])
def test_a_running_write_that_fails_with_its_claim_hands_the_claim_back_and_the_job_runs_later(
    engine, probe, start_loop, logs, failure,
):
    # The first running write fails (the server refuses it, or its connection dies
    # under it) after the claim in the same round trip committed.
    action = ("RAISE EXCEPTION 'disk full'" if failure == "refused"
              else "PERFORM pg_terminate_backend(pg_backend_pid())")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE SEQUENCE running_writes")
        conn.exec_driver_sql(
            "CREATE FUNCTION fail_first_running() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF NEW.event_type = 'STAGE_CHANGED' AND nextval('running_writes') = 1 THEN {action}; END IF; "
            "RETURN NEW; END $$")
        conn.exec_driver_sql("CREATE TRIGGER fail_first_running BEFORE INSERT ON job_events "
                             "FOR EACH ROW EXECUTE FUNCTION fail_first_running()")
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    registry.sync_definitions(engine)
    # The full event log, whose STAGE_CHANGED row the trigger fails.
    job = enqueue(engine, JOB_TYPE, PAYLOAD, event_log="full")
    start_loop("worker", registry, fast_config(event_log="full"))

    wait_status(engine, job.id, "SUCCEEDED")

    assert len(probe.calls) == 1
    assert event_types(engine, job.id) == [
        "ENQUEUED", "LEASED", "REQUEUED", "LEASED", "STAGE_CHANGED", "SUCCEEDED"]
    assert rows(engine, "SELECT payload->>'reason' FROM job_events WHERE job_id = :id AND event_type = 'REQUEUED'",
                id=job.id) == [("RUNNING_PROGRESS_PERSIST_FAILED",)]
    assert [(a.attempt, a.execution_started_persisted_at is not None) for a in attempts(engine, job.id)] == [(1, True)]
