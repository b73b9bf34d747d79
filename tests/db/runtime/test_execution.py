"""One claimed job through the pipeline (spec sections 5, 6 and 14), against a real PostgreSQL.

Most tests claim a job the way the worker does (a prestart claim) and hand it
to ``process_claimed_job`` directly, so the pipeline runs in the test thread
and every outcome can be read back from ``job_queue``, ``job_attempts`` and
``job_events`` as soon as it returns.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import text

from runledger_sync.core import backoff, errors
from runledger_sync.core.store_errors import CommitOutcomeUnknown
from runledger_sync.core.types import JobCompletion, JobDeadLetterReason, JobFailure, JobFailureKind
from runledger_sync.db.engine import create_engine
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.attempt.state import UNKNOWN_WORKER_ID, lease_identity
from runledger_sync.runtime.attempt.run import process_claimed_job
from runledger_sync.runtime.attempt.completer import Completer
from runledger_sync.runtime.attempt.completer import FinishingSoon
from runledger_sync.runtime.worker.tally import OutcomeTally
from runledger_sync.runtime.loops.reaper import reap_once
from runledger_sync.store.attempt.ends import complete_job_failure, release_unstarted_job_claim
from runledger_sync.store.enqueue.enqueue import enqueue
from runledger_sync.store.admin.actions import cancel_job
from runledger_sync.store.claim.claim import claim_jobs, claim_prestart_jobs_for_types
from runledger_sync.store.claim.start import claim_and_start_jobs
from runledger_sync.store.transactions import HeldConnection
from runledger_sync.store.attempt.running import heartbeat_job, mark_job_running
from runledger_sync.store.driver import driver_for
from tests import handlers as h
from tests.handlers import SECRET
from tests.support import (
    JOB_TYPE,
    attempts,
    claim_one,
    event_types,
    events,
    expire_lease,
    identity,
    lock_waiters,
    rows,
    scalar,
    wait_until,
)

PAYLOAD = {"secret": SECRET, "n": 1}


def fast_config(**overrides):
    """The suite's fast config at the full event log: these tests read the LEASED, running and heartbeat rows."""
    return h.fast_config(**({"event_log": "full"} | overrides))


def job_row(engine, job_id):
    return rows(engine, "SELECT * FROM job_queue WHERE id = :id", id=job_id)[0]


def enqueue_and_claim(engine, registry, config, job_type=JOB_TYPE, **enqueue_options):
    registry.sync_definitions(engine)
    enqueue(engine, job_type, PAYLOAD, event_log=config.event_log, **enqueue_options)
    return claim_one(engine, worker_id=config.worker_id, lease_ttl_seconds=config.lease_ttl_seconds, job_type=job_type,
                     event_log=config.event_log)


def run_job(engine, registry, config=None, job_type=JOB_TYPE, **enqueue_options):
    """Enqueue, claim and process one job in this thread; return the claimed record."""
    config = config or fast_config()
    job = enqueue_and_claim(engine, registry, config, job_type, **enqueue_options)
    process_claimed_job(driver_for(engine), registry, job, config)
    return job


def in_thread(target, *args):
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def records(caplog, message):
    return [record for record in caplog.records if record.getMessage() == message]


def test_success_persists_running_then_succeeded_with_one_attempt(engine, probe, logs):
    with engine.begin() as conn:
        conn.execute(text(h.SIDE_EFFECTS_DDL))
    job = run_job(engine, h.registry_with(JOB_TYPE, h.record_side_effect(probe, engine)))
    assert side_effects(engine) == [(job.id, 1, "ran")]
    row = job_row(engine, job.id)
    assert (row.status, row.stage, row.worker_id, row.lease_expires_at) == ("SUCCEEDED", "completed", None, None)
    assert event_types(engine, job.id) == ["ENQUEUED", "LEASED", "STAGE_CHANGED", "SUCCEEDED"]
    [attempt] = attempts(engine, job.id)
    assert attempt.finished_at is not None and attempt.outcome is None
    assert attempt.execution_started_persisted_at is not None
    assert [(call.attempt, call.worker_id) for call in probe.calls] == [(1, "worker-test")]


# -- spec 14.3 / 14.4: the handler never runs when RUNNING is not persisted ------------


def side_effects(engine):
    return rows(engine, "SELECT job_id, attempt, note FROM side_effects")


def claim_then_process_alone(engine, registry, config):
    """The pool thread's own running write (a worker polling on a caller's connection)."""
    job = enqueue_and_claim(engine, registry, config)
    process_claimed_job(driver_for(engine), registry, job, config)
    return job


def claim_and_start_as_the_worker_does(engine, registry, config):
    """The polling thread's way: the running write sent with the claim; the pool thread gets its answer."""
    registry.sync_definitions(engine)
    enqueue(engine, JOB_TYPE, PAYLOAD, event_log=config.event_log)
    held = HeldConnection(engine)
    try:
        started = claim_and_start_jobs(held, worker_id=config.worker_id, lease_ttl_seconds=config.lease_ttl_seconds,
                                       limit=1, job_types=[JOB_TYPE], event_log=config.event_log)
    finally:
        held.close()
    [job] = started.running + started.unstarted
    process_claimed_job(driver_for(engine), registry, job, config, running=None if started.running else started.error)
    return job


#: Seed step 2 (mark running) has the same outcomes written alone or with its claim.
ways_to_mark_running = pytest.mark.parametrize("claim_and_process", [claim_then_process_alone,
                                                                     claim_and_start_as_the_worker_does])


def test_handler_does_not_run_when_the_lease_changed_owner_before_start(engine, probe, logs):
    with engine.begin() as conn:
        conn.execute(text(h.SIDE_EFFECTS_DDL))
    registry = h.registry_with(JOB_TYPE, h.record_side_effect(probe, engine), max_attempts=3)
    config = fast_config(worker_id="worker-slow")
    stale = enqueue_and_claim(engine, registry, config)
    # The slow worker's claim expired before it got going; the reaper handed it
    # back and another worker took it, with the same attempt number.
    expire_lease(engine, stale.id)
    reap_once(driver_for(engine), registry, config, threading.Event())
    other = claim_one(engine, worker_id="worker-fast")
    assert other.attempt == stale.attempt
    process_claimed_job(driver_for(engine), registry, stale, config)
    assert probe.calls == [] and side_effects(engine) == []
    row = job_row(engine, stale.id)
    assert (row.status, row.worker_id, row.stage) == ("LEASED", "worker-fast", "queued")
    assert "STAGE_CHANGED" not in event_types(engine, stale.id)
    assert records(logs, "aborting job before execution because lease ownership was already lost")


def test_an_attempt_that_never_started_is_counted_apart_in_the_workers_summary(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    config = fast_config(worker_id="worker-slow")
    stale = enqueue_and_claim(engine, registry, config)
    expire_lease(engine, stale.id)
    reap_once(driver_for(engine), registry, config, threading.Event())
    claim_one(engine, worker_id="worker-fast")
    tally = OutcomeTally("worker-slow")
    process_claimed_job(driver_for(engine), registry, stale, config, tally=tally)
    tally.report()
    [summary] = records(logs, "jobs processed")
    assert summary.by_outcome == {"not_started": 1} and probe.calls == []


def test_claimed_record_without_a_worker_id_is_fenced_as_unknown_worker_and_never_runs(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    config = fast_config(worker_id="worker-owner")
    claimed = enqueue_and_claim(engine, registry, config)
    anonymous = dataclasses.replace(claimed, worker_id=None)
    assert lease_identity(anonymous).worker_id == UNKNOWN_WORKER_ID == "unknown-worker"
    process_claimed_job(driver_for(engine), registry, anonymous, config)
    # The row belongs to worker-owner, so the running write under unknown-worker misses.
    assert probe.calls == []
    row = job_row(engine, claimed.id)
    assert (row.status, row.worker_id, row.stage) == ("LEASED", "worker-owner", "queued")
    assert "STAGE_CHANGED" not in event_types(engine, claimed.id)


def test_handler_does_not_run_when_running_cannot_be_persisted_and_the_claim_stays_leased(engine, probe, logs):
    with engine.begin() as conn:
        conn.execute(text(h.SIDE_EFFECTS_DDL))
    registry = h.registry_with(JOB_TYPE, h.record_side_effect(probe, engine))
    config = fast_config()
    job = enqueue_and_claim(engine, registry, config)
    unreachable = create_engine("postgresql+psycopg2://postgres@/nowhere?host=/nonexistent-socket-dir")
    try:
        process_claimed_job(driver_for(unreachable), registry, job, config)
    finally:
        unreachable.dispose()
    assert probe.calls == [] and side_effects(engine) == []
    row = job_row(engine, job.id)
    assert (row.status, row.stage, row.worker_id, row.attempt) == ("LEASED", "queued", "worker-test", 1)
    assert event_types(engine, job.id) == ["ENQUEUED", "LEASED"]
    assert records(logs, "running progress could not be persisted; leaving claim for reaper recovery")


@ways_to_mark_running
def test_running_persist_failure_releases_the_unstarted_claim_when_the_store_still_can(
    engine, probe, logs, claim_and_process,
):
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    config = fast_config()
    with engine.begin() as conn:
        conn.execute(text(
            "CREATE FUNCTION refuse_running() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.event_type = 'STAGE_CHANGED' THEN RAISE EXCEPTION 'disk full'; END IF; RETURN NEW; END $$"))
        conn.execute(text("CREATE TRIGGER refuse_running BEFORE INSERT ON job_events "
                          "FOR EACH ROW EXECUTE FUNCTION refuse_running()"))
    job = claim_and_process(engine, registry, config)
    assert probe.calls == []
    row = rows(engine, "SELECT status, attempt, worker_id, stage, next_run_at - now() AS wait FROM job_queue")[0]
    assert (row.status, row.attempt, row.worker_id, row.stage) == ("PENDING", 0, None, "queued")
    assert timedelta(milliseconds=500) < row.wait <= timedelta(seconds=1)
    assert events(engine, job.id)[-1] == ("REQUEUED", 1, {"reason": "RUNNING_PROGRESS_PERSIST_FAILED"})
    assert attempts(engine, job.id) == []


# -- spec 14.5 / 14.6: unstarted release once the worker has started the job ---------------


def test_release_unstarted_after_the_worker_persisted_running_is_not_applicable(engine, probe, logs):
    def body(ctx, payload, call):
        me = dict(job_id=ctx.job_id, run_number=ctx.run_number, attempt=ctx.attempt, worker_id=ctx.worker_id)
        try:
            release_unstarted_job_claim(engine, **me, reason="R", delay_ms=0)
        except errors.RunledgerError as error:
            probe.note(error.code)

    job = run_job(engine, h.registry_with(JOB_TYPE, h.scripted(probe, body)))
    assert probe.notes == ["job.unstarted_claim_release_not_applicable"]
    assert job_row(engine, job.id).status == "SUCCEEDED"
    assert [a.attempt for a in attempts(engine, job.id)] == [1]


def test_release_unstarted_by_a_non_owner_is_a_lease_mismatch(engine, probe, logs):
    def body(ctx, payload, call):
        try:
            release_unstarted_job_claim(engine, job_id=ctx.job_id, run_number=ctx.run_number,
                                                  attempt=ctx.attempt, worker_id="intruder", reason="R", delay_ms=0)
        except errors.RunledgerError as error:
            probe.note(error.code)

    job = run_job(engine, h.registry_with(JOB_TYPE, h.scripted(probe, body)))
    assert probe.notes == ["job.lease_owner_mismatch"]
    assert job_row(engine, job.id).status == "SUCCEEDED"


# -- spec 14.9-14.11: dead-letter hooks ---------------------------------------------------


@pytest.mark.parametrize("make_hook, message", [
    (h.hanging_hook, "dead-letter hook timed out; continuing worker job task"),
    (h.raising_hook, "dead-letter hook panicked; continuing worker job task"),
])
def test_dead_letter_hook_that_hangs_or_raises_does_not_hold_up_the_pipeline(engine, probe, logs, make_hook, message):
    registry = h.registry_with(JOB_TYPE, h.fail_terminal(probe), on_dead_letter=make_hook(probe))
    config = fast_config(dead_letter_hook_timeout_seconds=0.1)
    job = enqueue_and_claim(engine, registry, config)
    started = time.monotonic()
    process_claimed_job(driver_for(engine), registry, job, config)
    assert time.monotonic() - started < 3.0  # the hook hangs for 20 s
    assert len(probe.dead_letters) == 1
    assert job_row(engine, job.id).status == "DEAD_LETTERED"
    [record] = records(logs, message)
    assert (record.job_id, record.job_type, record.attempt) == (str(job.id), JOB_TYPE, 1)
    assert records(logs, message)


def test_dead_letter_hook_runs_once_after_the_dead_letter_is_committed(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.fail_terminal(probe, "test.broken", "no such customer"),
                               max_attempts=3, on_dead_letter=h.recording_hook(probe, engine))
    job = run_job(engine, registry, organization_id="org-1")
    [(ctx, payload, info, status_seen)] = probe.dead_letters
    assert status_seen == "DEAD_LETTERED"
    assert (ctx.job_id, ctx.attempt, ctx.worker_id, ctx.organization_id) == (job.id, 1, "worker-test", "org-1")
    assert payload == PAYLOAD
    assert info.failure == JobFailure.terminal("test.broken", "no such customer")
    assert (info.reason, info.max_attempts) == (JobDeadLetterReason.FAILURE_KIND_NON_RETRYABLE, 3)


def test_exhausted_retryable_failure_tells_the_hook_attempts_exhausted(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.fail_retryable(probe), max_attempts=1,
                               on_dead_letter=h.recording_hook(probe, engine))
    job = run_job(engine, registry)
    [(_, _, info, status_seen)] = probe.dead_letters
    assert status_seen == "DEAD_LETTERED"
    assert (info.reason, info.failure.kind, info.max_attempts) == (
        JobDeadLetterReason.ATTEMPTS_EXHAUSTED, JobFailureKind.RETRYABLE, 1)
    row = job_row(engine, job.id)
    assert (row.status, row.status_reason, row.last_error_code) == ("DEAD_LETTERED", "RETRYABLE", "test.retryable")
    [record] = records(logs, "job dead lettered after handler failure")
    assert (record.job_id, record.job_type, record.attempt, record.worker_id) == (
        str(job.id), JOB_TYPE, 1, "worker-test")
    assert (record.dead_letter_reason, record.failure_kind, record.max_attempts) == (
        "ATTEMPTS_EXHAUSTED", "RETRYABLE", 1)


def test_terminal_failure_tells_the_hook_non_retryable_with_the_attempt_budget(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.fail_terminal(probe), max_attempts=3,
                               on_dead_letter=h.recording_hook(probe))
    run_job(engine, registry)
    [(_, _, info, _)] = probe.dead_letters
    assert (info.reason, info.failure.kind, info.max_attempts) == (
        JobDeadLetterReason.FAILURE_KIND_NON_RETRYABLE, JobFailureKind.TERMINAL, 3)


def test_retry_does_not_call_the_dead_letter_hook(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.fail_retryable(probe), max_attempts=2,
                               on_dead_letter=h.recording_hook(probe))
    job = run_job(engine, registry)
    assert job_row(engine, job.id).status == "PENDING"
    assert probe.dead_letters == []


# -- spec 14.12-14.15: failures as the handler reported them --------------------------------


def test_handler_terminal_failure_coded_lease_owner_mismatch_is_persisted_normally(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.fail_terminal(probe, "job.lease_owner_mismatch", "upstream said so"))
    job = run_job(engine, registry)
    row = job_row(engine, job.id)
    assert (row.status, row.lease_expires_at, row.worker_id, row.last_error_code) == (
        "DEAD_LETTERED", None, None, "job.lease_owner_mismatch")
    assert rows(engine, "SELECT error_code FROM job_dead_letters") == [("job.lease_owner_mismatch",)]


def test_panic_is_recorded_as_panicked_with_failure_and_dead_letter_events(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.raise_error(probe, RuntimeError("boom")), max_attempts=5,
                               dead_letter_on=(RuntimeError,))
    job = run_job(engine, registry)
    [attempt] = attempts(engine, job.id)
    assert (attempt.outcome, attempt.error_code, attempt.error_message, attempt.retry_delay_ms) == (
        "PANICKED", "job.handler_panic", "RuntimeError: boom", None)
    failed, dead = events(engine, job.id)[-2:]
    assert failed == ("FAILED", 1, {"kind": "PANICKED", "error_code": "job.handler_panic",
                                    "error_message": "RuntimeError: boom", "stopped_by": "dead_letter_on"})
    assert dead == ("DEAD_LETTERED", 1, {"kind": "PANICKED", "error_code": "job.handler_panic",
                                         "stopped_by": "dead_letter_on"})
    assert job_row(engine, job.id).status == "DEAD_LETTERED"
    [panic_log] = records(logs, "job handler raised RuntimeError; the job is dead-lettered without a retry: "
                                "it is in dead_letter_on")
    assert panic_log.levelname == "ERROR"
    # The exception itself, for error trackers' logging integrations, and its type for log search.
    assert (type(panic_log.exc_info[1]), str(panic_log.exc_info[1]), panic_log.error_type) == (
        RuntimeError, "boom", "RuntimeError")


class Unprintable(Exception):
    def __str__(self):
        raise ValueError("no text for you")


def test_panic_whose_exception_cannot_be_printed_is_still_recorded_as_a_panic(engine, probe, logs):
    job = run_job(engine, h.registry_with(JOB_TYPE, h.raise_error(probe, Unprintable()), dead_letter_on=Unprintable))
    row = job_row(engine, job.id)
    assert (row.status, row.last_error_code, row.last_error_message) == (
        "DEAD_LETTERED", "job.handler_panic", "Unprintable: unprintable Unprintable")


def test_matching_retry_override_sets_the_retry_delay(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.fail_retryable(probe, "smtp.busy"), max_attempts=3,
                               retry_delay_overrides={"smtp.busy": 1_500})
    job = run_job(engine, registry)
    row = rows(engine, "SELECT status, next_run_at - now() AS wait FROM job_queue")[0]
    assert row.status == "PENDING"
    assert timedelta(milliseconds=1_000) < row.wait <= timedelta(milliseconds=1_500)
    [attempt] = attempts(engine, job.id)
    scheduled = events(engine, job.id)[-1]
    assert scheduled[0] == "RETRY_SCHEDULED"
    assert scheduled[2]["retry_delay_ms"] == attempt.retry_delay_ms == 1_500


def test_override_for_another_code_or_type_leaves_the_default_backoff(engine, probe, logs):
    registry = JobRegistry()
    registry.job(JOB_TYPE, max_attempts=3, retry_delay_overrides={"other.code": 1_500})(
        h.fail_retryable(probe, "smtp.busy"))
    registry.job("test.other", retry_delay_overrides={"smtp.busy": 1_500})(h.ok(probe))
    job = run_job(engine, registry)
    [attempt] = attempts(engine, job.id)
    assert attempt.retry_delay_ms == backoff.compute_retry_delay_ms(1, job.id)
    assert events(engine, job.id)[-1][2]["retry_delay_ms"] == attempt.retry_delay_ms


def test_override_is_ignored_for_a_terminal_failure(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.fail_terminal(probe, "smtp.busy"), max_attempts=3,
                               retry_delay_overrides={"smtp.busy": 1_500})
    job = run_job(engine, registry)
    assert job_row(engine, job.id).status == "DEAD_LETTERED"
    assert attempts(engine, job.id)[0].retry_delay_ms is None
    assert "RETRY_SCHEDULED" not in event_types(engine, job.id)


def test_exception_listed_in_retry_on_is_a_retryable_handler_exception(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.raise_error(probe, ConnectionError("db down")), max_attempts=3,
                               retry_on=(ConnectionError,))
    job = run_job(engine, registry)
    row = job_row(engine, job.id)
    assert (row.status, row.status_reason, row.last_error_code, row.last_error_message) == (
        "PENDING", "RETRYABLE", "job.handler_exception", "ConnectionError: db down")
    assert attempts(engine, job.id)[0].retry_delay_ms == backoff.compute_retry_delay_ms(1, job.id)


def test_exception_not_listed_in_retry_on_is_a_panic_and_never_retried(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.raise_error(probe, ValueError("bad input")), max_attempts=3,
                               retry_on=(ConnectionError,))
    job = run_job(engine, registry)
    row = job_row(engine, job.id)
    assert (row.status, row.status_reason, row.last_error_code) == ("DEAD_LETTERED", "PANICKED", "job.handler_panic")
    assert claim_jobs(engine, worker_id="w", lease_ttl_seconds=5, limit=1) == []


def test_handler_raising_system_exit_is_a_panic(engine, probe, logs):
    # Not an Exception: outside the default retry_on, so never retried.
    job = run_job(engine, h.registry_with(JOB_TYPE, h.kill_thread(probe)))
    row = job_row(engine, job.id)
    assert (row.status, row.last_error_code, row.last_error_message) == (
        "DEAD_LETTERED", "job.handler_panic", "SystemExit: handler thread killed")


@pytest.mark.parametrize("value", [{"not": "a completion"}, 42, "done"])
def test_handler_returning_a_wrong_type_is_terminal_invalid_result(engine, probe, logs, value):
    job = run_job(engine, h.registry_with(JOB_TYPE, h.wrong_return(probe, value), max_attempts=3))
    row = job_row(engine, job.id)
    assert (row.status, row.status_reason, row.last_error_code) == (
        "DEAD_LETTERED", "TERMINAL", "job.handler_invalid_result")
    # What to return instead, and the value's type only: the value may be anything the handler had.
    assert row.last_error_message == (
        f"Handler returned a {type(value).__name__}; return None for a plain success, or "
        "rl.JobCompletion(output=...) to keep a result (progress and checkpoint too); nothing was stored.")


@pytest.mark.parametrize("completion", [
    JobCompletion(output={"when": object()}),
    JobCompletion(checkpoint=float("nan")),
    JobCompletion(progress_done="3", progress_total=10),
    JobCompletion(progress_done=True),
])
def test_completion_with_non_json_or_non_int_fields_is_terminal_invalid_result(engine, probe, logs, completion):
    job = run_job(engine, h.registry_with(JOB_TYPE, h.ok(probe, completion), max_attempts=3))
    row = job_row(engine, job.id)
    assert (row.status, row.status_reason, row.last_error_code) == (
        "DEAD_LETTERED", "TERMINAL", "job.handler_invalid_result")
    assert "SUCCEEDED" not in event_types(engine, job.id)


def test_claimed_job_without_a_registered_handler_is_terminal_handler_not_registered(engine, logs):
    h.registry_with("test.orphan", lambda ctx, payload: None, max_attempts=3).sync_definitions(engine)
    enqueue(engine, "test.orphan", PAYLOAD)
    [job] = claim_prestart_jobs_for_types(engine, worker_id="worker-test", lease_ttl_seconds=5, limit=1,
                                                    job_types=["test.orphan"])
    process_claimed_job(driver_for(engine), JobRegistry(), job, fast_config())
    row = job_row(engine, job.id)
    assert (row.status, row.status_reason, row.last_error_code, row.last_error_message) == (
        "DEAD_LETTERED", "TERMINAL", "job.handler_not_registered", "No handler is registered for this job type.")


# -- progress and completion (spec 14.18, 14.19) ----------------------------------------------


def test_report_progress_persists_progress_and_checkpoint_under_the_lease(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.report_then_wait(probe, 3, 10, {"page": 3}))
    config = fast_config()
    job = enqueue_and_claim(engine, registry, config)
    worker = in_thread(process_claimed_job, driver_for(engine), registry, job, config)
    with probe.lock:
        assert probe.lock.wait_for(lambda: probe.notes, 10)
    row = job_row(engine, job.id)
    assert (row.status, row.progress_done, row.progress_total, float(row.progress_pct), row.checkpoint) == (
        "LEASED", 3, 10, 30.0, {"page": 3})
    assert ("PROGRESS", 1, {}) in events(engine, job.id)
    assert probe.notes == [("reported", {"page": 3})]
    probe.release.set()
    worker.join(10)
    row = job_row(engine, job.id)
    assert (row.status, row.progress_done, row.progress_total, row.checkpoint) == ("SUCCEEDED", 3, 10, {"page": 3})


def test_success_stores_progress_checkpoint_and_output_under_repeatable_read(engine, probe, logs):
    with engine.begin() as conn:
        conn.execute(text(f'ALTER DATABASE "{engine.url.database}" SET default_transaction_isolation = '
                          "'repeatable read'"))
    engine.dispose()

    def body(ctx, payload, call):
        with engine.connect() as conn:
            probe.note(conn.execute(text("SHOW transaction_isolation")).scalar())
        return JobCompletion(progress_done=2, progress_total=3, checkpoint={"cursor": "c2"}, output={"rows": 2})

    job = run_job(engine, h.registry_with(JOB_TYPE, h.scripted(probe, body)))
    assert probe.notes == ["repeatable read"]
    row = job_row(engine, job.id)
    assert (row.status, row.stage, row.progress_done, row.progress_total, row.checkpoint, row.output) == (
        "SUCCEEDED", "completed", 2, 3, {"cursor": "c2"}, {"rows": 2})
    assert events(engine, job.id)[-1][0] == "SUCCEEDED"


@pytest.mark.parametrize("reported, completion", [
    (None, JobCompletion(progress_done=5, progress_total=3)),
    ((5, 10), JobCompletion(progress_done=20)),
], ids=["done-over-total", "done-over-stored-total"])
def test_invalid_success_progress_dead_letters_terminal_and_is_never_replayed(engine, probe, logs, reported,
                                                                             completion):
    def body(ctx, payload, call):
        if reported:
            ctx.report_progress(*reported)
        return completion

    job = run_job(engine, h.registry_with(JOB_TYPE, h.scripted(probe, body), max_attempts=3))
    row = job_row(engine, job.id)
    assert (row.status, row.status_reason, row.last_error_code) == (
        "DEAD_LETTERED", "TERMINAL", "job.invalid_completion_progress")
    assert row.last_error_message.startswith("Handler returned invalid success progress")
    types = event_types(engine, job.id)
    assert "SUCCEEDED" not in types and "RETRY_SCHEDULED" not in types
    assert claim_jobs(engine, worker_id="w", lease_ttl_seconds=5, limit=1) == []
    assert len(attempts(engine, job.id)) == 1


# -- leases (spec 14.16, 14.17, 14.20, 14.21) --------------------------------------------------


def hand_on(engine, job_id) -> None:
    """What the reaper and another worker's claim leave: the job leased to someone else."""
    with engine.begin() as connection:
        connection.execute(text("UPDATE job_queue SET worker_id = 'another-worker' WHERE id = :id"), {"id": job_id})


def test_after_the_job_is_handed_on_every_worker_write_is_refused(engine, probe, logs):
    go = threading.Event()

    def body(ctx, payload, call):
        go.wait(10)
        try:
            ctx.report_progress(1, 2)
        except errors.LeaseOwnerMismatch as error:
            probe.note(error.code)
        return JobCompletion(output={"late": True})

    registry = h.registry_with(JOB_TYPE, h.scripted(probe, body))
    config = fast_config(lease_ttl_seconds=5, heartbeat_interval_seconds=4)  # no heartbeat during the test
    job = enqueue_and_claim(engine, registry, config)
    worker = in_thread(process_claimed_job, driver_for(engine), registry, job, config)
    probe.wait_calls(1)
    hand_on(engine, job.id)
    go.set()
    worker.join(10)
    assert probe.notes == ["job.lease_owner_mismatch"]
    assert records(logs, "failed to mark job success")
    for write in (
        lambda: heartbeat_job(engine, **identity(job), lease_ttl_seconds=5),
        lambda: complete_job_failure(engine, **identity(job), failure=JobFailure.retryable("a.b", "c"),
                                               retry_delay_ms=10),
    ):
        with pytest.raises(errors.LeaseOwnerMismatch):
            write()
    row = job_row(engine, job.id)
    assert (row.status, row.worker_id, row.output, row.progress_done) == ("LEASED", "another-worker", None, None)
    assert event_types(engine, job.id) == ["ENQUEUED", "LEASED", "STAGE_CHANGED"]


def test_heartbeat_waiting_on_a_row_lock_until_the_lease_expired_loses_the_lease(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.cooperative_sleep(probe))
    config = fast_config(lease_ttl_seconds=1, heartbeat_interval_seconds=0.3, heartbeat_lock_timeout_ms=10_000)
    job = enqueue_and_claim(engine, registry, config)
    worker = in_thread(process_claimed_job, driver_for(engine), registry, job, config)
    probe.wait_calls(1)
    with engine.connect() as holder:
        holder.execute(text("SELECT 1 FROM job_queue WHERE id = :id FOR UPDATE"), {"id": job.id})
        wait_until(lambda: lock_waiters(engine) >= 1)  # the heartbeat queues behind us
        wait_until(lambda: scalar(engine, "SELECT lease_expires_at < clock_timestamp() FROM job_queue"))
        holder.rollback()
    worker.join(10)
    [lost] = records(logs, "job processing aborted because durable lease maintenance was lost")
    assert (lost.failure_code, lost.job_id) == ("job.lease_owner_mismatch", str(job.id))
    assert probe.calls[0].cancel_reason == "lease_lost"
    row = job_row(engine, job.id)
    assert (row.status, row.worker_id) == ("LEASED", "worker-test")
    assert event_types(engine, job.id)[-1] in ("STAGE_CHANGED", "HEARTBEAT")
    assert attempts(engine, job.id)[0].finished_at is None


def test_handler_holding_its_own_row_lock_over_a_heartbeat_does_not_deadlock(engine, probe, logs):
    def body(ctx, payload, call):
        with engine.connect() as conn:
            conn.execute(text("SELECT 1 FROM job_queue WHERE id = :id FOR UPDATE"), {"id": ctx.job_id})
            probe.note(wait_until(lambda: lock_waiters(engine), timeout=5, what="a heartbeat waiting on the handler's lock"))
            conn.commit()

    config = fast_config(heartbeat_interval_seconds=0.2)
    job = run_job(engine, h.registry_with(JOB_TYPE, h.scripted(probe, body)), config)
    assert probe.notes and probe.notes[0] >= 1  # a heartbeat really waited on the handler's lock
    assert job_row(engine, job.id).status == "SUCCEEDED"
    assert "HEARTBEAT" in event_types(engine, job.id)


def test_heartbeat_stuck_past_its_lock_timeout_abandons_the_handler_and_the_reaper_recovers(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.cooperative_sleep(probe), max_attempts=3)
    config = fast_config(heartbeat_interval_seconds=0.2, heartbeat_lock_timeout_ms=200)
    job = enqueue_and_claim(engine, registry, config)
    worker = in_thread(process_claimed_job, driver_for(engine), registry, job, config)
    probe.wait_calls(1)
    with engine.connect() as holder:
        holder.execute(text("SELECT 1 FROM job_queue WHERE id = :id FOR UPDATE"), {"id": job.id})
        worker.join(10)  # the handler is told to stop while we still hold the lock
        holder.rollback()
    assert not worker.is_alive()
    [lost] = records(logs, "job processing aborted because durable lease maintenance was lost")
    assert lost.failure_code == "job.lease_maintenance_failed"
    assert probe.calls[0].cancelled_at is not None
    row = job_row(engine, job.id)
    assert (row.status, row.worker_id) == ("LEASED", "worker-test")
    assert attempts(engine, job.id)[0].outcome is None
    expire_lease(engine, job.id)
    reap_once(driver_for(engine), registry, config, threading.Event())
    row = job_row(engine, job.id)
    assert (row.status, row.attempt, row.last_error_code) == ("PENDING", 1, "job.lease_expired")
    assert attempts(engine, job.id)[0].outcome == "LEASE_EXPIRED"


# -- deadline and operator cancel -------------------------------------------------------------


def test_cooperative_handler_past_its_deadline_fails_with_a_retryable_timeout(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.cooperative_sleep(probe), max_attempts=3, timeout_seconds=1)
    config = fast_config(timeout_grace_seconds=5)
    job = enqueue_and_claim(engine, registry, config)
    started = time.monotonic()
    process_claimed_job(driver_for(engine), registry, job, config)
    elapsed = time.monotonic() - started
    assert 0.9 < elapsed < 3.0  # the deadline, not the 5 s grace
    [call] = probe.calls
    assert call.cancel_reason == "timeout" and 0.9 < call.cancelled_at - call.started < 2.0
    row = job_row(engine, job.id)
    assert (row.status, row.status_reason, row.last_error_code) == ("PENDING", "TIMEOUT", "job.timeout_exceeded")
    [attempt] = attempts(engine, job.id)
    assert (attempt.outcome, attempt.retry_delay_ms) == ("TIMEOUT", backoff.compute_retry_delay_ms(1, job.id))
    assert event_types(engine, job.id)[-2:] == ["FAILED", "RETRY_SCHEDULED"]


@pytest.mark.parametrize(("reason", "told"), [("operator said stop", "operator said stop"), (None, "CANCELED")])
def test_operator_cancel_missed_by_the_listener_reaches_the_handler_at_its_next_heartbeat(
        engine, probe, logs, reason, told):
    # No worker loop here, so no listener: the heartbeat is the fallback for a lost notification.
    def body(ctx, payload, call):
        if ctx.wait_cancelled(20):
            call.cancelled_at = time.monotonic()
        return JobCompletion(output={"late": True})  # returns normally: must still be discarded

    registry = h.registry_with(JOB_TYPE, h.scripted(probe, body))
    config = fast_config(heartbeat_interval_seconds=0.3)
    job = enqueue_and_claim(engine, registry, config)
    worker = in_thread(process_claimed_job, driver_for(engine), registry, job, config)
    probe.wait_calls(1)
    canceled_at = time.monotonic()
    cancel_job(engine, job.id, reason=reason)
    worker.join(10)
    [call] = probe.calls
    assert call.cancel_reason == told
    assert call.cancelled_at - canceled_at < 0.3 + 1.0  # one heartbeat interval, plus a loaded machine
    row = job_row(engine, job.id)
    assert (row.status, row.status_reason, row.output) == ("CANCELED", told, None)
    assert event_types(engine, job.id)[-1] == "CANCELED"
    assert attempts(engine, job.id)[0].outcome is None
    # A cancel is not a lost lease: one INFO line with the reason, no lease warning, no discarded-result warning.
    [line] = records(logs, "job canceled by operator")
    assert (line.levelno, line.reason, line.job_id) == (logging.INFO, told, str(job.id))
    assert [r.getMessage() for r in logs.records if r.levelno >= logging.WARNING] == []


@pytest.mark.parametrize(("handler", "expected"), [
    (h.ok, {"outcome": "succeeded"}),
    (lambda probe: h.fail_retryable(probe, "smtp.busy"),
     {"outcome": "retry_scheduled", "failure_kind": "RETRYABLE", "failure_code": "smtp.busy"}),
    (lambda probe: h.raise_error(probe, RuntimeError("boom")),
     {"outcome": "retry_scheduled", "failure_kind": "RETRYABLE", "failure_code": "job.handler_exception"}),
    (lambda probe: h.kill_thread(probe),
     {"outcome": "dead_lettered", "failure_kind": "PANICKED", "failure_code": "job.handler_panic"}),
])
def test_the_closing_log_line_says_how_the_attempt_ended(engine, probe, logs, handler, expected):
    logs.set_level(logging.DEBUG, logger="runledger_sync")  # one line a job costs too much above DEBUG
    job = run_job(engine, h.registry_with(JOB_TYPE, handler(probe), max_attempts=3))
    [closing] = records(logs, "job processed")
    assert {key: getattr(closing, key, None) for key in expected} == expected
    assert (closing.job_id, closing.attempt) == (str(job.id), 1)


# -- a running write whose commit outcome is unknown is read back, not guessed ----------


def test_a_running_write_of_unknown_outcome_that_landed_runs_the_handler(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    config = fast_config()
    job = enqueue_and_claim(engine, registry, config)
    # The one-query running write committed, but its connection went before the reply.
    mark_job_running(engine, lease_identity(job))
    process_claimed_job(driver_for(engine), registry, job, config, running=CommitOutcomeUnknown("reply lost"))
    assert len(probe.calls) == 1
    assert job_row(engine, job.id).status == "SUCCEEDED"
    assert [a.attempt for a in attempts(engine, job.id)] == [1]


def test_a_running_write_of_unknown_outcome_that_did_not_land_hands_the_claim_back(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    config = fast_config()
    job = enqueue_and_claim(engine, registry, config)
    process_claimed_job(driver_for(engine), registry, job, config, running=CommitOutcomeUnknown("connection lost"))
    assert probe.calls == []
    assert job_row(engine, job.id).status == "PENDING"
    assert events(engine, job.id)[-1] == ("REQUEUED", 1, {"reason": "RUNNING_PROGRESS_PERSIST_FAILED"})
    assert attempts(engine, job.id) == []


def test_a_grouped_success_refused_by_the_fence_is_logged_and_still_ends_the_attempt(engine, probe, logs):
    go = threading.Event()
    registry = h.registry_with(JOB_TYPE, h.scripted(probe, lambda ctx, payload, call: go.wait(10) and None))
    config = fast_config(lease_ttl_seconds=5, heartbeat_interval_seconds=4)  # no heartbeat during the test
    job = enqueue_and_claim(engine, registry, config)
    completer = Completer(driver_for(engine), "test-completer", finishing=FinishingSoon())
    ended = threading.Event()
    try:
        worker = threading.Thread(target=process_claimed_job, args=(driver_for(engine), registry, job, config, completer),
                                  kwargs={"on_ended": ended.set}, daemon=True)
        worker.start()
        probe.wait_calls(1)
        hand_on(engine, job.id)
        go.set()
        worker.join(10)
        # The completer's thread answers the attempt: refused, so logged, and its slot comes back.
        assert ended.wait(10)
    finally:
        completer.close()
    assert records(logs, "failed to mark job success")
    assert job_row(engine, job.id).status == "LEASED"
