"""Revision 0006: each attempt's failing exception type and bounded traceback, up and down on a real PostgreSQL."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import sqlalchemy
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Engine

from runledger_sync.core.evidence import MAX_ERROR_TYPE_CHARS, MAX_TRACEBACK_CHARS
from runledger_sync.db.engine import create_engine
from runledger_sync.db.migrate import VERSION_TABLE, current_revision, downgrade, migrate
from runledger_sync.db.schema import metadata

EVIDENCE_COLUMNS = {"error_type", "traceback"}
EVIDENCE_CHECKS = {"ck_job_attempts_error_type", "ck_job_attempts_traceback"}


@pytest.fixture
def empty_engine(empty_database: str) -> Iterator[Engine]:
    engine = create_engine(empty_database)
    yield engine
    engine.dispose()


def attempt_columns(engine: Engine) -> set[str]:
    with engine.connect() as connection:
        return set(connection.execute(sqlalchemy.text(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'job_attempts'")).scalars())


def evidence_checks(engine: Engine, schema: str = "public") -> dict[str, str]:
    with engine.connect() as connection:
        return dict(connection.execute(sqlalchemy.text(
            "SELECT c.conname, pg_get_constraintdef(c.oid) FROM pg_constraint c "
            "JOIN pg_class t ON t.oid = c.conrelid JOIN pg_namespace n ON n.oid = t.relnamespace "
            "WHERE t.relname = 'job_attempts' AND n.nspname = :schema AND c.conname = ANY(:names)"),
            {"schema": schema, "names": sorted(EVIDENCE_CHECKS)}).all())


def schema_diff(engine: Engine) -> list[Any]:
    def include_name(name: Any, type_: str, parent_names: Any) -> bool:
        return not (type_ == "table" and name == VERSION_TABLE)

    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True, "include_name": include_name})
        return list(compare_metadata(context, metadata))


def insert_attempt(engine: Engine, **evidence: Any) -> None:
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text(
            "INSERT INTO job_definitions (job_type) VALUES ('kept') ON CONFLICT DO NOTHING"))
        job_id = connection.execute(sqlalchemy.text(
            "INSERT INTO job_queue (id, job_type, max_attempts) VALUES (gen_random_uuid(), 'kept', 3) "
            "RETURNING id")).scalar_one()
        columns = ", ".join(["id", "job_id", "attempt", *evidence])
        values = ", ".join(["gen_random_uuid()", ":job_id", "1", *(f":{name}" for name in evidence)])
        connection.execute(sqlalchemy.text(f"INSERT INTO job_attempts ({columns}) VALUES ({values})"),
                           {"job_id": job_id, **evidence})


def test_0006_adds_the_evidence_columns_with_their_size_checks(empty_engine):
    migrate(empty_engine)

    assert EVIDENCE_COLUMNS <= attempt_columns(empty_engine)
    assert schema_diff(empty_engine) == []
    checks = evidence_checks(empty_engine)
    assert set(checks) == EVIDENCE_CHECKS
    assert f"<= {MAX_ERROR_TYPE_CHARS}" in checks["ck_job_attempts_error_type"]
    assert f"<= {MAX_TRACEBACK_CHARS}" in checks["ck_job_attempts_traceback"]


def test_the_migrated_checks_are_the_ones_the_metadata_builds(empty_database, empty_engine):
    # compare_metadata() does not compare CHECK constraints: compare their definitions here.
    migrate(empty_engine)
    built = create_engine(empty_database, schema="built_by_metadata")
    try:
        with empty_engine.begin() as connection:
            connection.exec_driver_sql("CREATE SCHEMA built_by_metadata")
        with built.begin() as connection:
            metadata.create_all(connection)
        migrated, from_metadata = evidence_checks(empty_engine), evidence_checks(empty_engine, "built_by_metadata")
    finally:
        built.dispose()
    assert migrated == from_metadata


def test_the_checks_refuse_a_traceback_or_type_over_the_cap(empty_engine):
    migrate(empty_engine)
    insert_attempt(empty_engine, error_type="t" * MAX_ERROR_TYPE_CHARS, traceback="x" * MAX_TRACEBACK_CHARS)

    with pytest.raises(sqlalchemy.exc.IntegrityError, match="ck_job_attempts_traceback"):
        insert_attempt(empty_engine, traceback="x" * (MAX_TRACEBACK_CHARS + 1))
    with pytest.raises(sqlalchemy.exc.IntegrityError, match="ck_job_attempts_error_type"):
        insert_attempt(empty_engine, error_type="t" * (MAX_ERROR_TYPE_CHARS + 1))


def test_0006_downgrade_drops_the_evidence_and_keeps_the_attempts_and_upgrade_adds_it_again(empty_engine):
    migrate(empty_engine)
    insert_attempt(empty_engine, error_type="KeyError", traceback="Traceback ...\nKeyError: 'x'\n")

    downgrade(empty_engine, "0005")

    assert current_revision(empty_engine) == "0005"
    assert attempt_columns(empty_engine) & EVIDENCE_COLUMNS == set()
    assert evidence_checks(empty_engine) == {}
    with empty_engine.connect() as connection:
        assert connection.execute(sqlalchemy.text("SELECT count(*) FROM job_attempts")).scalar_one() == 1

    migrate(empty_engine)

    with empty_engine.connect() as connection:
        kept = connection.execute(sqlalchemy.text("SELECT error_type, traceback FROM job_attempts")).all()
    assert [tuple(row) for row in kept] == [(None, None)]  # the rows from before 0006 have no evidence
    assert set(evidence_checks(empty_engine)) == EVIDENCE_CHECKS
    assert schema_diff(empty_engine) == []
