"""Enqueue inside a raw psycopg 3 connection's transaction (``psycopg.Connection``).

What Django 4.2+ hands in as ``connection.connection`` when psycopg 3 is
installed, and what plain psycopg 3 apps hold. Each test writes through the
caller's own connection and reads the outcome back through another one. The
driver-independent error codes are checked here for both drivers side by side.
"""

from __future__ import annotations

import datetime
import threading
from typing import Any, Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy import text
from sqlalchemy.engine import make_url

import runledger_sync as rl
from runledger_sync.core.records import JobSpec, LeaseIdentity
from runledger_sync.core.types import JobStatus
from runledger_sync.db.errors import translate
from runledger_sync.store import lifecycle
from runledger_sync.store._running import mark_job_running
from tests.handlers import fast_config
from tests.support import JOB_TYPE, claim_one, define, identity, run_worker_until, scalar, wait_until

psycopg = pytest.importorskip("psycopg")
# Submodules that `import psycopg` loads itself.
Format, TransactionStatus = psycopg.pq.Format, psycopg.pq.TransactionStatus
dict_row = psycopg.rows.dict_row
TextLoader = psycopg.types.string.TextLoader


def psycopg_connect(url: str, **options: Any) -> psycopg.Connection[Any]:
    """Open a plain psycopg 3 connection to the database a SQLAlchemy URL names."""
    parsed = make_url(url)
    params: dict[str, Any] = {"dbname": parsed.database, "user": parsed.username}
    host = parsed.host or parsed.query.get("host")
    port = parsed.port or parsed.query.get("port")
    if host:
        params["host"] = host
    if port:
        params["port"] = int(port)
    if parsed.password:
        params["password"] = parsed.password
    return psycopg.connect(**params, **options)


class NaiveTimestampLoader(psycopg.adapt.Loader):
    """What Django with USE_TZ = False loads timestamptz as: a naive datetime."""

    def load(self, data: Any) -> datetime.datetime:
        return datetime.datetime.fromisoformat(bytes(data).decode()[:19])


@pytest.fixture
def orders(engine) -> Any:
    define(engine)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE orders (id serial PRIMARY KEY, ref text NOT NULL)"))
    return engine


@pytest.fixture
def raw(orders, fresh_database) -> Iterator[psycopg.Connection[Any]]:
    connection = psycopg_connect(fresh_database)
    try:
        yield connection
    finally:
        connection.close()


def write_own_row(connection: psycopg.Connection[Any], ref: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO orders (ref) VALUES (%s)", (ref,))


def order_count(engine: Any) -> int:
    return scalar(engine, "SELECT count(*) FROM orders")


def test_committed_enqueue_exists_only_after_the_caller_commits_and_then_runs(raw, orders):
    ran = threading.Event()
    registry = rl.JobRegistry()

    @registry.job(JOB_TYPE)
    def handle(ctx, payload):
        ran.set()

    write_own_row(raw, "order-1")
    job = rl.enqueue(raw, JOB_TYPE, {"order": "order-1"})
    assert job.status is JobStatus.PENDING and job.payload == {"order": "order-1"}
    assert job.created_at.tzinfo is not None
    # Another connection cannot see it yet: the insert joined the open transaction.
    assert rl.get_job(orders, job.id) is None
    assert order_count(orders) == 0
    raw.commit()

    assert rl.get_job(orders, job.id).status is JobStatus.PENDING
    assert order_count(orders) == 1
    run_worker_until(orders, registry, fast_config(), lambda: rl.get_job(orders, job.id).status is JobStatus.SUCCEEDED)
    assert ran.is_set()


def test_rolled_back_enqueue_leaves_no_job_no_event_and_no_own_row(raw, orders):
    write_own_row(raw, "order-1")
    job = rl.enqueue(raw, JOB_TYPE, {"order": "order-1"})
    raw.rollback()

    assert rl.get_job(orders, job.id) is None
    assert scalar(orders, "SELECT count(*) FROM job_queue") == 0
    assert scalar(orders, "SELECT count(*) FROM job_events") == 0
    assert order_count(orders) == 0


def test_enqueue_many_and_reads_join_the_same_open_transaction(raw, orders):
    write_own_row(raw, "order-1")
    jobs = rl.enqueue_many(raw, [JobSpec(JOB_TYPE, {"n": 1}), JobSpec(JOB_TYPE, {"n": 2})])
    assert rl.get_job(raw, jobs[0].id).payload == {"n": 1}
    assert [event.event_type for event in rl.list_events(raw, jobs[1].id)] == [rl.JobEventType.ENQUEUED]
    assert rl.count_jobs(raw) == 2
    raw.commit()

    assert rl.count_jobs(orders) == 2
    assert order_count(orders) == 1
    claimed = claim_one(orders)
    mark_job_running(orders, LeaseIdentity.of(claimed))
    assert lifecycle.complete_job_success(orders, **identity(claimed)).status is JobStatus.SUCCEEDED


def test_connection_is_left_open_in_its_transaction_with_its_settings_and_loaders(orders, fresh_database):
    raw = psycopg_connect(fresh_database, row_factory=dict_row)
    try:
        # What Django does to its connections: jsonb comes back as text, and
        # timestamptz naive when USE_TZ = False.
        raw.adapters.register_loader("jsonb", TextLoader)
        raw.adapters.register_loader("timestamptz", NaiveTimestampLoader)
        raw.adapters.register_loader("uuid", TextLoader)
        oids = [psycopg.adapters.types[name].oid for name in ("jsonb", "json", "uuid", "timestamptz")]
        loaders_before = [raw.adapters.get_loader(oid, Format.TEXT) for oid in oids]
        with raw.cursor() as cursor:
            cursor.execute("SET LOCAL application_name = 'caller-txn'")

        job = rl.enqueue(raw, JOB_TYPE, {"n": 1})

        # Our statements decode JSON, UUIDs and time stamps for themselves...
        assert job.payload == {"n": 1}
        assert job.created_at.tzinfo is not None
        assert rl.get_job(raw, job.id).id == job.id
        # ...without changing how the caller's connection decodes them.
        with raw.cursor() as cursor:
            cursor.execute("SELECT payload, id, created_at FROM job_queue WHERE id = %s", (job.id,))
            row = cursor.fetchone()
            assert row["payload"] == '{"n": 1}' and row["id"] == str(job.id)
            assert row["created_at"].tzinfo is None
            # The transaction is still the caller's: its SET LOCAL is still in force.
            cursor.execute("SHOW application_name")
            assert cursor.fetchone() == {"application_name": "caller-txn"}
        assert raw.row_factory is dict_row
        assert raw.autocommit is False
        assert not raw.closed
        assert raw.info.transaction_status == TransactionStatus.INTRANS
        assert [raw.adapters.get_loader(oid, Format.TEXT) for oid in oids] == loaders_before
        raw.rollback()
    finally:
        raw.close()
    assert rl.count_jobs(orders) == 0


def test_an_idle_connection_is_left_in_the_transaction_the_enqueue_began(raw, orders):
    # The first statement on an idle connection begins a transaction (psycopg's
    # own rule); nothing of ours commits or rolls it back.
    assert raw.info.transaction_status == TransactionStatus.IDLE
    job = rl.enqueue(raw, JOB_TYPE, {"n": 1})
    assert raw.info.transaction_status == TransactionStatus.INTRANS
    assert rl.get_job(orders, job.id) is None
    raw.commit()
    assert rl.get_job(orders, job.id) is not None


def test_dict_rows_by_default_still_work(orders, fresh_database):
    raw = psycopg_connect(fresh_database, row_factory=dict_row)
    try:
        job = rl.enqueue(raw, JOB_TYPE, {"n": 1})
        assert rl.get_job(raw, job.id).payload == {"n": 1}
        assert rl.count_jobs(raw) == 1
        raw.commit()
    finally:
        raw.close()
    assert rl.get_job(orders, job.id).payload == {"n": 1}


def test_a_closed_connection_is_refused_with_invalid_argument(orders, fresh_database):
    raw = psycopg_connect(fresh_database)
    raw.close()
    with pytest.raises(rl.InvalidArgument, match="closed psycopg connection"):
        rl.enqueue(raw, JOB_TYPE, {})


def test_autocommit_connection_commits_each_statement_as_it_is(orders, fresh_database):
    raw = psycopg_connect(fresh_database, autocommit=True)
    try:
        job = rl.enqueue(raw, JOB_TYPE, {"n": 1})
        # Visible at once to other connections: the caller chose autocommit.
        assert rl.get_job(orders, job.id) is not None
        assert raw.autocommit is True
        assert raw.info.transaction_status == TransactionStatus.IDLE
    finally:
        raw.close()


def test_a_transaction_block_on_an_autocommit_connection_is_joined(orders, fresh_database):
    raw = psycopg_connect(fresh_database, autocommit=True)
    try:
        with pytest.raises(RuntimeError, match="after enqueue"), raw.transaction():
            write_own_row(raw, "order-1")
            rl.enqueue(raw, JOB_TYPE, {"n": 1})
            raise RuntimeError("the app fails after enqueue")
    finally:
        raw.close()
    assert rl.count_jobs(orders) == 0
    assert order_count(orders) == 0


def test_unknown_job_type_raises_the_coded_error_and_leaves_the_rollback_to_the_caller(raw, orders):
    write_own_row(raw, "order-1")
    with pytest.raises(rl.DefinitionNotFoundOrDisabled):
        rl.enqueue(raw, "no.such.type", {})
    assert not raw.closed and raw.info.transaction_status != TransactionStatus.IDLE
    raw.rollback()

    assert order_count(orders) == 0
    assert rl.count_jobs(orders) == 0


def test_idempotency_conflict_raises_the_coded_error_and_leaves_the_rollback_to_the_caller(raw, orders):
    first = rl.enqueue(raw, JOB_TYPE, {"n": 1}, idempotency_key="k-1")
    assert rl.enqueue(raw, JOB_TYPE, {"n": 1}, idempotency_key="k-1").id == first.id
    with pytest.raises(rl.IdempotencyConflict):
        rl.enqueue(raw, JOB_TYPE, {"n": 2}, idempotency_key="k-1")
    assert not raw.closed and raw.info.transaction_status != TransactionStatus.IDLE
    raw.rollback()

    assert rl.count_jobs(orders) == 0


def test_its_own_search_path_is_used_and_errors_are_coded(raw, orders):
    with orders.begin() as conn:
        conn.execute(text("CREATE SCHEMA elsewhere"))
    with raw.cursor() as cursor:
        cursor.execute("SET search_path TO elsewhere")
    # The connection's own search path finds no job tables there: the coded answer says to migrate.
    with pytest.raises(rl.SchemaMismatch, match=r'db\.schema_mismatch: .*\(relation "job_queue" does not exist\)'):
        rl.enqueue(raw, JOB_TYPE, {"n": 1})
    assert raw.info.transaction_status == TransactionStatus.INERROR
    raw.rollback()
    with raw.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def terminate_backend(engine: Any, pid: int) -> None:
    """End a server session, as a restart or an admin would, and wait until it is gone."""
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    wait_until(lambda: not scalar(engine, "SELECT count(*) FROM pg_stat_activity WHERE pid = :pid", pid=pid))


def test_a_lost_connection_raises_connection_failed(raw, orders):
    with raw.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    raw.rollback()
    terminate_backend(orders, pid)
    with pytest.raises(rl.ConnectionFailed):
        rl.enqueue(raw, JOB_TYPE, {"n": 1})


# The same failures through either driver translate to the same codes.
DRIVERS = ["psycopg2", "psycopg"]


@pytest.fixture(params=DRIVERS)
def driver_engine(request, fresh_database) -> Iterator[sa.Engine]:
    url = make_url(fresh_database).set(drivername=f"postgresql+{request.param}")
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE parents (id int CONSTRAINT pk_parents PRIMARY KEY)"))
        conn.execute(text("CREATE TABLE children (parent_id int CONSTRAINT fk_children_parent REFERENCES parents)"))
        conn.execute(text("INSERT INTO parents VALUES (1)"))
    yield engine
    engine.dispose()


def translated(engine: sa.Engine, *statements: str) -> rl.RunledgerError:
    with engine.connect() as conn, pytest.raises(sa.exc.DBAPIError) as caught:
        for statement in statements:
            conn.execute(text(statement))
    return translate(caught.value, engine.url)


def test_unique_violation_is_coded_alike_on_both_drivers(driver_engine):
    error = translated(driver_engine, "INSERT INTO parents VALUES (1)")
    assert isinstance(error, rl.errors.UniqueViolation)
    assert (error.code, error.details) == ("db.unique_violation", {"sqlstate": "23505", "constraint": "pk_parents"})


def test_foreign_key_violation_is_coded_alike_on_both_drivers(driver_engine):
    error = translated(driver_engine, "INSERT INTO children VALUES (2)")
    assert isinstance(error, rl.errors.RelatedResourceMissing)
    assert error.code == "db.related_resource_missing"
    assert error.details == {"sqlstate": "23503", "constraint": "fk_children_parent"}


def test_lock_timeout_is_coded_alike_on_both_drivers(driver_engine):
    with driver_engine.connect() as holder:
        holder.execute(text("SELECT * FROM parents WHERE id = 1 FOR UPDATE"))
        error = translated(driver_engine, "SET lock_timeout = '50ms'", "SELECT * FROM parents WHERE id = 1 FOR UPDATE")
        holder.rollback()
    assert type(error) is rl.StoreError and not isinstance(error, rl.ConnectionFailed)
    assert error.details == {"sqlstate": "55P03"} and "lock wait timed out" in str(error)


def test_lost_connection_is_coded_alike_on_both_drivers(driver_engine):
    with driver_engine.connect() as victim, pytest.raises(sa.exc.DBAPIError) as caught:
        pid = victim.execute(text("SELECT pg_backend_pid()")).scalar_one()
        victim.rollback()
        terminate_backend(driver_engine, pid)
        victim.execute(text("SELECT 1"))
    error = translate(caught.value, driver_engine.url)
    assert isinstance(error, rl.ConnectionFailed) and error.code == "db.connection_failed"
