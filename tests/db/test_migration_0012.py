"""Revision 0012: workflow_run_mutations, up and down on a real PostgreSQL."""

from __future__ import annotations

from typing import Iterator

import pytest
import sqlalchemy
from sqlalchemy.engine import Engine

import runledger_sync as rl
from runledger_sync.db.engine import create_engine
from runledger_sync.db.migrate import current_revision, downgrade, migrate
from tests.db.test_migration_0006 import schema_diff
from tests.support import define, scalar


@pytest.fixture
def empty_engine(empty_database: str) -> Iterator[Engine]:
    engine = create_engine(empty_database)
    yield engine
    engine.dispose()


def has_table(engine: Engine) -> bool:
    return "workflow_run_mutations" in set(sqlalchemy.inspect(engine).get_table_names())


def appended_run(engine: Engine) -> rl.WorkflowRunRecord:
    define(engine, "crawl.page")
    wf = rl.Workflow("crawl")
    wf.external("collect")
    run = rl.enqueue_workflow(engine, wf)
    more = rl.WorkflowAppend(window="collect")
    more.job("page-1", "crawl.page")
    return rl.append_workflow_steps(engine, run.id, more, mutation_key="pages")


def test_0012_adds_the_table_the_metadata_declares_and_its_rows_go_with_their_run(empty_engine):
    migrate(empty_engine)

    assert has_table(empty_engine)
    assert schema_diff(empty_engine) == []
    run = appended_run(empty_engine)
    assert scalar(empty_engine, "SELECT count(*) FROM workflow_run_mutations") == 1
    with pytest.raises(sqlalchemy.exc.IntegrityError, match="ck_workflow_run_mutations_key_not_blank"):
        with empty_engine.begin() as connection:
            connection.execute(sqlalchemy.text(
                "INSERT INTO workflow_run_mutations (run_id, mutation_key, window_step_key, step_keys, request_digest) "
                "VALUES (:run, ' ', 'collect', '{}', 'x')"), {"run": run.id})
    with empty_engine.begin() as connection:
        connection.execute(sqlalchemy.text("DELETE FROM workflow_runs WHERE id = :run"), {"run": run.id})
    assert scalar(empty_engine, "SELECT count(*) FROM workflow_run_mutations") == 0


def test_0012_downgrade_drops_it_and_upgrade_makes_it_again_empty(empty_engine):
    migrate(empty_engine)
    appended_run(empty_engine)

    downgrade(empty_engine, "0011")

    assert current_revision(empty_engine) == "0011"
    assert not has_table(empty_engine)

    migrate(empty_engine)

    assert has_table(empty_engine)
    assert scalar(empty_engine, "SELECT count(*) FROM workflow_run_mutations") == 0
    assert schema_diff(empty_engine) == []
