"""Revision 0008: continuations' columns, the CONTINUED attempt outcome and the key settle rule, up and down."""

from __future__ import annotations

from typing import Iterator

import pytest
import sqlalchemy
from sqlalchemy.engine import Engine

from runledger_sync.db.engine import create_engine
from runledger_sync.db.migrate import current_revision, downgrade, migrate
from runledger_sync.db.schema_queues import KEY_SETTLE_FUNCTION, KEY_UNDER_WAY, KEY_UNDER_WAY_0005
from tests.db.test_migration_0006 import schema_diff

NEW_COLUMNS = {("job_definitions", "max_continuations", "100"), ("job_queue", "continuations", "0"),
               ("workflow_steps", "allow_continuation", "false")}


@pytest.fixture
def empty_engine(empty_database: str) -> Iterator[Engine]:
    engine = create_engine(empty_database)
    yield engine
    engine.dispose()


def new_columns(engine: Engine) -> set[tuple[str, str, str]]:
    with engine.connect() as connection:
        return {tuple(row) for row in connection.execute(sqlalchemy.text(
            "SELECT table_name, column_name, column_default FROM information_schema.columns "
            "WHERE (table_name, column_name) IN (('job_definitions', 'max_continuations'), "
            "('job_queue', 'continuations'), ('workflow_steps', 'allow_continuation'))"))}


def settle_function(engine: Engine) -> str:
    with engine.connect() as connection:
        return connection.execute(sqlalchemy.text("SELECT prosrc FROM pg_proc WHERE proname = :name"),
                                  {"name": KEY_SETTLE_FUNCTION}).scalar_one()


def write_continued_attempt(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text(
            "INSERT INTO job_definitions (job_type) VALUES ('t');"
            "INSERT INTO job_queue (id, job_type, max_attempts) VALUES ('00000000-0000-7000-8000-000000000001', 't', 1);"
            "INSERT INTO job_attempts (id, job_id, attempt, finished_at, outcome) VALUES "
            "('00000000-0000-7000-8000-000000000002', '00000000-0000-7000-8000-000000000001', 1, now(), 'CONTINUED')"))


def test_0008_adds_the_columns_and_rules_the_metadata_declares(empty_engine):
    migrate(empty_engine)

    assert new_columns(empty_engine) == NEW_COLUMNS
    assert KEY_UNDER_WAY in settle_function(empty_engine)
    write_continued_attempt(empty_engine)  # the outcome check admits CONTINUED
    assert schema_diff(empty_engine) == []


def test_0008_downgrade_removes_them_and_upgrade_adds_them_again(empty_engine):
    migrate(empty_engine)
    write_continued_attempt(empty_engine)

    downgrade(empty_engine, "0007")

    assert current_revision(empty_engine) == "0007"
    assert new_columns(empty_engine) == set()
    body = settle_function(empty_engine)
    assert KEY_UNDER_WAY_0005 in body and "continuations" not in body
    with empty_engine.connect() as connection:
        # The continued run's attempt reads as finished without a failure; CONTINUED is refused again.
        assert connection.execute(sqlalchemy.text("SELECT outcome FROM job_attempts")).scalar_one() is None
        with pytest.raises(sqlalchemy.exc.IntegrityError):
            connection.execute(sqlalchemy.text("UPDATE job_attempts SET outcome = 'CONTINUED'"))

    migrate(empty_engine, "0008")

    assert current_revision(empty_engine) == "0008"
    assert new_columns(empty_engine) == NEW_COLUMNS
    assert KEY_UNDER_WAY in settle_function(empty_engine)
    migrate(empty_engine)
    assert schema_diff(empty_engine) == []
