"""A database that was never migrated gives the coded schema error, naming the command to run."""

from __future__ import annotations

import pytest
import sqlalchemy

import runledger_sync as rl


@pytest.fixture
def unmigrated(empty_database):
    engine = rl.create_engine(empty_database)
    yield engine
    engine.dispose()


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda e: rl.enqueue(e, "email.send", {"to": "a@b.c"}), id="enqueue"),
        pytest.param(lambda e: rl.list_jobs(e), id="list_jobs"),
        pytest.param(lambda e: rl.get_job(e, "00000000-0000-0000-0000-000000000001"), id="get_job"),
    ],
)
def test_calls_on_an_unmigrated_database_raise_schema_mismatch_naming_migrate(unmigrated, call):
    with pytest.raises(rl.RunledgerError) as raised:
        call(unmigrated)
    assert raised.value.code == "db.schema_mismatch"
    assert "runledger-sync migrate" in str(raised.value)
    with unmigrated.connect() as connection:
        tables = connection.execute(sqlalchemy.text("select count(*) from pg_tables where schemaname = 'public'")).scalar()
    assert tables == 0
