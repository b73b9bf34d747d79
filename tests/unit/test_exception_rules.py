"""Which uncaught handler exceptions retry, and the words that say why a job was or was not retried."""

from __future__ import annotations

from types import SimpleNamespace
from uuid import uuid4

import pytest
from sqlalchemy import exc as sa_exc

from runledger_sync import retry_summary
from runledger_sync.core.exception_rules import ExceptionRules, Verdict, not_retried_because
from runledger_sync.core.outcomes import HANDLER_TRANSIENT_ERROR_CODE, TRANSIENT_FAILURE_BUDGET
from runledger_sync.core.states import JobStatus
from runledger_sync.core.store_errors import ConnectionFailed
from runledger_sync.core.types import JobDeadLetterReason, JobFailureKind
from runledger_sync.db.errors import is_connection_loss


@pytest.mark.parametrize(("rules", "exc", "verdict"), [
    (ExceptionRules(), KeyError("x"), Verdict.RETRY),
    (ExceptionRules(), FileNotFoundError(2, "gone"), Verdict.RETRY),
    (ExceptionRules(dead_letter_on=(LookupError,)), KeyError("x"), Verdict.DEAD_LETTER_ON),
    (ExceptionRules(retry_on=(ConnectionError,)), ConnectionResetError(), Verdict.RETRY),
    (ExceptionRules(retry_on=(ConnectionError,)), ValueError(), Verdict.NOT_IN_RETRY_ON),
    # dead_letter_on wins over retry_on.
    (ExceptionRules(retry_on=(ValueError,), dead_letter_on=(ValueError,)), ValueError(), Verdict.DEAD_LETTER_ON),
    # Not an Exception: no default rule retries a request to stop the process.
    (ExceptionRules(), KeyboardInterrupt(), Verdict.NOT_IN_RETRY_ON),
])
def test_classify(rules, exc, verdict):
    assert rules.classify(exc) is verdict


def test_a_setting_left_as_none_keeps_the_defaults_one():
    registry = ExceptionRules.checked("for the registry", dead_letter_on=ValueError)
    assert registry == ExceptionRules((Exception,), (ValueError,))
    assert ExceptionRules.checked("for job type 't'", retry_on=[OSError], defaults=registry) == \
        ExceptionRules((OSError,), (ValueError,))
    assert ExceptionRules.checked("for job type 't'", dead_letter_on=(), defaults=registry) == ExceptionRules()


@pytest.mark.parametrize(("arguments", "expected"), [
    ((JobDeadLetterReason.ATTEMPTS_EXHAUSTED, JobFailureKind.RETRYABLE, "job.handler_exception"),
     "attempts exhausted (5 of 5)"),
    ((JobDeadLetterReason.FAILURE_KIND_NON_RETRYABLE, JobFailureKind.PANICKED, "job.handler_panic"),
     "`myapp.Bad` is in dead_letter_on"),
    ((JobDeadLetterReason.FAILURE_KIND_NON_RETRYABLE, JobFailureKind.TERMINAL, "smtp.rejected"),
     "a TERMINAL failure (smtp.rejected) is never retried"),
])
def test_not_retried_because(arguments, expected):
    stopped_by = Verdict.DEAD_LETTER_ON if arguments[1] is JobFailureKind.PANICKED else None
    assert not_retried_because(*arguments, attempts_spent=5, max_attempts=5, stopped_by=stopped_by,
                               error_type="myapp.Bad") == expected


@pytest.mark.parametrize(("exc", "lost"), [
    (ConnectionFailed("database connection failed: server closed the connection"), True),
    (sa_exc.OperationalError("SELECT 1", {}, Exception("server closed the connection unexpectedly")), True),
    (sa_exc.DBAPIError("SELECT 1", {}, Exception("gone"), connection_invalidated=True), True),
    (sa_exc.IntegrityError("INSERT", {}, Exception("duplicate key")), False),
    (FileNotFoundError(2, "No such file"), False),
    (ConnectionRefusedError(111, "Connection refused"), False),
    (TimeoutError(), False),
    (KeyError("x"), False),
])
def test_only_a_lost_database_connection_is_a_connection_loss(exc, lost):
    assert is_connection_loss(exc) is lost


def _job(status, status_reason=None, attempt=1, max_attempts=5, code=None):
    return SimpleNamespace(id=uuid4(), status=status, status_reason=status_reason, attempt=attempt,
                           max_attempts=max_attempts, run_number=2, last_error_code=code)


def _attempt(n, code, run_number=2, error_type=None):
    return SimpleNamespace(run_number=run_number, attempt=n, finished_at=object(), outcome="RETRYABLE",
                           error_code=code, error_type=error_type)


def test_retry_summary_counts_the_current_runs_attempts_and_its_free_retries():
    attempts = [_attempt(1, "job.handler_exception", run_number=1)] + [
        _attempt(1, HANDLER_TRANSIENT_ERROR_CODE), _attempt(2, "job.handler_exception"),
        _attempt(3, "job.handler_exception")]
    summary = retry_summary(_job(JobStatus.PENDING, "RETRYABLE", attempt=3), attempts)
    assert (summary.attempts_spent, summary.free_retries, summary.not_retried_because) == (2, 1, None)
    assert str(summary) == "2 of 5 attempts spent; 1 free retry (lost connection or shutdown)"


def test_retry_summary_of_a_dead_letter_says_why():
    exhausted = retry_summary(_job(JobStatus.DEAD_LETTERED, "RETRYABLE", attempt=5, code="job.handler_exception"),
                              [_attempt(n, "job.handler_exception") for n in range(1, 6)])
    assert str(exhausted) == "not retried: attempts exhausted (5 of 5); 0 free retries (lost connection or shutdown)"
    past_budget = TRANSIENT_FAILURE_BUDGET + 1
    reconnects = retry_summary(
        _job(JobStatus.DEAD_LETTERED, "RETRYABLE", attempt=past_budget, max_attempts=1, code=HANDLER_TRANSIENT_ERROR_CODE),
        [_attempt(n, HANDLER_TRANSIENT_ERROR_CODE) for n in range(1, past_budget + 1)])
    assert reconnects.not_retried_because == "attempts exhausted (1 of 1)"
    assert reconnects.free_retries == TRANSIENT_FAILURE_BUDGET
    event = SimpleNamespace(run_number=2, payload={"kind": "PANICKED", "stopped_by": "retry_on"})
    panicked = retry_summary(_job(JobStatus.DEAD_LETTERED, "PANICKED", code="job.handler_panic"),
                             [_attempt(1, "job.handler_panic", error_type="ValueError")], [event])
    assert panicked.not_retried_because == "`ValueError` is not in retry_on"
