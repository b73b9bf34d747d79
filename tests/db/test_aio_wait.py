"""aio.get_job and aio.wait_for_job: on an AsyncEngine (listening, on both drivers) and on a caller's connection.

The rules and errors are rl.wait_for_job's: it returns once the job has ended,
woken by the notification of its end, polls when its listener is lost, and
raises ``job.wait_timeout`` and ``job.not_found``.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timezone
from typing import Any, Callable

import pytest

import runledger_sync as rl
from runledger_sync import aio
from runledger_sync.aio import _wait as aio_wait
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.states import JobStatus
from runledger_sync.store import notify
from tests.support import write_successes
from tests.db.aio_support import CALLERS, UNKNOWN_ID, async_engine, create_orders, needs_asyncpg
from tests.support import JOB_TYPE, claim_one, rows, terminate_backend, wait_until


@pytest.fixture
def orders(engine) -> Any:
    return create_orders(engine)


@pytest.fixture(params=CALLERS)
def caller(request, orders, fresh_database) -> Callable[[], Any]:
    kind, driver = request.param
    return lambda: kind(fresh_database, driver)


ENGINE_DRIVERS = ["psycopg_async", pytest.param("asyncpg", marks=needs_asyncpg)]
#: A ceiling far above the notification's delivery, far below the periodic look made long here.
END_TO_RETURN_CEILING_SECONDS = 5.0


class Waiter:
    """aio.wait_for_job on an event loop and thread of its own; keeps what it returned or raised, and when."""

    def __init__(self, url: str, driver: str, job_id: Any, timeout: float = 30.0, **engine_options: Any) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.returned_at: datetime | None = None
        self.thread = threading.Thread(target=self._run, args=(url, driver, job_id, timeout, engine_options),
                                       daemon=True)
        self.thread.start()

    def _run(self, url: str, driver: str, job_id: Any, timeout: float, engine_options: dict[str, Any]) -> None:
        async def wait() -> Any:
            engine = async_engine(url, driver, **engine_options)
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
    job = rl.enqueue(orders, JOB_TYPE, {"n": 1}, organization_id="acme")

    async def scenario() -> list[Any]:
        engine = async_engine(fresh_database, driver)
        try:
            reads = [await aio.get_job(engine, job.id), await aio.get_job(engine, str(job.id), organization_id="acme"),
                     await aio.get_job(engine, job.id, organization_id="other"), await aio.get_job(engine, UNKNOWN_ID)]
            with pytest.raises(rl.RunledgerError) as raised:
                await aio.wait_for_job(engine, job.id, timeout=1, organization_id="other")
            assert raised.value.code == "job.not_found"  # another organization's job is not found
            with pytest.raises(rl.RunledgerError) as raised:
                await aio.get_job(engine, "not-a-uuid")
            assert raised.value.code == "job.invalid_argument"
            return reads
        finally:
            await engine.dispose()

    found, scoped, other, unknown = asyncio.run(scenario())
    assert (found.id, found.status, found.payload) == (job.id, JobStatus.PENDING, {"n": 1})
    assert scoped.id == job.id
    assert other is None and unknown is None


@pytest.mark.parametrize("driver", ENGINE_DRIVERS)
def test_the_waiter_returns_after_the_success_woken_by_its_notification(orders, fresh_database, driver, no_periodic_look):
    job = rl.enqueue(orders, JOB_TYPE, {})
    waiter = Waiter(fresh_database, driver, job.id)
    wait_until(lambda: len(ended_listener_pids(orders)) == 1, what="the waiter's LISTEN")
    claimed = claim_one(orders)
    write_successes(orders, [(LeaseIdentity.of(claimed), rl.JobCompletion(output={"n": 1}))])
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
