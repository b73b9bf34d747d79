"""asyncio enqueue (``runledger_sync.aio``) in the caller's async transaction, on every async caller kind.

A job written with the caller's own row (``orders``) exists exactly when the
caller committed; bad input gets the sync API's codes; the batch, workflow,
read and wait calls work the same way. Each test drives its own event loop with
``asyncio.run``, which also disposes the async engines it made.
"""

from __future__ import annotations

import asyncio
import threading
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Awaitable, Callable

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

import runledger_sync as rl
from runledger_sync import aio
from runledger_sync.aio import _wait as aio_wait
from runledger_sync.core.records import JobSpec, LeaseIdentity
from runledger_sync.core.states import JobStatus
from runledger_sync.store import _notify as notify
from runledger_sync.store import admin
from runledger_sync.store import enqueue as store_enqueue
from runledger_sync.store._lifecycle_batch import complete_jobs_success
from tests.db.test_transactional_enqueue import _connect_options
from tests.support import JOB_TYPE, claim_one, define, rows, scalar, terminate_backend, wait_until

try:
    import asyncpg  # noqa: F401
except ImportError:  # pragma: no cover - asyncpg is in the dev extra
    HAS_ASYNCPG = False
else:
    HAS_ASYNCPG = True

needs_asyncpg = pytest.mark.skipif(not HAS_ASYNCPG, reason="asyncpg is not installed")


def async_engine(url: str, driver: str) -> AsyncEngine:
    return create_async_engine(make_url(url).set(drivername=f"postgresql+{driver}"))


class Caller:
    """One async transaction shape: its bind, its own row, commit and rollback."""

    def __init__(self, bind: Any, write: Callable[[str], Awaitable[Any]], commit: Callable[[], Awaitable[Any]],
                 rollback: Callable[[], Awaitable[Any]]) -> None:
        self.bind, self.write_own_row, self.commit, self.rollback = bind, write, commit, rollback


@asynccontextmanager
async def sa_connection(url: str, driver: str) -> AsyncIterator[Caller]:
    engine = async_engine(url, driver)
    try:
        async with engine.connect() as conn:
            await conn.begin()
            yield Caller(conn, lambda ref: conn.execute(text("INSERT INTO orders (ref) VALUES (:r)"), {"r": ref}),
                         conn.commit, conn.rollback)
    finally:
        await engine.dispose()


@asynccontextmanager
async def sa_session(url: str, driver: str) -> AsyncIterator[Caller]:
    engine = async_engine(url, driver)
    try:
        async with AsyncSession(engine) as session:
            yield Caller(session, lambda ref: session.execute(text("INSERT INTO orders (ref) VALUES (:r)"), {"r": ref}),
                         session.commit, session.rollback)
    finally:
        await engine.dispose()


@asynccontextmanager
async def raw_psycopg(url: str, driver: str) -> AsyncIterator[Caller]:
    # A row factory of the app's own: the store reads its rows its own way.
    conn = await psycopg.AsyncConnection.connect(**_connect_options(url), row_factory=psycopg.rows.dict_row)
    try:
        yield Caller(conn, lambda ref: conn.execute("INSERT INTO orders (ref) VALUES (%s)", (ref,)),
                     conn.commit, conn.rollback)
    finally:
        await conn.close()


CALLERS = [
    pytest.param((raw_psycopg, "psycopg"), id="psycopg-AsyncConnection"),
    pytest.param((sa_connection, "psycopg_async"), id="sqlalchemy-AsyncConnection-psycopg"),
    pytest.param((sa_session, "psycopg_async"), id="sqlalchemy-AsyncSession-psycopg"),
    pytest.param((sa_connection, "asyncpg"), id="sqlalchemy-AsyncConnection-asyncpg", marks=needs_asyncpg),
    pytest.param((sa_session, "asyncpg"), id="sqlalchemy-AsyncSession-asyncpg", marks=needs_asyncpg),
]


@pytest.fixture
def orders(engine) -> Any:
    define(engine)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE orders (id serial PRIMARY KEY, ref text NOT NULL)"))
    return engine


@pytest.fixture(params=CALLERS)
def caller(request, orders, fresh_database) -> Callable[[], Any]:
    kind, driver = request.param
    return lambda: kind(fresh_database, driver)


UNKNOWN_ID = "018f0000-0000-7000-8000-000000000000"


def jobs_of(engine: Any) -> int:
    return scalar(engine, "SELECT count(*) FROM job_queue")


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_the_job_exists_exactly_when_the_caller_commits(caller, orders, outcome):
    async def scenario() -> Any:
        async with caller() as transaction:
            await transaction.write_own_row("order-1")
            job = await aio.enqueue(transaction.bind, JOB_TYPE, {"order": "order-1"}, idempotency_key="order-1")
            # Visible inside the caller's transaction, to the caller's own reads.
            seen = await aio.get_job(transaction.bind, job.id)
            assert seen is not None and seen.payload == {"order": "order-1"}
            # Nothing outside sees it before the caller decides.
            assert admin.get_job(orders, job.id) is None
            await (transaction.commit() if outcome == "commit" else transaction.rollback())
            return job

    job = asyncio.run(scenario())
    assert job.status is JobStatus.PENDING and job.job_type == JOB_TYPE
    committed = outcome == "commit"
    assert (admin.get_job(orders, job.id) is not None) is committed
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


# --- reads and waits ----------------------------------------------------------------


ENGINE_DRIVERS = ["psycopg_async", pytest.param("asyncpg", marks=needs_asyncpg)]
#: A ceiling far above the notification's delivery, far below the periodic look made long here.
END_TO_RETURN_CEILING_SECONDS = 5.0


class Waiter:
    """aio.wait_for_job on an event loop and thread of its own; keeps what it returned or raised, and when."""

    def __init__(self, url: str, driver: str, job_id: Any, timeout: float = 30.0) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.returned_at: datetime | None = None
        self.thread = threading.Thread(target=self._run, args=(url, driver, job_id, timeout), daemon=True)
        self.thread.start()

    def _run(self, url: str, driver: str, job_id: Any, timeout: float) -> None:
        async def wait() -> Any:
            engine = async_engine(url, driver)
            try:
                return await aio.wait_for_job(engine, job_id, timeout=timeout)
            finally:
                await engine.dispose()

        try:
            self.result = asyncio.run(wait())
        except BaseException as error:  # noqa: BLE001 - handed to the test
            self.error = error
        self.returned_at = datetime.now(timezone.utc)

    def join(self) -> Any:
        self.thread.join(30)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error
        return self.result


def ended_listener_pids(engine: Any) -> list[int]:
    return [row.pid for row in rows(
        engine, "SELECT pid FROM pg_stat_activity WHERE application_name = :name AND query IN (:plain, :quoted)"
                " AND datname = current_database()",
        # asyncpg quotes the channel name.
        name=notify.LISTENER_APPLICATION_NAME, plain=f"LISTEN {notify.ENDED_CHANNEL}",
        quoted=f'LISTEN "{notify.ENDED_CHANNEL}"')]


@pytest.fixture
def no_periodic_look(monkeypatch):
    # Only the notification can then wake the waiter within the ceiling.
    monkeypatch.setattr(aio_wait, "LISTENING_POLL_SECONDS", 120.0)


@pytest.mark.parametrize("driver", ENGINE_DRIVERS)
def test_get_job_on_an_async_engine(orders, fresh_database, driver):
    job = rl.enqueue(orders, JOB_TYPE, {"n": 1})

    async def scenario() -> tuple[Any, Any]:
        engine = async_engine(fresh_database, driver)
        try:
            return await aio.get_job(engine, job.id), await aio.get_job(engine, UNKNOWN_ID)
        finally:
            await engine.dispose()

    found, unknown = asyncio.run(scenario())
    assert (found.id, found.status, found.payload) == (job.id, JobStatus.PENDING, {"n": 1})
    assert unknown is None


@pytest.mark.parametrize("driver", ENGINE_DRIVERS)
def test_the_waiter_returns_after_the_success_woken_by_its_notification(orders, fresh_database, driver, no_periodic_look):
    job = rl.enqueue(orders, JOB_TYPE, {})
    waiter = Waiter(fresh_database, driver, job.id)
    wait_until(lambda: len(ended_listener_pids(orders)) == 1, what="the waiter's LISTEN")
    claimed = claim_one(orders)
    complete_jobs_success(orders, [(LeaseIdentity.of(claimed), rl.JobCompletion(output={"n": 1}))])
    done = waiter.join()
    assert (done.id, done.status, done.output) == (job.id, JobStatus.SUCCEEDED, {"n": 1})
    assert (waiter.returned_at - done.finished_at).total_seconds() < END_TO_RETURN_CEILING_SECONDS
    assert ended_listener_pids(orders) == []  # its LISTEN session is closed


@pytest.mark.parametrize("driver", ENGINE_DRIVERS)
def test_a_lost_listener_falls_back_to_polling(orders, fresh_database, driver, no_periodic_look):
    job = rl.enqueue(orders, JOB_TYPE, {})
    waiter = Waiter(fresh_database, driver, job.id)
    [pid] = wait_until(lambda: ended_listener_pids(orders), what="the waiter's LISTEN")
    terminate_backend(orders, pid)
    canceled = rl.cancel_job(orders, job.id)
    done = waiter.join()
    assert done.status is JobStatus.CANCELED
    # Polling found it, not the periodic look (made long here) nor the deadline.
    assert (waiter.returned_at - canceled.finished_at).total_seconds() < END_TO_RETURN_CEILING_SECONDS


@pytest.mark.parametrize("driver", ENGINE_DRIVERS)
def test_wait_timeout_and_not_found_on_an_async_engine(orders, fresh_database, driver):
    job = rl.enqueue(orders, JOB_TYPE, {})
    with pytest.raises(rl.JobWaitTimeout) as raised:
        Waiter(fresh_database, driver, job.id, timeout=0.2).join()
    assert raised.value.code == "job.wait_timeout"
    assert raised.value.details["status"] == "PENDING"
    with pytest.raises(rl.RunledgerError) as raised:
        Waiter(fresh_database, driver, UNKNOWN_ID, timeout=1).join()
    assert raised.value.code == "job.not_found"
    assert ended_listener_pids(orders) == []


def test_wait_for_job_on_a_connection_and_its_errors(caller, orders):
    async def scenario() -> None:
        async with caller() as transaction:
            job = await aio.enqueue(transaction.bind, JOB_TYPE, {})
            await transaction.commit()
            with pytest.raises(rl.RunledgerError) as raised:
                await aio.wait_for_job(transaction.bind, job.id, timeout=0.1)
            assert raised.value.code == "job.wait_timeout"
            await transaction.rollback()
            rl.cancel_job(orders, job.id)
            done = await aio.wait_for_job(transaction.bind, job.id, timeout=5)
            assert done.status is JobStatus.CANCELED
            await transaction.rollback()
            with pytest.raises(rl.RunledgerError) as raised:
                await aio.wait_for_job(transaction.bind, UNKNOWN_ID, timeout=1)
            assert raised.value.code == "job.not_found"
            await transaction.rollback()
            with pytest.raises(rl.RunledgerError) as raised:
                await aio.wait_for_job(transaction.bind, job.id, timeout=-1)
            assert raised.value.code == "job.invalid_argument"

    asyncio.run(scenario())
