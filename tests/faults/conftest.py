"""Fixtures for the fault suite: the sizes chosen by RUNLEDGER_FAULT_SCALE (CI sizes by default)."""

from __future__ import annotations

import pytest

from tests.faults.scenarios import Sizes, sizes_from_env


@pytest.fixture(scope="session")
def sizes() -> Sizes:
    return sizes_from_env()


def report(result) -> None:
    """Print the scenario's figures (shown with -s or on failure) before asserting on them."""
    print(f"\n{result.scenario}: jobs={result.jobs} lost={result.lost} duplicate_effects={result.duplicate_effects}"
          f" duplicate_completions={result.duplicate_completions} recovery_seconds={result.recovery_seconds}"
          f" details={result.details} problems={result.problems}")
