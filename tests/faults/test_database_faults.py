"""Scenario 2: the database goes away under running workers, which must ride it out without a restart."""

from __future__ import annotations

import pytest

from tests.faults.scenarios import postgres_restart, terminate_backends


@pytest.mark.timeout(240)
def test_workers_finish_every_job_once_across_two_postgres_restarts(tmp_path, sizes):
    result = postgres_restart(tmp_path, sizes)
    print(result.summary())
    assert result.problems == []
    assert result.lost == 0
    assert result.duplicate_completions == 0
    assert len(result.details["resume_seconds"]) == 2


@pytest.mark.timeout(180)
def test_workers_reconnect_after_every_backend_is_terminated(fresh_database, sizes):
    result = terminate_backends(fresh_database, sizes)
    print(result.summary())
    assert result.problems == []
    assert result.lost == 0
    assert result.duplicate_completions == 0
    assert all(count > 0 for count in result.details["backends_terminated"])
