"""The reaper loop (spec sections 7 and 14.7, 14.8, 14.24) with its dead-letter hooks."""

from __future__ import annotations

import threading
import time

from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.types import JobDeadLetterReason, JobFailure, JobFailureKind, RuntimeLoopExit
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.attempt.run import process_claimed_job
from runledger_sync.runtime.loops.reaper import run_reaper_loop
from runledger_sync.store.enqueue.enqueue import enqueue
from runledger_sync.store.attempt.running import mark_job_running
from runledger_sync.store.driver import driver_for
from tests import handlers as h
from tests.handlers import SECRET, fast_config
from tests.support import JOB_TYPE, attempts, claim_one, event_types, events, expire_lease, rows, scalar, wait_until

PAYLOAD = {"secret": SECRET}


def job_state(engine, job_id):
    return tuple(rows(engine, "SELECT status, attempt FROM job_queue WHERE id = :id", id=job_id)[0])


def expired_started_claim(engine, job_type, **enqueue_options):
    """A job whose worker persisted RUNNING and then vanished: its lease ran out."""
    job = enqueue(engine, job_type, PAYLOAD, **enqueue_options)
    claimed = claim_one(engine, job_type=job_type)
    mark_job_running(engine, LeaseIdentity.of(claimed))
    expire_lease(engine, job.id)
    return job


def test_reaper_releases_an_expired_never_started_claim_without_spending_the_attempt(engine, probe, start_loop, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe), max_attempts=1)
    registry.sync_definitions(engine)
    job = enqueue(engine, JOB_TYPE, PAYLOAD)
    claim_one(engine, worker_id="worker-died")  # died before persisting RUNNING
    expire_lease(engine, job.id)
    reaper = start_loop("reaper", registry)
    wait_until(lambda: job_state(engine, job.id) == ("PENDING", 0))
    assert reaper.stop() is RuntimeLoopExit.SHUTDOWN
    assert events(engine, job.id)[-1] == ("REQUEUED", 1, {"reason": "LEASE_EXPIRED_BEFORE_RUNNING_PERSISTED"})
    assert attempts(engine, job.id) == []
    start_loop("worker", registry)
    wait_until(lambda: job_state(engine, job.id) == ("SUCCEEDED", 1))
    assert [(a.attempt, a.outcome, a.worker_id) for a in attempts(engine, job.id)] == [(1, None, "worker-test")]


def test_reaper_keeps_the_spent_first_attempt_when_the_second_never_starts(engine, probe, start_loop, logs):
    def body(ctx, payload, call):
        if ctx.attempt == 1:
            raise JobFailure.retryable("test.flaky", "first try fails")

    registry = h.registry_with(JOB_TYPE, h.scripted(probe, body), max_attempts=3,
                               retry_delay_overrides={"test.flaky": 1})
    registry.sync_definitions(engine)
    job = enqueue(engine, JOB_TYPE, PAYLOAD)
    config = fast_config()
    process_claimed_job(driver_for(engine), registry, claim_one(engine, worker_id=config.worker_id), config)
    assert job_state(engine, job.id) == ("PENDING", 1)
    wait_until(lambda: scalar(engine, "SELECT next_run_at <= now() FROM job_queue"))
    claim_one(engine, worker_id="worker-died")  # attempt 2, never started
    expire_lease(engine, job.id)
    reaper = start_loop("reaper", registry)
    wait_until(lambda: job_state(engine, job.id) == ("PENDING", 1))
    reaper.stop()
    start_loop("worker", registry)
    wait_until(lambda: job_state(engine, job.id) == ("SUCCEEDED", 2))
    assert [(a.attempt, a.outcome) for a in attempts(engine, job.id)] == [(1, "RETRYABLE"), (2, None)]


def test_reaper_loop_dead_letters_an_expired_last_attempt_and_tells_the_hook(engine, probe, start_loop, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe), max_attempts=1, on_dead_letter=h.recording_hook(probe, engine))
    registry.job("test.marker", max_attempts=3)(h.ok(probe))
    registry.sync_definitions(engine)
    job = expired_started_claim(engine, JOB_TYPE, organization_id="org-3", meta={"tenant": "acme"})
    start_loop("reaper", registry)
    [(ctx, payload, info, status_seen)] = probe.wait_dead_letters(1)
    assert status_seen == "DEAD_LETTERED"
    assert (ctx.job_id, ctx.attempt, ctx.worker_id, ctx.organization_id) == (job.id, 1, "reaper", "org-3")
    assert ctx.meta == {"tenant": "acme"}
    assert payload == PAYLOAD
    assert info.failure == JobFailure(JobFailureKind.LEASE_EXPIRED, "job.lease_expired",
                                      "Job lease expired before completion.")
    assert (info.reason, info.max_attempts) == (JobDeadLetterReason.LEASE_EXPIRED, None)
    assert rows(engine, "SELECT status, status_reason FROM job_queue WHERE id = :id", id=job.id) == [
        ("DEAD_LETTERED", "LEASE_EXPIRED")]
    assert attempts(engine, job.id)[0].outcome == "LEASE_EXPIRED"
    assert probe.calls == []  # the handler itself never runs
    # A later sweep (proved by it recovering another job) does not tell the hook again.
    marker = expired_started_claim(engine, "test.marker")
    wait_until(lambda: job_state(engine, marker.id) == ("PENDING", 1))
    assert len(probe.dead_letters) == 1


def test_reaper_retries_an_expired_started_attempt_at_the_reaper_delay(engine, probe, start_loop, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe), max_attempts=3, on_dead_letter=h.recording_hook(probe))
    registry.sync_definitions(engine)
    job = expired_started_claim(engine, JOB_TYPE)
    start_loop("reaper", registry, fast_config(reaper_retry_delay_ms=45_000))
    wait_until(lambda: job_state(engine, job.id) == ("PENDING", 1))
    wait_s = scalar(engine, "SELECT extract(epoch FROM next_run_at - now()) FROM job_queue")
    assert 44 < wait_s <= 45
    assert event_types(engine, job.id)[-2:] == ["FAILED", "RETRY_SCHEDULED"]
    assert probe.dead_letters == []


def test_reaper_hooks_that_hang_or_raise_do_not_stop_the_reaper(engine, probe, start_loop, logs):
    registry = JobRegistry()
    registry.job("test.hangs", max_attempts=1, on_dead_letter=h.hanging_hook(probe))(h.ok(probe))
    registry.job("test.raises", max_attempts=1, on_dead_letter=h.raising_hook(probe))(h.ok(probe))
    registry.job("test.later", max_attempts=1, on_dead_letter=h.recording_hook(probe))(h.ok(probe))
    registry.sync_definitions(engine)
    expired_started_claim(engine, "test.hangs")
    expired_started_claim(engine, "test.raises")
    reaper = start_loop("reaper", registry, fast_config(dead_letter_hook_timeout_seconds=0.1))
    probe.wait_dead_letters(2)
    wait_until(lambda: {"dead-letter hook timed out; continuing worker job task",
                        "dead-letter hook panicked; continuing worker job task"}
               <= {r.getMessage() for r in logs.records})
    later = expired_started_claim(engine, "test.later")
    dead = probe.wait_dead_letters(3)
    assert [d[0].job_id for d in dead if d[3] is None] == [later.id]
    assert reaper.thread.is_alive()
    assert rows(engine, "SELECT count(*) FROM job_queue WHERE status = 'DEAD_LETTERED'") == [(3,)]
    timed_out = [r for r in logs.records if r.getMessage() == "dead-letter hook timed out; continuing worker job task"]
    assert (timed_out[0].job_type, timed_out[0].worker_id) == ("test.hangs", "reaper")


def test_shutdown_interrupts_the_reaper_waiting_on_a_hung_hook(engine, probe, start_loop, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe), max_attempts=1, on_dead_letter=h.hanging_hook(probe))
    registry.sync_definitions(engine)
    expired_started_claim(engine, JOB_TYPE)
    reaper = start_loop("reaper", registry, fast_config(dead_letter_hook_timeout_seconds=10))
    probe.wait_dead_letters(1)
    started = time.monotonic()
    assert reaper.stop(timeout=5) is RuntimeLoopExit.SHUTDOWN
    assert time.monotonic() - started < 1.5  # about 250 ms of grace, not the 10 s hook timeout
    assert [r for r in logs.records
            if r.getMessage() == "reaper shutting down; abandoning dead-letter hooks still running"]


def test_reaper_with_invalid_config_returns_invalid_config_and_touches_nothing(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe), max_attempts=1)
    registry.sync_definitions(engine)
    job = expired_started_claim(engine, JOB_TYPE)
    for bad in ({"reaper_retry_delay_ms": 0}, {"reaper_interval_seconds": 0}, {"claim_batch_size": 0}):
        exit_reason = run_reaper_loop(driver_for(engine), registry, fast_config(**bad), threading.Event())
        assert exit_reason is RuntimeLoopExit.INVALID_CONFIG
    assert job_state(engine, job.id) == ("LEASED", 1)
