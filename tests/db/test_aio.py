"""asyncio enqueue (``runledger_sync.aio``) in the caller's async transaction, on every async caller kind.

A job written with the caller's own row (``orders``) exists exactly when the
caller committed; bad input gets the sync API's codes and details; batches and
workflows join the transaction the same way. Each test drives its own event
loop with ``asyncio.run``, which also disposes the async engines it made.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import psycopg
import pytest

import runledger_sync as rl
from runledger_sync import aio
from runledger_sync.core.records import JobSpec
from runledger_sync.core.states import JobStatus
from runledger_sync.store.admin.jobs import get_job
from runledger_sync.store.enqueue import enqueue as store_enqueue
from tests.db.aio_support import CALLERS, create_orders, jobs_of, raw_psycopg
from tests.db.test_transactional_enqueue import _connect_options
from tests.support import JOB_TYPE, rows, scalar


@pytest.fixture
def orders(engine) -> Any:
    return create_orders(engine)


@pytest.fixture(params=CALLERS)
def caller(request, orders, fresh_database) -> Callable[[], Any]:
    kind, driver = request.param
    return lambda: kind(fresh_database, driver)


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_the_job_exists_exactly_when_the_caller_commits(caller, orders, outcome):
    async def scenario() -> Any:
        async with caller() as transaction:
            await transaction.write_own_row("order-1")
            job = await aio.enqueue(transaction.bind, JOB_TYPE, {"order": "order-1"}, idempotency_key="order-1",
                                    meta={"tenant": "acme"})
            # Visible inside the caller's transaction, to the caller's own reads.
            seen = await aio.get_job(transaction.bind, job.id)
            assert seen is not None and seen.payload == {"order": "order-1"}
            # Nothing outside sees it before the caller decides.
            assert get_job(orders, job.id) is None
            await (transaction.commit() if outcome == "commit" else transaction.rollback())
            return job

    job = asyncio.run(scenario())
    assert job.status is JobStatus.PENDING and job.job_type == JOB_TYPE and job.meta == {"tenant": "acme"}
    committed = outcome == "commit"
    assert (get_job(orders, job.id) is not None) is committed
    assert jobs_of(orders) == (1 if committed else 0)
    assert scalar(orders, "SELECT count(*) FROM orders") == (1 if committed else 0)


def test_bad_input_gets_the_sync_codes(caller, orders):
    async def code_of(call: Callable[[Any], Awaitable[Any]]) -> tuple[str, dict[str, Any]]:
        async with caller() as transaction:
            with pytest.raises(rl.RunledgerError) as raised:
                await call(transaction.bind)
            await transaction.rollback()
        return raised.value.code, raised.value.details

    async def scenario() -> dict[str, tuple[str, dict[str, Any]]]:
        async with caller() as transaction:
            await aio.enqueue(transaction.bind, JOB_TYPE, {"n": 1}, idempotency_key="k")
            await transaction.commit()
        return {
            "unknown type": await code_of(lambda bind: aio.enqueue(bind, "no.such.type", {})),
            "bad type name": await code_of(lambda bind: aio.enqueue(bind, "", {})),
            "bad payload": await code_of(lambda bind: aio.enqueue(bind, JOB_TYPE, {"x": float("nan")})),
            "too large": await code_of(lambda bind: aio.enqueue(bind, JOB_TYPE, {"x": "y" * 100}, max_payload_bytes=16)),
            "bad priority": await code_of(lambda bind: aio.enqueue(bind, JOB_TYPE, {}, priority="high")),
            "key conflict": await code_of(lambda bind: aio.enqueue(bind, JOB_TYPE, {"n": 2}, idempotency_key="k")),
            "unknown queue": await code_of(lambda bind: aio.enqueue(bind, JOB_TYPE, {}, queue="no-such-queue")),
        }

    codes = asyncio.run(scenario())
    expected = {}
    for name, call in {
        "unknown type": lambda: rl.enqueue(orders, "no.such.type", {}),
        "bad type name": lambda: rl.enqueue(orders, "", {}),
        "bad payload": lambda: rl.enqueue(orders, JOB_TYPE, {"x": float("nan")}),
        "too large": lambda: rl.enqueue(orders, JOB_TYPE, {"x": "y" * 100}, max_payload_bytes=16),
        "bad priority": lambda: rl.enqueue(orders, JOB_TYPE, {}, priority="high"),
        "key conflict": lambda: rl.enqueue(orders, JOB_TYPE, {"n": 2}, idempotency_key="k"),
        "unknown queue": lambda: rl.enqueue(orders, JOB_TYPE, {}, queue="no-such-queue"),
    }.items():
        with pytest.raises(rl.RunledgerError) as raised:
            call()
        expected[name] = raised.value.code, raised.value.details
    assert codes == expected  # the same codes, and the same details (the queue's name, the conflicting job...)
    assert expected["key conflict"][0] == "job.idempotency_conflict"
    assert expected["unknown type"][0] == "job.definition_not_found_or_disabled"
    assert expected["unknown queue"][0] == "queue.not_found" and expected["unknown queue"][1]["queue"] == "no-such-queue"
    assert jobs_of(orders) == 1


def test_a_repeated_idempotent_request_returns_the_same_job(caller, orders):
    async def scenario() -> tuple[Any, Any]:
        async with caller() as transaction:
            first = await aio.enqueue(transaction.bind, JOB_TYPE, {"n": 1}, idempotency_key="same")
            await transaction.commit()
        async with caller() as transaction:
            again = await aio.enqueue(transaction.bind, JOB_TYPE, {"n": 1}, idempotency_key="same")
            await transaction.commit()
        return first, again

    first, again = asyncio.run(scenario())
    assert first.id == again.id
    assert jobs_of(orders) == 1


def test_enqueue_many_writes_all_or_nothing(caller, orders):
    async def scenario() -> list[Any]:
        async with caller() as transaction:
            jobs = await aio.enqueue_many(transaction.bind, [JobSpec(JOB_TYPE, {"n": n}) for n in range(3)])
            await transaction.commit()
        async with caller() as transaction:
            with pytest.raises(rl.RunledgerError) as raised:
                await aio.enqueue_many(transaction.bind, [JobSpec(JOB_TYPE, {"n": 9}), JobSpec("no.such.type", {})])
            assert raised.value.code == "job.definition_not_found_or_disabled"
            await transaction.rollback()
        return jobs

    jobs = asyncio.run(scenario())
    assert [job.payload for job in jobs] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert jobs_of(orders) == 3


def test_enqueue_calls_write_the_enqueued_row_only_at_the_full_event_log(caller, orders):
    def workflow() -> rl.Workflow:
        wf = rl.Workflow("order.flow")
        wf.job("first", JOB_TYPE, {"n": 1})
        return wf

    async def scenario(**level: Any) -> list[Any]:
        async with caller() as transaction:
            one = await aio.enqueue(transaction.bind, JOB_TYPE, {"n": 1}, **level)
            [many] = await aio.enqueue_many(transaction.bind, [JobSpec(JOB_TYPE, {"n": 2})], **level)
            run = await aio.enqueue_workflow(transaction.bind, workflow(), **level)
            await transaction.commit()
        return [one.id, many.id, run.step("first").job_id]

    quiet = asyncio.run(scenario())
    logged = asyncio.run(scenario(event_log="full"))

    enqueued = [row[0] for row in rows(orders, "SELECT job_id FROM job_events WHERE event_type = 'ENQUEUED' ORDER BY id")]
    assert enqueued == logged and not set(quiet) & set(enqueued)


def test_enqueue_workflow_joins_the_transaction(caller, orders):
    def workflow() -> rl.Workflow:
        wf = rl.Workflow("order.flow", idempotency_key="wf-1")
        wf.job("first", JOB_TYPE, {"n": 1})
        wf.job("second", JOB_TYPE, {"n": 2}, after=["first"])
        return wf

    async def scenario() -> Any:
        async with caller() as transaction:
            await aio.enqueue_workflow(transaction.bind, workflow())
            await transaction.rollback()
        async with caller() as transaction:
            run = await aio.enqueue_workflow(transaction.bind, workflow())
            await transaction.commit()
        return run

    run = asyncio.run(scenario())
    assert [step.key for step in run.steps] == ["first", "second"]
    assert scalar(orders, "SELECT count(*) FROM workflow_runs") == 1
    # Only the step that waits for nothing has a job yet.
    assert jobs_of(orders) == 1


def test_concurrent_tasks_each_join_their_own_connections_transaction(orders, fresh_database):
    async def one(ref: str, commit: bool) -> Any:
        async with raw_psycopg(fresh_database, "psycopg") as transaction:
            await transaction.write_own_row(ref)
            job = await aio.enqueue(transaction.bind, JOB_TYPE, {"order": ref})
            await asyncio.sleep(0)  # let the other task run between the enqueue and the decision
            await (transaction.commit() if commit else transaction.rollback())
            return job

    async def scenario() -> list[Any]:
        return await asyncio.gather(*(one(f"order-{n}", commit=n % 2 == 0) for n in range(6)))

    jobs = asyncio.run(scenario())
    kept = {job.payload["order"] for job in rl.list_jobs(orders)}
    assert kept == {"order-0", "order-2", "order-4"}
    assert {row.ref for row in rows(orders, "SELECT ref FROM orders")} == kept
    assert len({job.id for job in jobs}) == 6


def test_a_batch_of_several_chunks_on_an_autocommit_psycopg_connection_is_all_or_nothing(orders, fresh_database,
                                                                                       monkeypatch):
    monkeypatch.setattr(store_enqueue, "ENQUEUE_CHUNK_SIZE", 2)

    async def scenario() -> Any:
        conn = await psycopg.AsyncConnection.connect(**_connect_options(fresh_database), autocommit=True)
        try:
            with pytest.raises(rl.RunledgerError) as raised:
                await aio.enqueue_many(conn, [JobSpec(JOB_TYPE, {"n": n}) for n in range(4)] + [JobSpec("no.such", {})])
            assert raised.value.code == "job.definition_not_found_or_disabled"
            written = await aio.enqueue_many(conn, [JobSpec(JOB_TYPE, {"n": n}) for n in range(5)])
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # nothing left open
            return written
        finally:
            await conn.close()

    assert len(asyncio.run(scenario())) == 5
    assert jobs_of(orders) == 5


def test_a_psycopg_connection_is_left_as_the_caller_set_it(orders, fresh_database):
    async def scenario() -> None:
        conn = await psycopg.AsyncConnection.connect(**_connect_options(fresh_database), row_factory=psycopg.rows.dict_row)
        conn.adapters.register_loader("jsonb", psycopg.types.string.TextLoader)   # as Django's connection does
        try:
            job = await aio.enqueue(conn, JOB_TYPE, {"n": 1})
            assert job.payload == {"n": 1}   # read with our own cursor and loaders
            cursor = await conn.execute("SELECT payload FROM job_queue WHERE id = %s", (job.id,))
            assert await cursor.fetchone() == {"payload": '{"n": 1}'}   # the caller's: dict rows, jsonb as text
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS   # nothing committed
            await conn.rollback()
        finally:
            await conn.close()

    asyncio.run(scenario())
    assert jobs_of(orders) == 0


def test_a_closed_psycopg_connection_is_refused(orders, fresh_database):
    async def scenario() -> None:
        conn = await psycopg.AsyncConnection.connect(**_connect_options(fresh_database))
        await conn.close()
        await aio.enqueue(conn, JOB_TYPE, {})

    with pytest.raises(rl.RunledgerError) as raised:
        asyncio.run(scenario())
    assert raised.value.code == "job.invalid_argument"


def test_a_bind_of_another_kind_is_refused(orders, fresh_database):
    with pytest.raises(rl.RunledgerError) as raised:
        asyncio.run(aio.enqueue(orders, JOB_TYPE, {}))
    assert raised.value.code == "job.invalid_argument"
    assert jobs_of(orders) == 0
