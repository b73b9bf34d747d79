"""Revision 0015: the job_operations table and the GIN index over job_queue.meta, up and down on a real PostgreSQL."""

from __future__ import annotations

from typing import Iterator

import pytest
import sqlalchemy
from sqlalchemy.engine import Engine

import runledger_sync as rl
from runledger_sync.db.engine import create_engine
from runledger_sync.db.migrate import current_revision, downgrade, migrate
from tests.db.test_migration_0006 import schema_diff
from tests.support import JOB_TYPE, define, scalar

META_INDEX = "idx_job_queue_meta"


@pytest.fixture
def empty_engine(empty_database: str) -> Iterator[Engine]:
    engine = create_engine(empty_database)
    yield engine
    engine.dispose()


def shape(engine: Engine) -> tuple[bool, bool]:
    inspector = sqlalchemy.inspect(engine)
    return (inspector.has_table("job_operations"),
            META_INDEX in {index["name"] for index in inspector.get_indexes("job_queue")})


def test_0015_builds_what_the_metadata_declares_and_a_bulk_action_is_recorded(empty_engine):
    migrate(empty_engine)

    assert shape(empty_engine) == (True, True)
    assert schema_diff(empty_engine) == []
    assert "jsonb_path_ops" in scalar(empty_engine, "SELECT pg_get_indexdef(CAST(:name AS regclass))", name=META_INDEX)
    define(empty_engine)
    rl.enqueue(empty_engine, JOB_TYPE, {}, meta={"tenant": "acme"})
    assert rl.cancel_jobs(empty_engine, rl.JobFilter(meta={"tenant": "acme"}), reason="r").changed == 1
    assert [op.action for op in rl.list_operations(empty_engine)] == ["cancel"]


def test_0015_downgrade_drops_it_keeping_the_jobs_and_upgrade_makes_it_again(empty_engine):
    migrate(empty_engine)
    define(empty_engine)
    kept = rl.enqueue(empty_engine, JOB_TYPE, {}, meta={"tenant": "acme"})

    downgrade(empty_engine, "0014")

    assert current_revision(empty_engine) == "0014"
    assert shape(empty_engine) == (False, False)
    assert rl.get_job(empty_engine, kept.id) is not None
    migrate(empty_engine)
    assert shape(empty_engine) == (True, True)
    assert schema_diff(empty_engine) == []


def test_0015_keeps_a_meta_index_built_concurrently_by_hand_beforehand(empty_engine):
    migrate(empty_engine)
    downgrade(empty_engine, "0014")
    with empty_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql(f"CREATE INDEX CONCURRENTLY {META_INDEX} ON job_queue USING gin (meta jsonb_path_ops)")

    migrate(empty_engine)

    assert shape(empty_engine) == (True, True)
    assert schema_diff(empty_engine) == []
