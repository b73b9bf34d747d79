"""Revision 0017: workflow_runs.batch_id and a run's member triggers, up and down on a real PostgreSQL."""

from __future__ import annotations

from typing import Iterator

import pytest
import sqlalchemy
from sqlalchemy.engine import Engine

import runledger_sync as rl
from runledger_sync.db.engine import create_engine
from runledger_sync.store.attempt.ends import complete_job_success
from runledger_sync.db.migrate import current_revision, downgrade, migrate
from runledger_sync.db.schema_batches import BATCH_RUN_ADDED_TRIGGER, BATCH_RUN_MOVED_TRIGGER
from tests.db.test_migration_0006 import schema_diff
from tests.db.test_migrations import triggers_of
from tests.support import JOB_TYPE, claim_one, define, identity, scalar

TRIGGERS = {("workflow_runs", BATCH_RUN_ADDED_TRIGGER), ("workflow_runs", BATCH_RUN_MOVED_TRIGGER)}


@pytest.fixture
def empty_engine(empty_database: str) -> Iterator[Engine]:
    engine = create_engine(empty_database)
    yield engine
    engine.dispose()


def run_batch_column(engine: Engine) -> bool:
    return "batch_id" in {column["name"] for column in sqlalchemy.inspect(engine).get_columns("workflow_runs")}


def one_step() -> rl.Workflow:
    wf = rl.Workflow("migration.flow")
    wf.job("only", JOB_TYPE)
    return wf


def test_0017_upgrades_runs_and_batches_in_flight_and_downgrade_keeps_counting_jobs(empty_engine):
    migrate(empty_engine, "0016")
    define(empty_engine)
    with empty_engine.begin() as connection:  # this code's statements read 0017's column: plain SQL
        batch_id = connection.execute(sqlalchemy.text(
            "INSERT INTO job_batches (id) VALUES (gen_random_uuid()) RETURNING id")).scalar_one()
        connection.execute(sqlalchemy.text(
            "INSERT INTO job_queue (id, job_type, max_attempts, batch_id) VALUES (gen_random_uuid(), :t, 1, :b)"),
            {"t": JOB_TYPE, "b": batch_id})
        old_run = connection.execute(sqlalchemy.text(
            "INSERT INTO workflow_runs (id, name) VALUES (gen_random_uuid(), 'old') RETURNING id")).scalar_one()

    migrate(empty_engine)
    assert current_revision(empty_engine) == "0017" and TRIGGERS <= triggers_of(empty_engine)
    assert schema_diff(empty_engine) == []
    assert scalar(empty_engine, "SELECT batch_id FROM workflow_runs WHERE id = :id", id=old_run) is None
    run = rl.enqueue_workflow(empty_engine, one_step(), batch=batch_id)
    assert (rl.get_batch(empty_engine, batch_id).total, rl.get_batch(empty_engine, batch_id).runs) == (2, 1)

    downgrade(empty_engine, "0016")
    assert not run_batch_column(empty_engine) and not TRIGGERS & triggers_of(empty_engine)
    assert scalar(empty_engine, "SELECT count(*) FROM workflow_runs WHERE id = :r", r=run.id) == 1
    # The jobs' counting still holds with the function 0017 left.
    job = claim_one(empty_engine)
    complete_job_success(empty_engine, **identity(job))
    assert scalar(empty_engine, "SELECT (pending, succeeded) FROM job_batches WHERE id = :b", b=batch_id) == "(1,1)"

    migrate(empty_engine)
    assert schema_diff(empty_engine) == [] and TRIGGERS <= triggers_of(empty_engine)
