"""Revision 0014: job_batches, job_queue.batch_id and the batch triggers, up and down on a real PostgreSQL."""

from __future__ import annotations

from typing import Iterator

import pytest
import sqlalchemy
from sqlalchemy.engine import Engine

import runledger_sync as rl
from runledger_sync.db.engine import create_engine
from runledger_sync.db.migrate import current_revision, downgrade, migrate
from runledger_sync.db.schema_batches import (
    BATCH_FINISH_FUNCTION,
    BATCH_FINISH_TRIGGER,
    BATCH_MEMBER_ADDED_TRIGGER,
    BATCH_MEMBER_FUNCTION,
    BATCH_MEMBER_MOVED_TRIGGER,
)
from tests.db.test_migration_0006 import schema_diff
from tests.db.test_migrations import functions_named, tables_in, triggers_of
from tests.support import JOB_TYPE, define, scalar

TRIGGERS = {("job_queue", BATCH_MEMBER_ADDED_TRIGGER), ("job_queue", BATCH_MEMBER_MOVED_TRIGGER),
            ("job_batches", BATCH_FINISH_TRIGGER)}


@pytest.fixture
def empty_engine(empty_database: str) -> Iterator[Engine]:
    engine = create_engine(empty_database)
    yield engine
    engine.dispose()


def batch_column(engine: Engine) -> bool:
    return "batch_id" in {column["name"] for column in sqlalchemy.inspect(engine).get_columns("job_queue")}


def test_0014_builds_what_the_metadata_declares_and_its_counts_hold_their_rule(empty_engine):
    migrate(empty_engine)

    assert "job_batches" in tables_in(empty_engine) and batch_column(empty_engine)
    assert TRIGGERS <= triggers_of(empty_engine)
    assert schema_diff(empty_engine) == []
    define(empty_engine)
    batch = rl.open_batch(empty_engine)
    rl.enqueue(empty_engine, JOB_TYPE, {}, batch=batch.id)
    assert rl.get_batch(empty_engine, batch.id).total == 1
    with pytest.raises(sqlalchemy.exc.IntegrityError, match="ck_job_batches_counts"):
        with empty_engine.begin() as connection:
            connection.execute(sqlalchemy.text("UPDATE job_batches SET total = total + 1"))


def test_0014_upgrades_a_queue_with_jobs_and_downgrade_drops_it_keeping_the_jobs(empty_engine):
    migrate(empty_engine, "0013")
    with empty_engine.begin() as connection:  # this code's statements need 0014's column: plain SQL
        connection.execute(sqlalchemy.text("INSERT INTO job_definitions (job_type) VALUES (:t)"), {"t": JOB_TYPE})
        old = connection.execute(sqlalchemy.text(
            "INSERT INTO job_queue (id, job_type, max_attempts) VALUES (gen_random_uuid(), :t, 1) RETURNING id"),
            {"t": JOB_TYPE}).scalar_one()
    migrate(empty_engine)
    assert scalar(empty_engine, "SELECT batch_id FROM job_queue WHERE id = :id", id=old) is None
    batch = rl.open_batch(empty_engine)
    member = rl.enqueue(empty_engine, JOB_TYPE, {}, batch=batch.id)

    downgrade(empty_engine, "0013")

    assert current_revision(empty_engine) == "0013"
    assert "job_batches" not in tables_in(empty_engine) and not batch_column(empty_engine)
    assert not TRIGGERS & triggers_of(empty_engine)
    assert functions_named(empty_engine, BATCH_MEMBER_FUNCTION) == []
    assert functions_named(empty_engine, BATCH_FINISH_FUNCTION) == []
    assert scalar(empty_engine, "SELECT count(*) FROM job_queue WHERE id IN (:a, :b)", a=old, b=member.id) == 2

    migrate(empty_engine)
    assert schema_diff(empty_engine) == [] and TRIGGERS <= triggers_of(empty_engine)
