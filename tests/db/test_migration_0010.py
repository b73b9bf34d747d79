"""Revision 0010: job_queue.meta and workflow_runs.meta, up and down on a real PostgreSQL."""

from __future__ import annotations

from typing import Iterator

import pytest
import sqlalchemy
from sqlalchemy.engine import Engine

from runledger_sync.db.engine import create_engine
from runledger_sync.db.migrate import current_revision, downgrade, head_revision, migrate
from tests.db.test_migration_0006 import schema_diff

META_COLUMNS = {("job_queue", "meta", "'{}'::jsonb", "NO"), ("workflow_runs", "meta", "'{}'::jsonb", "NO")}


@pytest.fixture
def empty_engine(empty_database: str) -> Iterator[Engine]:
    engine = create_engine(empty_database)
    yield engine
    engine.dispose()


def meta_columns(engine: Engine) -> set[tuple[str, ...]]:
    with engine.connect() as connection:
        return {tuple(row) for row in connection.execute(sqlalchemy.text(
            "SELECT table_name, column_name, column_default, is_nullable FROM information_schema.columns "
            "WHERE column_name = 'meta' AND table_name IN ('job_queue', 'workflow_runs')"))}


def write_job(engine: Engine, meta: str = "{}") -> None:
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text(
            "INSERT INTO job_definitions (job_type) VALUES ('t') ON CONFLICT DO NOTHING;"
            "INSERT INTO job_queue (id, job_type, max_attempts, meta) "
            "VALUES (gen_random_uuid(), 't', 1, CAST(:meta AS jsonb))"), {"meta": meta})


def test_0010_adds_the_columns_and_checks_the_metadata_declares(empty_engine):
    migrate(empty_engine)

    assert meta_columns(empty_engine) == META_COLUMNS
    write_job(empty_engine, '{"tenant": "acme"}')
    with pytest.raises(sqlalchemy.exc.IntegrityError, match="ck_job_queue_meta_object"):
        write_job(empty_engine, '["not", "an", "object"]')
    assert schema_diff(empty_engine) == []


def test_0010_downgrade_drops_them_and_upgrade_adds_them_again_empty(empty_engine):
    migrate(empty_engine)
    write_job(empty_engine, '{"tenant": "acme"}')

    downgrade(empty_engine, "0009")

    assert current_revision(empty_engine) == "0009"
    assert meta_columns(empty_engine) == set()

    migrate(empty_engine)

    assert current_revision(empty_engine) == head_revision()
    assert meta_columns(empty_engine) == META_COLUMNS
    with empty_engine.connect() as connection:
        # The job written before the downgrade lost its metadata with the column, and reads as empty.
        assert connection.execute(sqlalchemy.text("SELECT meta FROM job_queue")).scalar_one() == {}
    assert schema_diff(empty_engine) == []
