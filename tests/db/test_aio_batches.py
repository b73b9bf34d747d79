"""``aio.enqueue(..., batch=)`` joins a batch in the caller's async transaction, on every async caller kind."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

import runledger_sync as rl
from runledger_sync import aio
from tests.db.aio_support import CALLERS, create_orders
from tests.support import JOB_TYPE


@pytest.fixture
def orders(engine) -> Any:
    return create_orders(engine)


@pytest.fixture(params=CALLERS)
def caller(request, orders, fresh_database) -> Callable[[], Any]:
    kind, driver = request.param
    return lambda: kind(fresh_database, driver)


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_a_member_added_in_an_async_transaction_counts_exactly_when_it_commits(caller, orders, outcome):
    batch = rl.open_batch(orders)

    async def scenario() -> Any:
        async with caller() as transaction:
            job = await aio.enqueue(transaction.bind, JOB_TYPE, {"n": 1}, batch=batch.id)
            await (transaction.commit() if outcome == "commit" else transaction.rollback())
            return job

    job = asyncio.run(scenario())
    assert job.batch_id == batch.id
    assert rl.get_batch(orders, batch.id).total == (1 if outcome == "commit" else 0)


def test_a_closed_batch_is_refused_with_its_code(caller, orders):
    batch = rl.open_batch(orders)
    rl.close_batch(orders, batch.id)

    async def scenario() -> None:
        async with caller() as transaction:
            with pytest.raises(rl.BatchClosed):
                await aio.enqueue(transaction.bind, JOB_TYPE, {"n": 1}, batch=batch.id)
            await transaction.rollback()

    asyncio.run(scenario())
    assert rl.get_batch(orders, batch.id).total == 0
