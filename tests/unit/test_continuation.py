"""Continuations and retry hints as pure rules: which delays are valid, and what a continuation or a hint decides."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from uuid import UUID

import pytest

from runledger_sync.core import backoff
from runledger_sync.core.continuation import (
    CONTINUATION_LIMIT_CODE,
    MAX_HANDLER_DELAY,
    WORKFLOW_CONTINUATION_NOT_ENABLED_CODE,
    delay_ms,
)
from runledger_sync.core.outcomes import Continue, DeadLetter, EarlierAttempts, Retry, decide_continuation, decide_failure
from runledger_sync.core.records import JobRecord
from runledger_sync.core.states import JobStage, JobStatus
from runledger_sync.core.errors import InvalidArgument, RegistrationError
from runledger_sync.core.types import JobCompletion, JobDeadLetterReason, JobFailure, JobFailureKind, Snooze
from runledger_sync.core.workflow import Workflow
from runledger_sync.registry import JobRegistry

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
JOB = JobRecord(
    id=UUID("01890000-0000-7000-8000-000000000001"), job_type="t", organization_id=None, payload={},
    status=JobStatus.LEASED, priority=100, run_number=1, attempt=1, max_attempts=3, timeout_seconds=900,
    next_run_at=NOW, lease_expires_at=NOW, last_heartbeat_at=None, worker_id="w", started_at=NOW, finished_at=None,
    stage=JobStage.RUNNING, progress_done=None, progress_total=None, progress_pct=None, checkpoint=None, output=None,
    idempotency_key=None, enqueue_request=None, status_reason=None, last_error_code=None, last_error_message=None,
    created_at=NOW, updated_at=NOW,
)


@pytest.mark.parametrize(("value", "ms"), [
    (0, 0), (1.5, 1500), (timedelta(seconds=30), 30_000), (0.0001, 1), (timedelta(microseconds=1), 1),
    (MAX_HANDLER_DELAY, int(MAX_HANDLER_DELAY.total_seconds() * 1000)),
])
def test_a_delay_is_whole_milliseconds_rounded_up(value, ms):
    assert delay_ms(value) == ms


@pytest.mark.parametrize("value", [-1, timedelta(seconds=-1), math.nan, math.inf, -math.inf,
                                   MAX_HANDLER_DELAY + timedelta(seconds=1), True, "30", None, [1]])
def test_a_value_that_is_no_duration_in_range_is_no_delay(value):
    assert delay_ms(value) is None


def test_a_snooze_keeps_what_it_was_given_for_the_worker_to_judge():
    assert Snooze(math.nan).seconds is not None and Snooze(timedelta(seconds=3)).seconds == timedelta(seconds=3)


def test_a_continuation_within_the_cap_continues_after_its_delay_with_its_checkpoint():
    completion = JobCompletion(continue_after=timedelta(seconds=2), checkpoint={"page": 2})
    assert decide_continuation(JOB, completion, max_continuations=1) == Continue(2000, {"page": 2})


@pytest.mark.parametrize(("job", "step_allows", "code"), [
    (replace(JOB, continuations=3), True, CONTINUATION_LIMIT_CODE),
    (JOB, False, WORKFLOW_CONTINUATION_NOT_ENABLED_CODE),
])
def test_a_refused_continuation_is_a_terminal_dead_letter_decided_before_the_write(job, step_allows, code):
    decided = decide_continuation(job, JobCompletion(continue_after=0), max_continuations=3, step_allows=step_allows)
    assert isinstance(decided, DeadLetter)
    assert (decided.failure.kind, decided.failure.code) == (JobFailureKind.TERMINAL, code)
    assert decided.info.reason is JobDeadLetterReason.FAILURE_KIND_NON_RETRYABLE


def test_a_retry_hint_is_a_lower_bound_on_the_backoff_and_on_an_override():
    policy = backoff.compute_retry_delay_ms(1, JOB.id)
    longer = JobFailure.retryable("api.busy", "429", retry_after=timedelta(seconds=100))
    shorter = JobFailure.retryable("api.busy", "429", retry_after=timedelta(seconds=1))
    assert decide_failure(JOB, longer, EarlierAttempts()) == Retry(longer, 100_000)
    assert decide_failure(JOB, shorter, EarlierAttempts()) == Retry(shorter, policy)
    assert decide_failure(JOB, longer, EarlierAttempts(), retry_delay_override=200_000) == Retry(longer, 200_000)
    assert decide_failure(JOB, longer, EarlierAttempts(), retry_delay_override=2_000) == Retry(longer, 100_000)


def test_a_hint_on_a_failure_that_spends_the_last_attempt_still_dead_letters():
    last = replace(JOB, attempt=3)
    failure = JobFailure.retryable("api.busy", "429", retry_after=timedelta(seconds=100))
    assert isinstance(decide_failure(last, failure, EarlierAttempts()), DeadLetter)


@pytest.mark.parametrize("cap", [0, -1, 1.5, "10", True])
def test_a_cap_on_continuations_that_is_no_positive_int_is_refused_at_registration(cap):
    registry = JobRegistry()
    with pytest.raises(RegistrationError):
        registry.job("t", max_continuations=cap)(lambda ctx, payload: None)
    assert registry.registered_types() == []


def test_the_registrys_cap_is_the_definitions():
    registry = JobRegistry()
    registry.job("capped", max_continuations=7)(lambda ctx, payload: None)
    registry.job("default")(lambda ctx, payload: None)
    assert {d.job_type: d.max_continuations for d in registry.definitions()} == {"capped": 7, "default": 100}


def test_a_workflow_step_opts_in_with_a_real_bool():
    wf = Workflow("w")
    assert wf.job("a", "t", continuation=True).continuation is True
    assert wf.job("b", "t").continuation is False
    with pytest.raises(InvalidArgument):
        wf.job("c", "t", continuation="yes")
