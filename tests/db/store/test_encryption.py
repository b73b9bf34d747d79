"""Encryption at rest on real rows: every sealable column sealed, opened only by its row and key."""

from __future__ import annotations

import base64
import os
from typing import Any, Iterator

import pytest
from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.core.encryption import SealedValue, active_encryption
from runledger_sync.core.records import JobSpec
from runledger_sync.core.types import JobCompletion, JobFailure
from runledger_sync.store.admin.jobs import get_dead_letter, get_job
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success, release_unstarted_job_claim
from runledger_sync.store.attempt.running import update_job_progress
from runledger_sync.store.claim.start import claim_and_start_jobs
from runledger_sync.store.enqueue.enqueue import enqueue, enqueue_many
from runledger_sync.store.maintenance.schedule_tick import fire_due_schedules
from runledger_sync.store.queues import explain_wait
from runledger_sync.store.rotation import rotate_encryption, stale_counts
from runledger_sync.store.workflows.enqueue import enqueue_workflow
from tests.support import JOB_TYPE, define, identity, rows, scalar

SECRET = "secret-ssn-078-05-1120"
NEW_KEY, OLD_KEY = os.urandom(32), os.urandom(32)


def keys(*ids: str, current: str | None = None) -> rl.Encryption:
    chosen = {"2026-12": NEW_KEY, "2026-06": OLD_KEY}
    return rl.Encryption(keys={i: chosen[i] for i in ids}, current=current or ids[0])


@pytest.fixture(autouse=True)
def encryption() -> Iterator[None]:
    before = active_encryption()
    rl.configure_encryption(keys("2026-12", "2026-06"))
    yield
    rl.configure_encryption(before)


def claim(held: Any, limit: int = 10) -> Any:
    return claim_and_start_jobs(held, worker_id="w", lease_ttl_seconds=30, limit=limit, job_types=[JOB_TYPE])


def workflow() -> rl.Workflow:
    made = rl.Workflow("wf", idempotency_key="wf-1")
    made.job("a", "step.job", {"ssn": SECRET})
    made.external("approval")
    return made


def every_text_value(engine: Any) -> list[tuple[str, str, str]]:
    """Every text, jsonb, json, bytea and text[] value of every table in the public schema, as text."""
    columns = rows(engine, """
        SELECT table_name, column_name FROM information_schema.columns
        WHERE table_schema = 'public' AND (data_type IN ('text', 'jsonb', 'json', 'bytea', 'character varying')
                                           OR udt_name = '_text')""")
    found = []
    with engine.connect() as connection:
        for table, column in columns:
            values = connection.execute(text(f'SELECT "{column}"::text FROM "{table}" WHERE "{column}" IS NOT NULL'))
            found += [(table, column, value) for (value,) in values]
    return found


def test_an_enqueued_payload_is_sealed_in_its_column_and_read_back_clear(held, engine):
    job = enqueue(engine, JOB_TYPE, {"ssn": SECRET})
    stored = scalar(engine, "SELECT payload::text FROM job_queue WHERE id = :id", id=job.id)
    assert SECRET not in stored and stored.startswith('{"$rl.enc": ["2026-12", ')
    assert job.payload == {"ssn": SECRET}
    assert get_job(engine, job.id).payload == {"ssn": SECRET}
    [started] = claim(held).running
    assert started.payload == {"ssn": SECRET}


def test_a_full_lifecycle_leaves_the_secret_in_no_column_of_any_table(held, engine):
    define(engine, "step.job")
    # Enqueue with an idempotency key (and its repeat), a checkpoint, an output, a dead letter, a workflow step.
    first = enqueue(engine, JOB_TYPE, {"ssn": SECRET}, idempotency_key="k-1")
    assert enqueue(engine, JOB_TYPE, {"ssn": SECRET}, idempotency_key="k-1").id == first.id
    with pytest.raises(rl.errors.IdempotencyConflict):
        enqueue(engine, JOB_TYPE, {"ssn": SECRET + "x"}, idempotency_key="k-1")
    failing = enqueue(engine, JOB_TYPE, {"ssn": SECRET}, max_attempts=1)
    enqueue(engine, JOB_TYPE, {"ssn": SECRET}, unique=rl.Unique())
    jobs = {job.id: job for job in claim(held).running}
    assert jobs[first.id].payload == {"ssn": SECRET}
    update_job_progress(engine, **identity(jobs[first.id]), progress_done=1, checkpoint={"cursor": SECRET})
    complete_job_success(engine, **identity(jobs[first.id]),
                         completion=JobCompletion(output={"result": SECRET}, checkpoint={"cursor": SECRET}))
    complete_job_failure(engine, **identity(jobs[failing.id]),
                         failure=JobFailure.terminal("test.failed", "no"), retry_delay_ms=None)
    run = enqueue_workflow(engine, workflow())
    assert enqueue_workflow(engine, workflow()).id == run.id
    more = rl.WorkflowAppend(window="approval")
    more.job("b", "step.job", {"ssn": SECRET})
    rl.append_workflow_steps(engine, run.id, more, mutation_key="more-1")
    rl.append_workflow_steps(engine, run.id, more, mutation_key="more-1")  # a retried append, compared by digest
    rl.complete_external_step(engine, run.id, "approval", output={"by": SECRET})
    rl.complete_external_step(engine, run.id, "approval", output={"by": SECRET})  # the same answer again

    assert [value for value in every_text_value(engine) if SECRET in value[2]] == []
    assert get_job(engine, first.id).output == {"result": SECRET}
    assert get_job(engine, first.id).checkpoint == {"cursor": SECRET}
    assert get_dead_letter(engine, failing.id).payload_snapshot == {"ssn": SECRET}
    step_job_id = scalar(engine, "SELECT job_id FROM workflow_steps WHERE run_id = :id", id=run.id)
    assert get_job(engine, step_job_id).payload == {"ssn": SECRET}
    step_jobs = claim_and_start_jobs(held, worker_id="w", lease_ttl_seconds=30, limit=10,
                                     job_types=["step.job"]).running
    assert [job.payload for job in step_jobs] == [{"ssn": SECRET}] * 2
    for step_job in step_jobs:
        complete_job_success(engine, **identity(step_job), completion=JobCompletion(output={"step": SECRET}))
    outputs = {step.key: step.output for step in rl.get_workflow_run(engine, run.id).steps}
    assert outputs == {"a": {"step": SECRET}, "b": {"step": SECRET}, "approval": {"by": SECRET}}
    # A batch whose member succeeds enqueues both callbacks; a replay; a bulk cancel; a schedule's fire.
    batch = rl.open_batch(engine, on_success=(JOB_TYPE, {"ssn": SECRET}), on_complete=(JOB_TYPE, {"to": SECRET}))
    member = enqueue(engine, JOB_TYPE, {"ssn": SECRET}, batch=batch.id)
    rl.close_batch(engine, batch.id)
    [started_member] = claim(held).running
    assert started_member.id == member.id
    complete_job_success(engine, **identity(started_member), completion=JobCompletion(output={"m": SECRET}))
    done = rl.get_batch(engine, batch.id)
    assert (done.status, done.on_success.payload, done.on_complete.payload) == (
        rl.BatchStatus.SUCCEEDED, {"ssn": SECRET}, {"to": SECRET})
    assert get_job(engine, done.on_success_job_id).payload == {"ssn": SECRET, "batch_id": str(batch.id)}
    assert get_job(engine, done.on_complete_job_id).payload == {"to": SECRET, "batch_id": str(batch.id)}
    rl.replay_job(engine, first.id, replay_key="again-1", reason="operator replay")
    assert get_job(engine, first.id).payload == {"ssn": SECRET}
    assert rl.cancel_jobs(engine, rl.JobFilter(job_types=[JOB_TYPE], statuses=["PENDING"]),
                          reason="bulk cancel").changed == 3
    rl.upsert_schedule(engine, "nightly", cron_expr="0 3 * * *", job_type="step.job",
                       payload_template={"ssn": SECRET})
    assert rl.get_schedule(engine, "nightly").payload_template == {"ssn": SECRET}
    make_due(engine, "nightly")
    assert fire_due_schedules(engine, limit=10).fired == 1
    [fired] = claim_and_start_jobs(held, worker_id="w", lease_ttl_seconds=30, limit=10,
                                   job_types=["step.job"]).running
    assert fired.payload["ssn"] == SECRET and fired.payload["_schedule"]["schedule_name"] == "nightly"
    # The scan finds the secret where it is in clear: a clear job's payload.
    rl.configure_encryption(None)
    enqueue(engine, JOB_TYPE, {"ssn": SECRET})
    assert {(table, column) for table, column, value in every_text_value(engine) if SECRET in value} == {
        ("job_queue", "payload")}


def make_due(engine: Any, name: str) -> None:
    with engine.begin() as connection:
        connection.execute(text("UPDATE job_schedules SET next_fire_at = now() - interval '1 second' "
                                "WHERE name = :name"), {"name": name})


def test_batch_callbacks_are_sealed_for_their_jobs_and_shown_only_where_the_key_is(held, engine):
    batch = rl.open_batch(engine, on_success=(JOB_TYPE, {"ssn": SECRET}), on_complete=(JOB_TYPE, {}))
    stored = rows(engine, "SELECT on_success_payload::text, on_complete_payload::text FROM job_batches")
    assert all(value.startswith('{"$rl.enc": ["2026-12", ') for value in stored[0])
    assert (batch.on_success.payload, batch.on_complete.payload) == ({"ssn": SECRET}, {})
    rl.configure_encryption(keys("2026-06"))
    shown = rl.get_batch(engine, batch.id)
    assert shown.on_success.payload == SealedValue("2026-12") and shown.on_success.job_type == JOB_TYPE
    # A process without the key closes the batch: the trigger copies the sealed payloads to the callback jobs.
    done = rl.close_batch(engine, batch.id)
    rl.configure_encryption(keys("2026-12"))
    assert get_job(engine, done.on_success_job_id).payload == {"ssn": SECRET, "batch_id": str(batch.id)}
    assert {job.id: job.payload for job in claim(held).running} == {
        done.on_success_job_id: {"ssn": SECRET, "batch_id": str(batch.id)},
        done.on_complete_job_id: {"batch_id": str(batch.id)}}


def test_a_failed_batch_keeps_its_unsent_on_success_payload_readable(held, engine):
    batch = rl.open_batch(engine, on_success=(JOB_TYPE, {"ssn": SECRET}), on_complete=(JOB_TYPE, {"n": 1}))
    member = enqueue(engine, JOB_TYPE, {"n": 0}, batch=batch.id, max_attempts=1)
    rl.close_batch(engine, batch.id)
    [started] = claim(held).running
    complete_job_failure(engine, **identity(started), failure=JobFailure.terminal("test.failed", "no"),
                         retry_delay_ms=None)
    done = rl.get_batch(engine, batch.id)
    assert (done.status, done.on_success_job_id, done.on_success.payload) == (
        rl.BatchStatus.COMPLETED_WITH_ERRORS, None, {"ssn": SECRET})
    assert [job.id for job in claim(held).running] == [done.on_complete_job_id]
    assert member.id != done.on_complete_job_id


def test_a_schedule_template_is_sealed_and_a_scheduler_without_its_key_leaves_the_fire_due(held, engine):
    schedule = rl.upsert_schedule(engine, "nightly", cron_expr="0 3 * * *", job_type=JOB_TYPE,
                                  payload_template={"ssn": SECRET})
    stored = scalar(engine, "SELECT payload_template::text FROM job_schedules WHERE id = :id", id=schedule.id)
    assert SECRET not in stored and stored.startswith('{"$rl.enc": ["2026-12", ')
    assert schedule.payload_template == {"ssn": SECRET}
    assert [s.payload_template for s in rl.list_schedules(engine)] == [{"ssn": SECRET}]
    make_due(engine, "nightly")
    rl.configure_encryption(keys("2026-06"))
    assert rl.get_schedule(engine, "nightly").payload_template == SealedValue("2026-12")
    tick = fire_due_schedules(engine, limit=10)
    assert (tick.fired, [(f.name, f.code) for f in tick.failed]) == (0, [("nightly", "encryption.key_missing")])
    assert scalar(engine, "SELECT count(*) FROM job_queue") == 0
    assert scalar(engine, "SELECT next_fire_at > now() AND next_fire_at < now() + interval '31 seconds' "
                          "FROM job_schedules") is True
    # A scheduler holding the key fires it when it is due again.
    rl.configure_encryption(keys("2026-12"))
    make_due(engine, "nightly")
    assert fire_due_schedules(engine, limit=10).fired == 1
    [started] = claim(held).running
    assert started.payload["ssn"] == SECRET
    assert rl.trigger_schedule(engine, "nightly").payload["ssn"] == SECRET


def test_rotation_seals_clear_batch_callbacks_and_schedule_templates(held, engine):
    rl.configure_encryption(None)
    batch = rl.open_batch(engine, on_success=(JOB_TYPE, {"ssn": SECRET}), on_complete=(JOB_TYPE, {"to": SECRET}))
    rl.upsert_schedule(engine, "nightly", cron_expr="0 3 * * *", job_type=JOB_TYPE, payload_template={"ssn": SECRET})
    rl.configure_encryption(keys("2026-06"))
    rl.upsert_schedule(engine, "weekly", cron_expr="0 3 * * 1", job_type=JOB_TYPE, payload_template=[SECRET])
    rl.configure_encryption(keys("2026-12", "2026-06"))
    assert {k: v for k, v in stale_counts(engine).items() if v} == {"job_batches": 1, "job_schedules": 2}
    assert rotate_encryption(engine, batch_size=1) == 3
    assert [value for value in every_text_value(engine) if SECRET in value[2]] == []
    rl.configure_encryption(keys("2026-12"))
    assert rl.get_schedule(engine, "weekly").payload_template == [SECRET]
    assert rl.get_batch(engine, batch.id).on_success.payload == {"ssn": SECRET}
    # The rotated clear callbacks took their batch id before sealing, as the trigger would have added it.
    done = rl.close_batch(engine, batch.id)
    assert get_job(engine, done.on_complete_job_id).payload == {"to": SECRET, "batch_id": str(batch.id)}
    make_due(engine, "nightly")
    assert fire_due_schedules(engine, limit=10).fired == 1


def test_a_ciphertext_copied_to_another_row_does_not_open_there(held, engine):
    source, target = enqueue_many(engine, [JobSpec(JOB_TYPE, {"ssn": SECRET}), JobSpec(JOB_TYPE, {"other": 1})])
    with engine.begin() as connection:
        connection.execute(text("UPDATE job_queue SET payload = (SELECT payload FROM job_queue WHERE id = :s) "
                                "WHERE id = :t"), {"s": source.id, "t": target.id})
    assert get_job(engine, target.id).payload == SealedValue("2026-12", "invalid")
    assert get_job(engine, source.id).payload == {"ssn": SECRET}


def test_a_claim_under_a_missing_key_is_not_started_and_goes_back_unspent(held, engine):
    job = enqueue(engine, JOB_TYPE, {"ssn": SECRET})
    rl.configure_encryption(keys("2026-06"))
    batch = claim(held)
    assert batch.running == []
    [unstarted] = batch.unstarted
    assert unstarted.payload == SealedValue("2026-12")
    assert scalar(engine, "SELECT stage FROM job_queue WHERE id = :id", id=job.id) != "running"
    release_unstarted_job_claim(engine, **identity(unstarted), reason=str(unstarted.payload), delay_ms=60_000)
    assert rows(engine, "SELECT status, attempt FROM job_queue WHERE id = :id", id=job.id) == [("PENDING", 0)]
    wait = explain_wait(engine, job.id)
    assert wait.reason is rl.WaitReason.ENCRYPTION_KEY_MISSING
    assert wait.message.startswith("encryption key 2026-12 missing")


def test_a_process_without_any_keys_sees_the_key_it_lacks(held, engine):
    job = enqueue(engine, JOB_TYPE, {"ssn": SECRET})
    rl.configure_encryption(None)
    assert str(get_job(engine, job.id).payload) == "encryption key 2026-12 missing"
    assert [j.id for j in claim(held).unstarted] == [job.id]


def test_idempotent_repeats_compare_a_keyed_digest_whatever_the_key_order(held, engine):
    first = enqueue(engine, JOB_TYPE, {"a": 1, "b": SECRET}, idempotency_key="k")
    stored = scalar(engine, "SELECT enqueue_request::text FROM job_queue WHERE id = :id", id=first.id)
    assert stored.startswith('{"$rl.digest": ["2026-12", ')
    assert enqueue(engine, JOB_TYPE, {"b": SECRET, "a": 1.0}, idempotency_key="k").id == first.id
    with pytest.raises(rl.errors.IdempotencyConflict):
        enqueue(engine, JOB_TYPE, {"a": 2, "b": SECRET}, idempotency_key="k")


def test_rotation_seals_clear_rows_and_moves_old_keys_to_the_current_one(held, engine):
    rl.configure_encryption(None)
    clear = enqueue(engine, JOB_TYPE, {"ssn": SECRET}, idempotency_key="clear")
    rl.configure_encryption(keys("2026-06"))
    old = enqueue(engine, JOB_TYPE, {"ssn": SECRET + "-old"})
    rl.configure_encryption(keys("2026-12", "2026-06"))
    assert stale_counts(engine)["job_queue"] == 2
    assert rotate_encryption(engine, batch_size=1) == 2
    assert stale_counts(engine)["job_queue"] == 0
    assert rotate_encryption(engine) == 0
    assert [value for value in every_text_value(engine) if SECRET in value[2]] == []
    rl.configure_encryption(keys("2026-12"))
    assert get_job(engine, old.id).payload == {"ssn": SECRET + "-old"}
    assert get_job(engine, clear.id).payload == {"ssn": SECRET}
    # The clear snapshot became a digest that still matches its request.
    assert enqueue(engine, JOB_TYPE, {"ssn": SECRET}, idempotency_key="clear").id == clear.id


def test_turning_encryption_off_writes_clear_again_and_reads_the_sealed_rows(held, engine):
    sealed = enqueue(engine, JOB_TYPE, {"n": 1})
    rl.configure_encryption(keys("2026-12"))
    clear_later = enqueue(engine, JOB_TYPE, {"n": 2})
    assert {job.payload["n"] for job in claim(held).running} == {1, 2}
    assert sealed.id != clear_later.id


@pytest.mark.parametrize(("entry", "current"), [
    ("a:" + base64.b64encode(b"short").decode(), "a"),
    ("a:not-base64!!", "a"),
    ("a:" + base64.b64encode(b"k" * 32).decode(), "b"),
    ("no-colon", ""),
])
def test_bad_keys_from_the_environment_are_refused_with_their_code(entry, current):
    with pytest.raises(rl.errors.InvalidEncryptionKey) as refused:
        rl.Encryption.from_env({"RUNLEDGER_ENCRYPTION_KEYS": entry, "RUNLEDGER_ENCRYPTION_CURRENT": current})
    assert refused.value.code == "encryption.invalid_key"


def test_keys_from_the_environment_seal_and_open():
    key = base64.b64encode(NEW_KEY).decode()
    other = base64.b64encode(OLD_KEY).decode()
    made = rl.Encryption.from_env({"RUNLEDGER_ENCRYPTION_KEYS": f"2026-12:{key}, 2026-06:{other}",
                                   "RUNLEDGER_ENCRYPTION_CURRENT": "2026-06"})
    assert made.current == "2026-06" and made.key_ids == {"2026-12", "2026-06"}
    from uuid import uuid4

    row = uuid4()
    assert made.open(made.seal('{"a":1}', row), row) == '{"a":1}'
    with pytest.raises(rl.errors.DecryptionFailed):
        made.open(made.seal('{"a":1}', row), uuid4())
