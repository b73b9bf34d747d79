"""Fixtures for the fault suite: the sizes chosen by RUNLEDGER_FAULT_SCALE (CI sizes by default)."""

from __future__ import annotations

import pytest

from tests.faults.scenarios import Sizes, sizes_from_env


@pytest.fixture(scope="session")
def sizes() -> Sizes:
    return sizes_from_env()
