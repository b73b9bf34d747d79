"""Fixtures shared by the store tests."""

from __future__ import annotations

from typing import Iterator

import pytest

from runledger_sync.store.transactions import HeldConnection
from tests.support import define


@pytest.fixture
def held(engine) -> Iterator[HeldConnection]:
    """A HeldConnection on ``engine``, whose test job type is defined."""
    define(engine)
    connection = HeldConnection(engine)
    yield connection
    connection.close()
