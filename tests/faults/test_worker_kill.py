"""Scenario 1: workers SIGKILLed mid-job, over and over, while jobs keep arriving."""

from __future__ import annotations

import pytest

from tests.faults.scenarios import BASE_SETTINGS, recovery_bound, worker_sigkill_churn


@pytest.mark.timeout(240)
def test_sigkill_churn_finishes_every_job_once_and_recovers_within_the_lease_bound(fresh_database, sizes):
    result = worker_sigkill_churn(fresh_database, sizes)
    print(result.summary())
    assert result.problems == []
    assert result.lost == 0
    assert result.duplicate_completions == 0
    assert result.details["kills_that_hit_jobs"] >= 1
    assert result.recovery_seconds is not None
    assert result.recovery_seconds <= recovery_bound(BASE_SETTINGS)
