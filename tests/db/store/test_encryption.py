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
    rl.complete_external_step(engine, run.id, "approval", output={"by": SECRET})
    rl.complete_external_step(engine, run.id, "approval", output={"by": SECRET})  # the same answer again

    assert [value for value in every_text_value(engine) if SECRET in value[2]] == []
    assert get_job(engine, first.id).output == {"result": SECRET}
    assert get_job(engine, first.id).checkpoint == {"cursor": SECRET}
    assert get_dead_letter(engine, failing.id).payload_snapshot == {"ssn": SECRET}
    step_job_id = scalar(engine, "SELECT job_id FROM workflow_steps WHERE run_id = :id", id=run.id)
    assert get_job(engine, step_job_id).payload == {"ssn": SECRET}
    [step_job] = claim_and_start_jobs(held, worker_id="w", lease_ttl_seconds=30, limit=10,
                                      job_types=["step.job"]).running
    assert step_job.payload == {"ssn": SECRET}
    complete_job_success(engine, **identity(step_job), completion=JobCompletion(output={"step": SECRET}))
    outputs = {step.key: step.output for step in rl.get_workflow_run(engine, run.id).steps}
    assert outputs == {"a": {"step": SECRET}, "approval": {"by": SECRET}}
    # The scan finds the secret where it is in clear: a clear job's payload.
    rl.configure_encryption(None)
    enqueue(engine, JOB_TYPE, {"ssn": SECRET})
    assert {(table, column) for table, column, value in every_text_value(engine) if SECRET in value} == {
        ("job_queue", "payload")}


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
