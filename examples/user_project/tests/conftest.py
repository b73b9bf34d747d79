"""The application's fixtures, on top of the runledger-sync plugin's ``runledger_engine``."""

from __future__ import annotations

import pytest

from accounts.jobs import create_registry


@pytest.fixture
def outbox():
    return []


@pytest.fixture
def registry(runledger_engine, outbox):
    registry = create_registry(runledger_engine, outbox)
    # What `runledger-sync migrate --app accounts.jobs:registry` does in production.
    registry.sync_definitions(runledger_engine)
    return registry
