"""``aio.enqueue_workflow(..., batch=)`` and ``aio.append_workflow_steps`` in the caller's async transaction."""

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


def crawl() -> rl.Workflow:
    wf = rl.Workflow("aio.crawl")
    first = wf.job("first", JOB_TYPE, {"n": 0})
    window = wf.external("collect", after=[first])
    wf.job("fan-in", JOB_TYPE, {"n": -1}, after=[window])
    return wf


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_a_run_joins_a_batch_and_appends_exactly_when_the_async_transaction_commits(caller, orders, outcome):
    batch = rl.open_batch(orders)

    async def scenario() -> Any:
        async with caller() as transaction:
            run = await aio.enqueue_workflow(transaction.bind, crawl(), batch=batch.id)
            more = rl.WorkflowAppend(window="collect")
            more.job("page-1", JOB_TYPE, {"n": 1})
            appended = await aio.append_workflow_steps(transaction.bind, run.id, more, mutation_key="pages")
            again = await aio.append_workflow_steps(transaction.bind, run.id, more, mutation_key="pages")
            await (transaction.commit() if outcome == "commit" else transaction.rollback())
            return run, appended, again

    run, appended, again = asyncio.run(scenario())
    assert [m.mutation_key for m in appended.mutations] == ["pages"] and again.steps == appended.steps
    assert appended.step("fan-in").deps == ("collect", "page-1")
    stored = rl.get_workflow_run(orders, run.id)
    if outcome == "commit":
        assert [step.key for step in stored.steps] == ["first", "collect", "fan-in", "page-1"]
        assert (rl.get_batch(orders, batch.id).total, rl.get_batch(orders, batch.id).runs) == (1, 1)
    else:
        assert stored is None and rl.get_batch(orders, batch.id).total == 0


def test_a_closed_batch_refuses_the_run_with_its_code(caller, orders):
    batch = rl.open_batch(orders)
    rl.close_batch(orders, batch.id)

    async def scenario() -> None:
        async with caller() as transaction:
            with pytest.raises(rl.BatchClosed):
                await aio.enqueue_workflow(transaction.bind, crawl(), batch=batch.id)
            await transaction.rollback()

    asyncio.run(scenario())
    assert rl.get_batch(orders, batch.id).total == 0
