"""Hostile text in failures and outputs: a failure is always recorded, an output never merged.

A lone surrogate (what Python makes of a badly encoded file name) or a NUL in
a failure's message or code used to make the failure write raise inside the
driver: the failure was never recorded, the lease expired and the job ended as
``job.lease_expired``. These tests run real workers against a real PostgreSQL
and read back what was stored. Outputs and checkpoints whose keys json.dumps
would write as strings ({1: "a", "1": "b"} becoming {"1": "b"}) are refused.
"""

from __future__ import annotations

import logging
import os

import pytest

import runledger_sync as rl
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success
from runledger_sync.store.attempt.running import update_job_progress
from tests.db.test_bad_input_api import table_digest
from tests.handlers import fast_config
from tests.support import attempts, claim_one, define, events, identity, run_worker_until

JOB_TYPE = "hostile.failure"


@pytest.fixture(autouse=True)
def no_captured_surrogates(caplog):
    # pytest keeps the worker's log records as given, lone surrogates included,
    # and a report holding one cannot be sent between test processes (xdist).
    caplog.set_level(logging.CRITICAL, logger="runledger_sync")
# A file name whose last byte is not UTF-8, decoded the way os.listdir decodes it.
BAD_NAME = os.fsdecode(b"report-\xff.csv")
assert "\udcff" in BAD_NAME


def _finished(engine, job_id):
    job = rl.get_job(engine, job_id)
    return job is not None and job.status in (rl.JobStatus.DEAD_LETTERED, rl.JobStatus.PENDING) and job.attempt >= 1


def _run(engine, handler, *, max_attempts=1, **rules):
    registry = rl.JobRegistry()
    registry.job(JOB_TYPE, max_attempts=max_attempts, **rules)(handler)
    registry.sync_definitions(engine)
    job = rl.enqueue(engine, JOB_TYPE, {"n": 1})
    run_worker_until(engine, registry, fast_config(reaper_retry_delay_ms=60_000),
                     lambda: _finished(engine, job.id) and attempts(engine, job.id)[-1].finished_at is not None)
    return rl.get_job(engine, job.id)


def test_a_surrogate_in_a_handler_exception_is_recorded_as_the_panic_it_was(engine):
    def handler(ctx, payload):
        raise ValueError(f"cannot parse {BAD_NAME}")

    job = _run(engine, handler, dead_letter_on=ValueError)

    assert job.status is rl.JobStatus.DEAD_LETTERED
    assert job.last_error_code == "job.handler_panic"
    assert job.last_error_message == "ValueError: cannot parse report-\ufffd.csv"
    [attempt] = attempts(engine, job.id)
    assert (attempt.outcome, attempt.error_code) == ("PANICKED", "job.handler_panic")
    failed = [payload for kind, _, payload in events(engine, job.id) if kind == "FAILED"]
    assert failed[0]["error_message"] == job.last_error_message
    letter = rl.get_dead_letter(engine, job.id)
    assert (letter.error_code, letter.error_message) == ("job.handler_panic", job.last_error_message)


class UploadRefused(Exception):
    pass


def test_a_surrogate_in_a_retryable_error_is_recorded_and_the_job_retries(engine):
    def handler(ctx, payload):
        raise UploadRefused(f"upload of {BAD_NAME} refused")

    job = _run(engine, handler, max_attempts=3, retry_on=UploadRefused)

    assert job.status is rl.JobStatus.PENDING
    assert job.last_error_code == "job.handler_exception"
    assert job.last_error_message == "UploadRefused: upload of report-\ufffd.csv refused"
    assert [a.outcome for a in attempts(engine, job.id)] == ["RETRYABLE"]


def test_nul_in_a_job_failure_code_and_message_is_recorded_marked(engine):
    def handler(ctx, payload):
        raise rl.JobFailure.terminal("upstream.\x00bad", "reply was \x00\x00 and " + BAD_NAME)

    job = _run(engine, handler)

    assert job.status is rl.JobStatus.DEAD_LETTERED
    assert job.last_error_code == "upstream.\\x00bad"
    assert job.last_error_message == "reply was \\x00\\x00 and report-\ufffd.csv"
    assert [a.error_code for a in attempts(engine, job.id)] == ["upstream.\\x00bad"]


@pytest.mark.parametrize("code", [5, "", "c" * 256], ids=["not-text", "blank", "too-long"])
def test_a_job_failure_whose_code_cannot_be_stored_ends_terminal_not_lost(engine, code):
    def handler(ctx, payload):
        raise rl.JobFailure.retryable(code, "the real reason")

    job = _run(engine, handler, max_attempts=3)

    assert job.status is rl.JobStatus.DEAD_LETTERED
    assert job.last_error_code == "job.handler_invalid_result"
    assert job.last_error_message.startswith("Handler raised a JobFailure whose failure.code must be ")
    assert job.last_error_message.endswith(": the real reason")


def test_the_store_records_a_hostile_failure_given_directly(engine):
    define(engine, JOB_TYPE, max_attempts=2)
    rl.enqueue(engine, JOB_TYPE, {})
    claimed = claim_one(engine, job_type=JOB_TYPE)

    stored = complete_job_failure(
        engine, **identity(claimed), retry_delay_ms=60_000,
        failure=rl.JobFailure.retryable("c\udcff\x00", "m\ud800\x00"),
    )

    assert stored.status is rl.JobStatus.PENDING
    assert (stored.last_error_code, stored.last_error_message) == ("c\ufffd\\x00", "m\ufffd\\x00")
    failed = [payload for kind, _, payload in events(engine, claimed.id) if kind == "FAILED"]
    assert failed == [{"kind": "RETRYABLE", "error_code": "c\ufffd\\x00", "error_message": "m\ufffd\\x00"}]


# -- outputs and checkpoints: refused, never merged ---------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [("output", {1: "a", "1": "b"}), ("checkpoint", {None: "x", "null": "y"}), ("output", [10**5000])],
    ids=["output-int-key", "checkpoint-none-key", "output-huge-int"],
)
def test_the_store_refuses_an_output_or_checkpoint_jsonb_would_change(engine, field, value):
    define(engine, JOB_TYPE)
    rl.enqueue(engine, JOB_TYPE, {})
    claimed = claim_one(engine, job_type=JOB_TYPE)
    before = table_digest(engine)

    with pytest.raises(rl.InvalidPayload) as caught:
        complete_job_success(engine, **identity(claimed), completion=rl.JobCompletion(**{field: value}))

    assert caught.value.code == "job.invalid_payload"
    assert table_digest(engine) == before


def test_progress_with_a_checkpoint_holding_a_non_string_key_is_refused(engine):
    define(engine, JOB_TYPE)
    rl.enqueue(engine, JOB_TYPE, {})
    claimed = claim_one(engine, job_type=JOB_TYPE)
    before = table_digest(engine)

    with pytest.raises(rl.InvalidPayload):
        update_job_progress(engine, **identity(claimed), progress_done=1, progress_total=2,
                                      checkpoint={2: "page"})

    assert table_digest(engine) == before


def test_a_handler_returning_an_output_with_int_keys_ends_terminal_with_its_reason(engine):
    def handler(ctx, payload):
        return rl.JobCompletion(output={1: "a", "1": "b"})

    job = _run(engine, handler, max_attempts=3)

    assert job.status is rl.JobStatus.DEAD_LETTERED
    assert job.last_error_code == "job.handler_invalid_result"
    assert "key of type int" in job.last_error_message
    assert job.output is None
