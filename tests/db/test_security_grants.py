"""The security guide's least-privilege grants are enough to enqueue and run workers, and no more.

The SQL is read from the block marked ``docs-test: grants`` (docs/guides/security.md) and run as
written (only the role name is made unique per run), so the documentation and
this test cannot drift apart.
"""

from __future__ import annotations

import os
import re
from typing import Iterator

import psycopg2
import pytest
from psycopg2 import sql
from sqlalchemy import make_url, text
from sqlalchemy.exc import DBAPIError

import runledger_sync as rl
from runledger_sync import cli
from runledger_sync.store.claim.claim import claim_jobs
from tests.db.test_docs import marked
from tests.support import expire_lease, wait_until

DOCUMENTED_ROLE = "runledger_app"
DOCUMENTED_PASSWORD = "change-me"  # noqa: S105 - the documentation's placeholder, for a throwaway test role
# Roles are cluster-wide; a suffix keeps parallel runs on one external server apart.
ROLE = f"runledger_app_test_{os.getpid()}"
JOB_TYPE = "grants.job"
INSUFFICIENT_PRIVILEGE = "42501"


def documented_grants() -> str:
    return marked("grants", "sql")


def owner_connection(url: str):
    parsed = make_url(url)
    return psycopg2.connect(
        dbname=parsed.database, user=parsed.username, password=parsed.password,
        host=parsed.host or parsed.query.get("host"), port=parsed.port or parsed.query.get("port"),
    )


@pytest.fixture
def role_url(fresh_database) -> Iterator[str]:
    """A URL for a new role holding exactly the documented grants on the migrated test database."""
    statements = [part.strip() for part in documented_grants().split(";") if part.strip()]
    assert any(s.upper().startswith("CREATE ROLE") for s in statements)
    conn = owner_connection(fresh_database)
    conn.autocommit = True
    quoted_role = sql.Identifier(ROLE).as_string(conn)
    with conn.cursor() as cursor:
        cursor.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(ROLE)))
        for statement in statements:
            # The documentation's own text; only its role name is swapped for this run's, quoted.
            cursor.execute(re.sub(rf"\b{DOCUMENTED_ROLE}\b", quoted_role, statement))
    try:
        yield make_url(fresh_database).set(username=ROLE, password=DOCUMENTED_PASSWORD).render_as_string(
            hide_password=False)
    finally:
        with conn.cursor() as cursor:
            # Revoke in this database first, or the role could not be dropped.
            cursor.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(ROLE)))
            cursor.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(ROLE)))
        conn.close()


@pytest.fixture
def role_engine(role_url):
    engine = rl.create_engine(role_url)
    yield engine
    engine.dispose()


def test_the_role_is_not_the_owner(role_engine):
    with role_engine.connect() as conn:
        assert conn.execute(text("SELECT current_user")).scalar() == ROLE
        owner = conn.execute(text("SELECT tableowner FROM pg_tables WHERE tablename = 'job_queue'")).scalar()
    assert owner != ROLE


def test_the_documented_grants_can_enqueue_run_a_worker_and_a_reaper(role_engine, engine):
    registry = rl.JobRegistry()

    @registry.job(JOB_TYPE, max_attempts=3)
    def handle(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
        return rl.JobCompletion.success().with_output({"seen": payload["n"]})

    rl.check_schema(role_engine)
    registry.sync_definitions(role_engine)
    fresh = rl.enqueue(role_engine, JOB_TYPE, {"n": 1})
    # A job whose worker died: the reaper must be able to take it back, as this role.
    orphan = rl.enqueue(role_engine, JOB_TYPE, {"n": 2}, priority=1_000_000)
    assert [job.id for job in claim_jobs(role_engine, worker_id="dead-worker", lease_ttl_seconds=60, limit=1,
                                         job_types=[JOB_TYPE])] == [orphan.id]
    expire_lease(engine, orphan.id)
    config = rl.JobsConfig(poll_interval_ms=20, lease_ttl_seconds=5, heartbeat_interval_seconds=0.5,
                           reaper_interval_seconds=0.2, reaper_retry_delay_ms=1)

    supervisor = rl.Supervisor(role_engine, registry, config)
    supervisor.start()
    try:
        wait_until(lambda: rl.count_jobs(role_engine, status=rl.JobStatus.SUCCEEDED) == 2, timeout=30)
    finally:
        supervisor.stop(timeout=20)

    done = {job.id: job for job in rl.list_jobs(role_engine)}
    assert done[fresh.id].output == {"seen": 1} and done[fresh.id].attempt == 1
    assert done[orphan.id].output == {"seen": 2} and done[orphan.id].attempt == 2
    assert "LEASE_EXPIRED" in {a.outcome for a in rl.list_attempts(role_engine, orphan.id)}


def test_the_documented_grants_cover_the_operator_actions(role_engine, role_url, capsys):
    registry = rl.JobRegistry()
    registry.job(JOB_TYPE)(lambda ctx, payload: None)
    registry.sync_definitions(role_engine)
    job = rl.enqueue(role_engine, JOB_TYPE, {}, organization_id="org-1")

    assert rl.cancel_job(role_engine, job.id, organization_id="org-1").status is rl.JobStatus.CANCELED
    assert rl.requeue_job(role_engine, job.id).status is rl.JobStatus.PENDING
    assert rl.queue_stats(role_engine).by_status["PENDING"] == 1
    assert [e.event_type for e in rl.list_events(role_engine, job.id)] == ["ENQUEUED", "CANCELED", "REQUEUED"]
    assert cli.main(["--database-url", role_url, "stats", "--json"]) == 0
    assert cli.main(["--database-url", role_url, "check-schema"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    "statement",
    [
        "DROP TABLE job_queue",
        "ALTER TABLE job_queue ADD COLUMN sneaky int",
        "TRUNCATE job_events",
        "CREATE TABLE public.sneaky (i int)",
        "CREATE INDEX sneaky ON job_queue (payload)",
        # job_queue has no trigger since revision 0003 (IF EXISTS would pass unchecked); schedules keep theirs.
        "DROP TRIGGER IF EXISTS trg_job_schedules_updated_at ON job_schedules",
        "UPDATE runledger_alembic_version SET version_num = 'x'",
    ],
)
def test_the_role_cannot_change_the_schema(role_engine, engine, statement):
    with pytest.raises(DBAPIError) as caught:
        with role_engine.begin() as conn:
            conn.execute(text(statement))

    assert caught.value.orig.pgcode == INSUFFICIENT_PRIVILEGE, caught.value.orig
    rl.check_schema(engine)


def test_migrations_need_the_owner(role_engine, engine):
    with pytest.raises(rl.RunledgerError):
        rl.downgrade(role_engine, "base")

    rl.check_schema(engine)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT to_regclass('job_queue') IS NOT NULL")).scalar()
