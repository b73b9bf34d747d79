"""Scenario 4: many processes and threads drain one queue without claiming a job twice."""

from __future__ import annotations

import pytest

from tests.faults.scenarios import concurrency


@pytest.mark.timeout(240)
def test_processes_times_threads_never_share_a_live_lease_and_lose_nothing(fresh_database, sizes):
    result = concurrency(fresh_database, sizes)
    print(result.summary())
    assert result.problems == []
    assert result.lost == 0
    assert result.details["overlapping_live_claims"] == 0
    assert result.details["jobs_leased_more_than_once"] == 0
    assert result.duplicate_effects == 0
    assert result.details["jobs_per_second"] > 0
