"""aio.get_job and aio.wait_for_job on an AsyncEngine retry a lost connection as the sync store does.

The same errors are retried (a lost or refused connection), as often and within
the same budget; any other error is raised from the first try.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import event, text

import runledger_sync as rl
from runledger_sync import aio
from runledger_sync.aio import _wait as aio_wait
from runledger_sync.core.states import JobStatus
from runledger_sync.store.transactions import TRANSIENT_RETRY_ATTEMPTS
from tests.db.aio_support import async_engine, create_orders, needs_asyncpg
from tests.db.test_aio_wait import Waiter, ended_listener_pids
from tests.support import JOB_TYPE, rows, terminate_backend, wait_until

ENGINE_DRIVERS = ["psycopg_async", pytest.param("asyncpg", marks=needs_asyncpg)]
#: The application name of the waiter's engine, so the test finds its pooled connection.
WAITER_APPLICATION_NAME = "aio-retry-waiter"


@pytest.fixture
def orders(engine) -> Any:
    return create_orders(engine)


def checkouts_of(engine: Any) -> list[int]:
    """One entry per connection the engine's pool hands out: one per try."""
    seen: list[int] = []
    event.listen(engine.sync_engine, "checkout", lambda *args: seen.append(1))
    return seen


def named(driver: str, application_name: str) -> dict[str, Any]:
    if driver == "asyncpg":
        return {"connect_args": {"server_settings": {"application_name": application_name}}}
    return {"connect_args": {"application_name": application_name}}


@pytest.mark.parametrize("driver", ENGINE_DRIVERS)
def test_get_job_retries_a_killed_pooled_connection(orders, fresh_database, driver):
    job = rl.enqueue(orders, JOB_TYPE, {"n": 1})

    async def scenario() -> tuple[Any, int, int, int]:
        # One pooled connection and no pre-ping: the dead connection is really used.
        engine = async_engine(fresh_database, driver, pool_size=1, max_overflow=0)
        try:
            assert (await aio.get_job(engine, job.id)).id == job.id
            async with engine.connect() as conn:
                victim = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
            terminate_backend(orders, victim)
            tries = checkouts_of(engine)
            found = await aio.get_job(engine, job.id)
            tried = len(tries)
            async with engine.connect() as conn:
                now = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
            return found, tried, victim, now
        finally:
            await engine.dispose()

    found, tried, victim, now = asyncio.run(scenario())
    assert (found.id, found.status, found.payload) == (job.id, JobStatus.PENDING, {"n": 1})
    assert tried == 2  # the killed connection, then a fresh one
    assert now != victim


@pytest.mark.parametrize("driver", ENGINE_DRIVERS)
def test_a_bad_job_id_is_raised_from_the_first_try(orders, fresh_database, driver):
    async def scenario() -> tuple[str, list[int]]:
        engine = async_engine(fresh_database, driver)
        try:
            tries = checkouts_of(engine)
            with pytest.raises(rl.RunledgerError) as raised:
                await aio.get_job(engine, "not-a-uuid")
            return raised.value.code, tries
        finally:
            await engine.dispose()

    code, tries = asyncio.run(scenario())
    assert code == "job.invalid_argument"
    assert len(tries) == 1


def test_a_database_error_other_than_a_lost_connection_is_not_retried(empty_database):
    async def scenario() -> tuple[str, list[int]]:
        engine = async_engine(empty_database, "psycopg_async")
        try:
            tries = checkouts_of(engine)
            with pytest.raises(rl.RunledgerError) as raised:
                await aio.get_job(engine, "018f0000-0000-7000-8000-000000000000")
            return raised.value.code, tries
        finally:
            await engine.dispose()

    code, tries = asyncio.run(scenario())
    assert code == "db.schema_mismatch"  # no job tables: the server's error, not the connection's
    assert len(tries) == 1


def test_a_refused_connection_is_retried_within_the_budget_then_raised(fresh_database):
    async def scenario() -> tuple[str, int]:
        # Nothing listens on port 1: every connect is refused at once.
        engine = async_engine(fresh_database, "psycopg_async", connect_args={"port": 1})
        connects: list[int] = []
        event.listen(engine.sync_engine, "do_connect", lambda *args: connects.append(1))
        try:
            with pytest.raises(rl.RunledgerError) as raised:
                await aio.get_job(engine, "018f0000-0000-7000-8000-000000000000")
            return raised.value.code, len(connects)
        finally:
            await engine.dispose()

    code, connects = asyncio.run(scenario())
    assert code == "db.connection_failed"
    assert connects == TRANSIENT_RETRY_ATTEMPTS


@pytest.mark.parametrize("driver", ENGINE_DRIVERS)
def test_the_waiter_reads_again_after_its_read_connection_is_killed(orders, fresh_database, driver, monkeypatch):
    # Only the notification can then wake the waiter, onto its killed read connection.
    monkeypatch.setattr(aio_wait, "LISTENING_POLL_SECONDS", 120.0)
    job = rl.enqueue(orders, JOB_TYPE, {})
    waiter = Waiter(fresh_database, driver, job.id, pool_size=1, max_overflow=0,
                    **named(driver, WAITER_APPLICATION_NAME))
    wait_until(lambda: len(ended_listener_pids(orders)) == 1, what="the waiter's LISTEN")
    # The listener renamed its own session: the one left under the engine's name is the pooled read connection.
    [reader] = wait_until(lambda: [row.pid for row in rows(
        orders, "SELECT pid FROM pg_stat_activity WHERE application_name = :name AND state = 'idle'"
                " AND datname = current_database()", name=WAITER_APPLICATION_NAME)], what="the waiter's first read")
    terminate_backend(orders, reader)
    rl.cancel_job(orders, job.id)
    done = waiter.join()
    assert (done.id, done.status) == (job.id, JobStatus.CANCELED)


def test_a_callers_killed_connection_is_not_retried(orders, fresh_database):
    job = rl.enqueue(orders, JOB_TYPE, {})

    async def scenario() -> str:
        engine = async_engine(fresh_database, "psycopg_async")
        try:
            async with engine.connect() as conn:
                victim = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
                terminate_backend(orders, victim)
                with pytest.raises(rl.RunledgerError) as raised:
                    await aio.get_job(conn, job.id)  # its transaction is the caller's: lost with the connection
                return raised.value.code
        finally:
            await engine.dispose()

    assert asyncio.run(scenario()) == "db.connection_failed"
