"""The dead-letter rule's count of attempts: transient failures within their budget spend none."""

from __future__ import annotations

from runledger_sync.core.outcomes import (
    HANDLER_TRANSIENT_ERROR_CODE as TRANSIENT_CODE,
    TRANSIENT_FAILURE_BUDGET as BUDGET,
    EarlierAttempts,
    dead_letter_reason,
    worker_shutdown_failure,
)
from runledger_sync.core.types import JobDeadLetterReason, JobFailure

TRANSIENT = JobFailure.retryable(TRANSIENT_CODE, "OperationalError: server closed the connection")
ORDINARY = JobFailure.retryable("app.busy", "try later")


def test_transient_failures_are_free_up_to_the_budget_in_a_row():
    assert EarlierAttempts.of([TRANSIENT_CODE] * 3) == EarlierAttempts(free=3, transient_streak=3)
    assert EarlierAttempts.of([TRANSIENT_CODE] * (BUDGET + 2)) == EarlierAttempts(free=BUDGET, transient_streak=BUDGET + 2)


def test_any_other_ending_restarts_the_streak():
    earlier = EarlierAttempts.of([TRANSIENT_CODE, "app.busy", "job.lease_expired", TRANSIENT_CODE])
    assert earlier == EarlierAttempts(free=2, transient_streak=1)


def test_a_single_attempt_job_is_dead_lettered_only_by_the_failure_that_spends_its_attempt():
    within = EarlierAttempts.of([TRANSIENT_CODE] * (BUDGET - 1))
    assert dead_letter_reason(TRANSIENT, BUDGET, 1, within) is None
    past = EarlierAttempts.of([TRANSIENT_CODE] * BUDGET)
    assert dead_letter_reason(TRANSIENT, BUDGET + 1, 1, past) is JobDeadLetterReason.ATTEMPTS_EXHAUSTED
    assert dead_letter_reason(ORDINARY, 2, 1, EarlierAttempts.of([TRANSIENT_CODE])) is JobDeadLetterReason.ATTEMPTS_EXHAUSTED


def test_a_code_alone_does_not_make_a_terminal_failure_free():
    terminal = JobFailure.terminal(TRANSIENT_CODE, "handler's own choice")
    assert dead_letter_reason(terminal, 1, 5, EarlierAttempts()) is JobDeadLetterReason.FAILURE_KIND_NON_RETRYABLE


def test_a_job_stopped_by_the_workers_shutdown_spends_no_attempt_and_shares_the_transient_budget():
    stopped = worker_shutdown_failure()
    assert dead_letter_reason(stopped, 1, 1, EarlierAttempts()) is None
    assert EarlierAttempts.of([stopped.code, TRANSIENT_CODE, stopped.code]) == EarlierAttempts(free=3, transient_streak=3)
    past = EarlierAttempts.of([stopped.code] * BUDGET)
    assert dead_letter_reason(stopped, BUDGET + 1, 1, past) is JobDeadLetterReason.ATTEMPTS_EXHAUSTED
