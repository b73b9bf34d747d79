"""A checkpoint is bounded like a payload: one over the payload limit is refused with its code, and the stored one stays.

A job's checkpoint is read back whole with the job at every run, as its
payload is, so it has the payload's limit (``JobsConfig.max_payload_bytes``,
1 MiB by default), wherever it is written: a progress report, a success, a
continuation.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import runledger_sync as rl
from runledger_sync.errors import CheckpointTooLarge
from runledger_sync.store.attempt.ends import complete_job_success
from runledger_sync.store.attempt.outcomes import apply_transitions
from tests.support import write_successes
from runledger_sync.store.attempt.running import update_job_progress
from runledger_sync.core.outcomes import Continue
from runledger_sync.core.records import LeaseIdentity
from tests.handlers import fast_config
from tests.support import claim_one, define, identity, run_worker_until

JOB_TYPE = "import.pages"
LIMIT = 1_048_576
OVER = {"pages": "x" * LIMIT}          # a byte or so over 1 MiB of JSON
UNDER = {"pages": "x" * (LIMIT - 20)}  # within it
SAVED = {"page": 7}


def leased_with_checkpoint(engine: Any) -> tuple[Any, dict[str, Any]]:
    define(engine, JOB_TYPE, max_attempts=3)
    job = rl.enqueue(engine, JOB_TYPE, {})
    lease = identity(claim_one(engine, job_type=JOB_TYPE))
    update_job_progress(engine, **lease, checkpoint=SAVED)
    return job, lease


def assert_refused(raised: pytest.ExceptionInfo[CheckpointTooLarge]) -> None:
    assert raised.value.code == "job.checkpoint_too_large"
    assert isinstance(raised.value, rl.InvalidPayload)
    assert f"at most {LIMIT} bytes of JSON" in raised.value.message and "xxxx" not in raised.value.message


def test_a_progress_report_with_a_checkpoint_over_the_payload_limit_is_refused_and_the_stored_one_stays(engine):
    job, lease = leased_with_checkpoint(engine)

    with pytest.raises(CheckpointTooLarge) as raised:
        update_job_progress(engine, **lease, progress_done=1, checkpoint=OVER)

    assert_refused(raised)
    stored = rl.get_job(engine, job.id)
    assert (stored.checkpoint, stored.progress_done) == (SAVED, None)   # nothing of the report was written
    update_job_progress(engine, **lease, checkpoint=UNDER)
    assert rl.get_job(engine, job.id).checkpoint == UNDER
    # The limit is the worker's payload limit, given by the caller as enqueue's is.
    update_job_progress(engine, **lease, checkpoint=OVER, max_checkpoint_bytes=2 * LIMIT)
    assert rl.get_job(engine, job.id).checkpoint == OVER


@pytest.mark.parametrize("write", ["success", "successes", "continuation"])
def test_a_success_or_continuation_with_a_checkpoint_over_the_limit_is_refused_and_writes_nothing(engine, write):
    job, lease = leased_with_checkpoint(engine)

    with pytest.raises(CheckpointTooLarge) as raised:
        if write == "success":
            complete_job_success(engine, **lease, completion=rl.JobCompletion(checkpoint=OVER))
        elif write == "successes":
            write_successes(engine, [(LeaseIdentity(**lease), rl.JobCompletion(checkpoint=OVER))])
        else:
            apply_transitions(engine, [(LeaseIdentity(**lease), Continue(1_000, OVER))])

    assert_refused(raised)
    stored = rl.get_job(engine, job.id)
    assert (stored.status, stored.checkpoint) == (rl.JobStatus.LEASED, SAVED)


def test_a_handler_is_told_its_checkpoint_is_too_large_and_one_returned_ends_the_job_with_the_code(engine):
    refused: list[BaseException] = []
    registry = rl.JobRegistry()

    @registry.job(JOB_TYPE, max_attempts=3)
    def import_pages(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
        ctx.report_progress(1, 2, checkpoint=SAVED)
        try:
            ctx.report_progress(2, 2, checkpoint=OVER)
        except CheckpointTooLarge as error:
            refused.append(error)
        return rl.JobCompletion(checkpoint=OVER) if payload["return_it"] else rl.JobCompletion()

    registry.sync_definitions(engine)
    reported = rl.enqueue(engine, JOB_TYPE, {"return_it": False})
    returned = rl.enqueue(engine, JOB_TYPE, {"return_it": True})
    run_worker_until(engine, registry, fast_config(), lambda: all(
        rl.get_job(engine, job.id).status in (rl.JobStatus.SUCCEEDED, rl.JobStatus.DEAD_LETTERED)
        for job in (reported, returned)))

    assert [error.code for error in refused] == ["job.checkpoint_too_large"] * 2
    after_report = rl.get_job(engine, reported.id)
    assert (after_report.status, after_report.checkpoint, after_report.progress_done) == (
        rl.JobStatus.SUCCEEDED, SAVED, 1)
    after_return = rl.get_job(engine, returned.id)
    assert (after_return.status, after_return.last_error_code, after_return.checkpoint) == (
        rl.JobStatus.DEAD_LETTERED, "job.checkpoint_too_large", SAVED)
    assert f"over the limit of {LIMIT} bytes" in after_return.last_error_message


def test_the_workers_payload_limit_is_its_checkpoint_limit(engine):
    registry = rl.JobRegistry()

    @registry.job(JOB_TYPE)
    def import_pages(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
        ctx.report_progress(1, 2, checkpoint=OVER)
        return rl.JobCompletion(checkpoint=OVER, continue_after=timedelta(0)) if ctx.run_number == 1 \
            else rl.JobCompletion(checkpoint=OVER)

    registry.sync_definitions(engine)
    job = rl.enqueue(engine, JOB_TYPE, {})
    run_worker_until(engine, registry, fast_config(max_payload_bytes=2 * LIMIT),
                     lambda: rl.get_job(engine, job.id).status is rl.JobStatus.SUCCEEDED)
    done = rl.get_job(engine, job.id)
    assert (done.run_number, done.checkpoint) == (2, OVER)
