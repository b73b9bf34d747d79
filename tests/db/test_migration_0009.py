"""Revision 0009: the dashboard's rollup table, up and down on a real PostgreSQL."""

from __future__ import annotations

from typing import Iterator

import pytest
import sqlalchemy
from sqlalchemy.engine import Engine

from runledger_sync.db.engine import create_engine
from runledger_sync.db.migrate import current_revision, downgrade, head_revision, migrate
from tests.db.test_migration_0006 import schema_diff


@pytest.fixture
def empty_engine(empty_database: str) -> Iterator[Engine]:
    engine = create_engine(empty_database)
    yield engine
    engine.dispose()


def rollup_columns(engine: Engine) -> list[str]:
    return [column["name"] for column in sqlalchemy.inspect(engine).get_columns("job_rollup_minutes")] \
        if sqlalchemy.inspect(engine).has_table("job_rollup_minutes") else []


def test_0009_creates_the_rollup_table_the_metadata_declares(empty_engine):
    migrate(empty_engine)

    assert rollup_columns(empty_engine) == [
        "minute", "queue", "succeeded", "retried", "dead_lettered", "canceled", "ready",
        "oldest_due_wait_seconds", "sampled_at",
    ]
    key = sqlalchemy.inspect(empty_engine).get_pk_constraint("job_rollup_minutes")
    assert (key["name"], key["constrained_columns"]) == ("pk_job_rollup_minutes", ["minute", "queue"])
    assert schema_diff(empty_engine) == []


def test_0009_downgrade_drops_it_and_upgrade_creates_it_again(empty_engine):
    migrate(empty_engine)
    with empty_engine.begin() as connection:
        connection.execute(sqlalchemy.text(
            "INSERT INTO job_rollup_minutes (minute, queue, succeeded) VALUES (date_trunc('minute', now()), 'default', 3)"))

    downgrade(empty_engine, "0008")

    assert current_revision(empty_engine) == "0008"
    assert rollup_columns(empty_engine) == []

    migrate(empty_engine)

    assert current_revision(empty_engine) == head_revision()
    with empty_engine.connect() as connection:
        assert connection.execute(sqlalchemy.text("SELECT count(*) FROM job_rollup_minutes")).scalar_one() == 0
