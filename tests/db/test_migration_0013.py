"""Revision 0013: unique and debounced jobs' columns, indexes and re-entry trigger, up and down on a real PostgreSQL."""

from __future__ import annotations

from typing import Iterator

import pytest
import sqlalchemy
from sqlalchemy.engine import Engine

import runledger_sync as rl
from runledger_sync.db.engine import create_engine
from runledger_sync.db.migrate import current_revision, downgrade, migrate
from runledger_sync.db.schema_unique import UNIQUE_REENTRY_FUNCTION, UNIQUE_REENTRY_TRIGGER
from tests.db.test_migration_0006 import schema_diff
from tests.db.test_migrations import functions_named, triggers_of
from tests.support import JOB_TYPE, define, scalar

COLUMNS = {"unique_key", "unique_states", "debounce_count", "debounce_until"}
INDEXES = {"uq_job_queue_unique_org", "uq_job_queue_unique_global"}


@pytest.fixture
def empty_engine(empty_database: str) -> Iterator[Engine]:
    engine = create_engine(empty_database)
    yield engine
    engine.dispose()


def job_queue_shape(engine: Engine) -> tuple[set[str], set[str]]:
    inspector = sqlalchemy.inspect(engine)
    columns = {column["name"] for column in inspector.get_columns("job_queue")}
    indexes = {index["name"] for index in inspector.get_indexes("job_queue")}
    return columns & COLUMNS, indexes & INDEXES


def test_0013_builds_what_the_metadata_declares_and_a_unique_enqueue_works(empty_engine):
    migrate(empty_engine)

    assert job_queue_shape(empty_engine) == (COLUMNS, INDEXES)
    assert ("job_queue", UNIQUE_REENTRY_TRIGGER) in triggers_of(empty_engine)
    assert schema_diff(empty_engine) == []
    define(empty_engine)
    first = rl.enqueue(empty_engine, JOB_TYPE, {}, unique=rl.Unique(key="k"))
    assert rl.enqueue(empty_engine, JOB_TYPE, {}, unique=rl.Unique(key="k")).id == first.id
    with pytest.raises(sqlalchemy.exc.IntegrityError, match="ck_job_queue_debounce_count_non_negative"):
        with empty_engine.begin() as connection:
            connection.execute(sqlalchemy.text("UPDATE job_queue SET debounce_count = -1"))


def test_0013_downgrade_drops_it_keeping_the_jobs_and_upgrade_makes_it_again(empty_engine):
    migrate(empty_engine)
    define(empty_engine)
    kept = rl.enqueue(empty_engine, JOB_TYPE, {}, debounce=rl.Debounce("d", 5, 60))

    downgrade(empty_engine, "0012")

    assert current_revision(empty_engine) == "0012"
    assert job_queue_shape(empty_engine) == (set(), set())
    assert ("job_queue", UNIQUE_REENTRY_TRIGGER) not in triggers_of(empty_engine)
    assert functions_named(empty_engine, UNIQUE_REENTRY_FUNCTION) == []
    assert scalar(empty_engine, "SELECT count(*) FROM job_queue WHERE id = :id", id=kept.id) == 1

    migrate(empty_engine)

    assert job_queue_shape(empty_engine) == (COLUMNS, INDEXES)
    assert schema_diff(empty_engine) == []
    # The job kept across the round trip is a plain one now: it blocks nothing.
    assert rl.enqueue(empty_engine, JOB_TYPE, {}, debounce=rl.Debounce("d", 5, 60)).disposition == "created"
