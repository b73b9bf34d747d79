"""Revision 0016: job_replays, up and down on a real PostgreSQL."""

from __future__ import annotations

from typing import Iterator

import pytest
import sqlalchemy
from sqlalchemy.engine import Engine

import runledger_sync as rl
from runledger_sync.db.engine import create_engine
from runledger_sync.db.migrate import current_revision, downgrade, migrate
from tests.db.test_migration_0006 import schema_diff
from tests.db.test_migrations import tables_in
from tests.support import JOB_TYPE, define, scalar


@pytest.fixture
def empty_engine(empty_database: str) -> Iterator[Engine]:
    engine = create_engine(empty_database)
    yield engine
    engine.dispose()


def finished_job(engine: Engine) -> rl.JobRecord:
    define(engine)
    job = rl.enqueue(engine, JOB_TYPE, {})
    return rl.cancel_job(engine, job.id)


def test_0016_builds_what_the_metadata_declares_and_a_replay_is_recorded(empty_engine):
    migrate(empty_engine)

    assert "job_replays" in tables_in(empty_engine)
    assert schema_diff(empty_engine) == []
    job = finished_job(empty_engine)
    assert rl.replay_job(empty_engine, job.id, replay_key="k", reason="why").run_number == 2
    with pytest.raises(sqlalchemy.exc.IntegrityError, match="ck_job_replays_reason_not_blank"):
        with empty_engine.begin() as connection:
            connection.execute(sqlalchemy.text("UPDATE job_replays SET reason = ' '"))


def test_0016_downgrade_drops_the_table_keeping_the_jobs_and_upgrade_makes_it_again(empty_engine):
    migrate(empty_engine)
    job = finished_job(empty_engine)
    rl.replay_job(empty_engine, job.id, replay_key="k", reason="why")

    downgrade(empty_engine, "0015")

    assert current_revision(empty_engine) == "0015"
    assert "job_replays" not in tables_in(empty_engine)
    assert scalar(empty_engine, "SELECT run_number FROM job_queue WHERE id = :id", id=job.id) == 2

    migrate(empty_engine)

    assert schema_diff(empty_engine) == []
    assert rl.list_replays(empty_engine) == []
