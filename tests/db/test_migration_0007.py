"""Revision 0007: the retention indexes, up and down on a real PostgreSQL."""

from __future__ import annotations

from typing import Iterator

import pytest
import sqlalchemy
from sqlalchemy.engine import Engine

from runledger_sync.db.engine import create_engine
from runledger_sync.db.migrate import current_revision, downgrade, head_revision, migrate
from tests.db.test_migration_0006 import schema_diff

RETENTION_INDEXES = {"idx_job_queue_finished", "idx_workflow_runs_finished"}


@pytest.fixture
def empty_engine(empty_database: str) -> Iterator[Engine]:
    engine = create_engine(empty_database)
    yield engine
    engine.dispose()


def index_definitions(engine: Engine) -> dict[str, str]:
    with engine.connect() as connection:
        return dict(connection.execute(sqlalchemy.text(
            "SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY(:names)"),
            {"names": sorted(RETENTION_INDEXES)}).all())


def test_0007_adds_the_partial_retention_indexes_the_metadata_declares(empty_engine):
    migrate(empty_engine)

    indexes = index_definitions(empty_engine)
    assert set(indexes) == RETENTION_INDEXES
    assert "WHERE ((status = ANY" in indexes["idx_job_queue_finished"]
    assert "workflow_step_id IS NULL" in indexes["idx_job_queue_finished"]
    assert "(finished_at, id)" in indexes["idx_workflow_runs_finished"]
    assert schema_diff(empty_engine) == []


def test_0007_downgrade_drops_them_and_upgrade_adds_them_again(empty_engine):
    migrate(empty_engine)

    downgrade(empty_engine, "0006")

    assert current_revision(empty_engine) == "0006"
    assert index_definitions(empty_engine) == {}

    migrate(empty_engine)

    assert current_revision(empty_engine) == head_revision()
    assert set(index_definitions(empty_engine)) == RETENTION_INDEXES
