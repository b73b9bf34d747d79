"""The async callers the asyncio tests drive: each kind of async connection, in a transaction of its own."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from tests.db.test_transactional_enqueue import _connect_options
from tests.support import define, scalar

#: A job id no test writes.
UNKNOWN_ID = "018f0000-0000-7000-8000-000000000000"

try:
    import asyncpg  # noqa: F401
except ImportError:  # pragma: no cover - asyncpg is in the dev extra
    HAS_ASYNCPG = False
else:
    HAS_ASYNCPG = True

needs_asyncpg = pytest.mark.skipif(not HAS_ASYNCPG, reason="asyncpg is not installed")


def async_engine(url: str, driver: str, **options: Any) -> AsyncEngine:
    return create_async_engine(make_url(url).set(drivername=f"postgresql+{driver}"), **options)


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


def create_orders(engine: Any) -> Any:
    """The job type defined, and the caller's own table (``orders``) created."""
    define(engine)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE orders (id serial PRIMARY KEY, ref text NOT NULL)"))
    return engine


def jobs_of(engine: Any) -> int:
    return scalar(engine, "SELECT count(*) FROM job_queue")

