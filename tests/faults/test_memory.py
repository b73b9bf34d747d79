"""Scenario 8: a long run of no-op jobs through one worker process does not grow its memory."""

from __future__ import annotations

import pytest

from tests.faults.scenarios import memory_soak


@pytest.mark.timeout(300)
def test_worker_rss_is_flat_between_the_mark_and_the_end_of_a_soak(fresh_database, sizes):
    result = memory_soak(fresh_database, sizes)
    print(result.summary())
    assert result.problems == []
    assert result.lost == 0
    assert abs(result.details["growth_percent"]) < 10
