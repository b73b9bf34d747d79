"""The same database failures through either driver (psycopg2, psycopg 3) translate to the same codes."""

from __future__ import annotations

from typing import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy import text
from sqlalchemy.engine import make_url

import runledger_sync as rl
from runledger_sync.db.errors import translate
from tests.support import terminate_backend

DRIVERS = ["psycopg2", "psycopg"]


@pytest.fixture(params=DRIVERS)
def driver_engine(request, fresh_database) -> Iterator[sa.Engine]:
    url = make_url(fresh_database).set(drivername=f"postgresql+{request.param}")
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE parents (id int CONSTRAINT pk_parents PRIMARY KEY)"))
        conn.execute(text("CREATE TABLE children (parent_id int CONSTRAINT fk_children_parent REFERENCES parents)"))
        conn.execute(text("INSERT INTO parents VALUES (1)"))
    yield engine
    engine.dispose()


def translated(engine: sa.Engine, *statements: str) -> rl.RunledgerError:
    with engine.connect() as conn, pytest.raises(sa.exc.DBAPIError) as caught:
        for statement in statements:
            conn.execute(text(statement))
    return translate(caught.value, engine.url)


def test_unique_violation_is_coded_alike_on_both_drivers(driver_engine):
    error = translated(driver_engine, "INSERT INTO parents VALUES (1)")
    assert isinstance(error, rl.errors.UniqueViolation)
    assert (error.code, error.details) == ("db.unique_violation", {"sqlstate": "23505", "constraint": "pk_parents"})


def test_foreign_key_violation_is_coded_alike_on_both_drivers(driver_engine):
    error = translated(driver_engine, "INSERT INTO children VALUES (2)")
    assert isinstance(error, rl.errors.RelatedResourceMissing)
    assert error.code == "db.related_resource_missing"
    assert error.details == {"sqlstate": "23503", "constraint": "fk_children_parent"}


def test_lock_timeout_is_coded_alike_on_both_drivers(driver_engine):
    with driver_engine.connect() as holder:
        holder.execute(text("SELECT * FROM parents WHERE id = 1 FOR UPDATE"))
        error = translated(driver_engine, "SET lock_timeout = '50ms'", "SELECT * FROM parents WHERE id = 1 FOR UPDATE")
        holder.rollback()
    assert type(error) is rl.StoreError and not isinstance(error, rl.ConnectionFailed)
    assert error.details == {"sqlstate": "55P03"} and "lock wait timed out" in str(error)


def test_lost_connection_is_coded_alike_on_both_drivers(driver_engine):
    with driver_engine.connect() as victim, pytest.raises(sa.exc.DBAPIError) as caught:
        pid = victim.execute(text("SELECT pg_backend_pid()")).scalar_one()
        victim.rollback()
        terminate_backend(driver_engine, pid)
        victim.execute(text("SELECT 1"))
    error = translate(caught.value, driver_engine.url)
    assert isinstance(error, rl.ConnectionFailed) and error.code == "db.connection_failed"
