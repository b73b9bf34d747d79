"""Scenario 5: poison jobs end instead of looping, and a stuck handler holds only its own slot."""

from __future__ import annotations

import pytest

from tests.faults.fault_worker import SUICIDE_MAX_ATTEMPTS
from tests.faults.scenarios import poison_hang, poison_suicide


@pytest.mark.timeout(120)
def test_handler_that_kills_its_process_is_dead_lettered_after_max_attempts_lease_expiries(fresh_database):
    result = poison_suicide(fresh_database)
    print(result.summary())
    assert result.problems == []
    assert result.details["job"] == ("DEAD_LETTERED", SUICIDE_MAX_ATTEMPTS, "job.lease_expired")
    assert result.details["deaths"] == SUICIDE_MAX_ATTEMPTS


@pytest.mark.timeout(120)
def test_handler_that_never_returns_holds_only_its_own_slot(fresh_database, sizes):
    result = poison_hang(fresh_database, sizes)
    print(result.summary())
    assert result.problems == []
    assert result.lost == 0
    assert result.details["peak_parallel_other_jobs"] == result.details["concurrency"] - 1
