"""Enqueue inside the caller's transaction: SQLAlchemy Connection, ORM Session, raw psycopg2 or psycopg 3.

For each of the five kinds of caller (``CALLER_KINDS``) a job written together
with the caller's own row (``orders``) commits or rolls back with it, and
nothing the store does ends the caller's transaction. The raw connections are
what Django hands in as ``connection.connection`` (psycopg2, or psycopg 3 on
Django 4.2+) and what plain psycopg apps hold; the tests of what only a raw
connection has (its loaders, autocommit, search path, closing) run for both
drivers (``RAW_DRIVERS``). The driver-independent error codes are checked for
both drivers side by side at the end.
"""

from __future__ import annotations

import datetime
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import psycopg
import psycopg2
import psycopg2.extensions
import psycopg2.extras
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, scoped_session, sessionmaker

import runledger_sync as rl
from runledger_sync.core.records import JobSpec, LeaseIdentity
from runledger_sync.core.states import JobStatus
from runledger_sync.store.admin.jobs import get_job
from runledger_sync.store.attempt.ends import complete_job_success
from runledger_sync.store.attempt.running import mark_job_running
from tests.handlers import fast_config
from tests.support import JOB_TYPE, claim_one, define, identity, run_worker_until, scalar, terminate_backend

# Submodules that `import psycopg` loads itself.
Format, TransactionStatus = psycopg.pq.Format, psycopg.pq.TransactionStatus
dict_row = psycopg.rows.dict_row
TextLoader = psycopg.types.string.TextLoader


def _connect_options(url: str) -> dict[str, Any]:
    parsed = make_url(url)
    options: dict[str, Any] = {"dbname": parsed.database, "user": parsed.username}
    host = parsed.host or parsed.query.get("host")
    port = parsed.port or parsed.query.get("port")
    if host:
        options["host"] = host
    if port:
        options["port"] = int(port)
    if parsed.password:
        options["password"] = parsed.password
    return options


def psycopg2_connect(url: str) -> psycopg2.extensions.connection:
    """Open a plain psycopg2 connection to the database a SQLAlchemy URL names."""
    return psycopg2.connect(**_connect_options(url))


def psycopg_connect(url: str, **options: Any) -> psycopg.Connection[Any]:
    """Open a plain psycopg 3 connection to the database a SQLAlchemy URL names."""
    return psycopg.connect(**_connect_options(url), **options)


class NaiveTimestampLoader(psycopg.adapt.Loader):
    """What Django with USE_TZ = False loads timestamptz as: a naive datetime."""

    def load(self, data: Any) -> datetime.datetime:
        return datetime.datetime.fromisoformat(bytes(data).decode()[:19])


# --- the five kinds of caller ---------------------------------------------------


class CallerTransaction:
    """One of the app-side transaction shapes, driven the same way by every test."""

    def __init__(self, bind: Any, write: Callable[[str], None], commit: Callable[[], None],
                 rollback: Callable[[], None], in_transaction: Callable[[], bool]) -> None:
        self.bind = bind
        self.write_own_row = write
        self.commit = commit
        self.rollback = rollback
        #: The caller's transaction is still open (not committed, not rolled back, not closed).
        self.in_transaction = in_transaction


@contextmanager
def sa_connection(engine: Any, url: str) -> Iterator[CallerTransaction]:
    with engine.connect() as conn:
        conn.begin()
        yield CallerTransaction(
            conn, lambda ref: conn.execute(text("INSERT INTO orders (ref) VALUES (:r)"), {"r": ref}),
            conn.commit, conn.rollback, conn.in_transaction,
        )


@contextmanager
def orm_session(engine: Any, url: str) -> Iterator[CallerTransaction]:
    with Session(bind=engine) as session:
        yield CallerTransaction(
            session, lambda ref: session.execute(text("INSERT INTO orders (ref) VALUES (:r)"), {"r": ref}),
            session.commit, session.rollback, session.in_transaction,
        )


@contextmanager
def flask_style_scoped_session(engine: Any, url: str) -> Iterator[CallerTransaction]:
    scoped = scoped_session(sessionmaker(bind=engine))
    try:
        yield CallerTransaction(
            scoped, lambda ref: scoped.execute(text("INSERT INTO orders (ref) VALUES (:r)"), {"r": ref}),
            scoped.commit, scoped.rollback, lambda: scoped().in_transaction(),
        )
    finally:
        scoped.remove()


def _raw_caller(raw: Any, status: Callable[[Any], int]) -> CallerTransaction:
    def write(ref: str) -> None:
        with raw.cursor() as cursor:
            cursor.execute("INSERT INTO orders (ref) VALUES (%s)", (ref,))

    return CallerTransaction(raw, write, raw.commit, raw.rollback,
                             lambda: not raw.closed and status(raw) != TransactionStatus.IDLE)


@contextmanager
def raw_psycopg2(engine: Any, url: str) -> Iterator[CallerTransaction]:
    raw = psycopg2_connect(url)
    try:
        yield _raw_caller(raw, PSYCOPG2.status)
    finally:
        raw.close()


@contextmanager
def raw_psycopg(engine: Any, url: str) -> Iterator[CallerTransaction]:
    raw = psycopg_connect(url)
    try:
        yield _raw_caller(raw, PSYCOPG.status)
    finally:
        raw.close()


CALLER_KINDS = {
    "connection": sa_connection,
    "session": orm_session,
    "scoped_session": flask_style_scoped_session,
    "psycopg2": raw_psycopg2,
    "psycopg": raw_psycopg,
}


# --- the two raw drivers --------------------------------------------------------


@dataclass(frozen=True)
class RawDriver:
    """What differs between psycopg2 and psycopg 3 in the raw-connection tests."""

    name: str
    connect: Callable[..., Any]
    #: The libpq transaction status (both drivers number it as ``psycopg.pq.TransactionStatus``).
    status: Callable[[Any], int]
    #: Make ``raw`` return dict rows by default, as some apps configure it.
    use_dict_rows: Callable[[Any], None]
    #: How the refusal of a closed connection names it.
    closed_name: str

    def __str__(self) -> str:
        return self.name


def _psycopg2_dict_rows(raw: Any) -> None:
    raw.cursor_factory = psycopg2.extras.RealDictCursor


def _psycopg_dict_rows(raw: Any) -> None:
    raw.row_factory = dict_row


PSYCOPG2 = RawDriver("psycopg2", psycopg2_connect, lambda raw: raw.get_transaction_status(), _psycopg2_dict_rows,
                     "closed psycopg2 connection")
PSYCOPG = RawDriver("psycopg", psycopg_connect, lambda raw: raw.info.transaction_status, _psycopg_dict_rows,
                    "closed psycopg connection")
RAW_DRIVERS = [PSYCOPG2, PSYCOPG]


@pytest.fixture
def orders(engine) -> Any:
    define(engine)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE orders (id serial PRIMARY KEY, ref text NOT NULL)"))
    return engine


@pytest.fixture(params=sorted(CALLER_KINDS))
def caller(request, orders, fresh_database) -> Iterator[CallerTransaction]:
    with CALLER_KINDS[request.param](orders, fresh_database) as transaction:
        yield transaction


@pytest.fixture(params=RAW_DRIVERS, ids=str)
def driver(request) -> RawDriver:
    return request.param


@pytest.fixture
def raw(driver, orders, fresh_database) -> Iterator[Any]:
    """A raw connection of ``driver``, closed after the test."""
    connection = driver.connect(fresh_database)
    try:
        yield connection
    finally:
        connection.close()


def write_own_row(connection: Any, ref: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO orders (ref) VALUES (%s)", (ref,))


def order_count(engine: Any) -> int:
    return scalar(engine, "SELECT count(*) FROM orders")


# --- every kind of caller -------------------------------------------------------


def test_committed_enqueue_exists_only_after_the_caller_commits_and_then_runs(caller, engine):
    caller.write_own_row("order-1")
    job = rl.enqueue(caller.bind, JOB_TYPE, {"order": "order-1"})

    assert job.status is JobStatus.PENDING and job.payload == {"order": "order-1"}
    assert job.created_at.tzinfo is not None
    # Another connection cannot see it yet: the insert joined the open transaction.
    assert rl.get_job(engine, job.id) is None
    assert order_count(engine) == 0
    caller.commit()

    assert rl.get_job(engine, job.id).status is JobStatus.PENDING
    assert order_count(engine) == 1
    claimed = claim_one(engine)
    assert claimed.id == job.id
    mark_job_running(engine, LeaseIdentity.of(claimed))
    done = complete_job_success(engine, **identity(claimed))
    assert done.status is JobStatus.SUCCEEDED


def test_rolled_back_enqueue_leaves_no_job_no_event_and_no_own_row(caller, engine):
    caller.write_own_row("order-1")
    job = rl.enqueue(caller.bind, JOB_TYPE, {"order": "order-1"})
    caller.rollback()

    assert rl.get_job(engine, job.id) is None
    assert scalar(engine, "SELECT count(*) FROM job_queue") == 0
    assert scalar(engine, "SELECT count(*) FROM job_events") == 0
    assert order_count(engine) == 0


def test_enqueue_many_and_reads_join_the_same_open_transaction(caller, engine):
    caller.write_own_row("order-1")
    jobs = rl.enqueue_many(caller.bind, [JobSpec(JOB_TYPE, {"n": 1}), JobSpec(JOB_TYPE, {"n": 2})])
    # Reads through the same bind see the uncommitted jobs and their events.
    assert rl.get_job(caller.bind, jobs[0].id).payload == {"n": 1}
    assert [event.event_type for event in rl.list_events(caller.bind, jobs[1].id)] == [rl.JobEventType.ENQUEUED]
    assert rl.count_jobs(caller.bind) == 2
    caller.commit()

    assert rl.count_jobs(engine) == 2
    assert order_count(engine) == 1
    claimed = claim_one(engine)
    mark_job_running(engine, LeaseIdentity.of(claimed))
    assert complete_job_success(engine, **identity(claimed)).status is JobStatus.SUCCEEDED


def test_idempotent_enqueue_in_the_caller_transaction_returns_the_same_job(caller, engine):
    first = rl.enqueue(caller.bind, JOB_TYPE, {"n": 1}, idempotency_key="k-1")
    again = rl.enqueue(caller.bind, JOB_TYPE, {"n": 1}, idempotency_key="k-1")
    caller.commit()

    assert again.id == first.id
    assert rl.count_jobs(engine) == 1


def test_idempotency_conflict_raises_the_coded_error_and_leaves_the_rollback_to_the_caller(caller, engine):
    first = rl.enqueue(caller.bind, JOB_TYPE, {"n": 1}, idempotency_key="k-1")
    assert rl.enqueue(caller.bind, JOB_TYPE, {"n": 1}, idempotency_key="k-1").id == first.id
    with pytest.raises(rl.IdempotencyConflict):
        rl.enqueue(caller.bind, JOB_TYPE, {"n": 2}, idempotency_key="k-1")
    assert caller.in_transaction()
    caller.rollback()

    assert rl.count_jobs(engine) == 0


def test_rejected_enqueue_raises_the_coded_error_and_leaves_the_rollback_to_the_caller(caller, engine):
    caller.write_own_row("order-1")
    with pytest.raises(rl.DefinitionNotFoundOrDisabled):
        rl.enqueue(caller.bind, "no.such.type", {})
    assert caller.in_transaction()
    caller.rollback()

    assert order_count(engine) == 0
    assert rl.count_jobs(engine) == 0


# --- a raw connection of either driver -----------------------------------------


def test_committed_raw_enqueue_is_run_by_the_worker_loop(driver, orders, fresh_database):
    ran = threading.Event()
    registry = rl.JobRegistry()

    @registry.job(JOB_TYPE)
    def handle(ctx, payload):
        ran.set()

    raw = driver.connect(fresh_database)
    try:
        write_own_row(raw, "order-1")
        job = rl.enqueue(raw, JOB_TYPE, {"order": "order-1"})
        raw.commit()
    finally:
        raw.close()

    run_worker_until(orders, registry, fast_config(), lambda: rl.get_job(orders, job.id).status is JobStatus.SUCCEEDED)
    assert ran.is_set()


def test_an_idle_connection_is_left_in_the_transaction_the_enqueue_began(driver, raw, orders):
    # The first statement on an idle connection begins a transaction (the
    # driver's own rule); nothing of ours commits or rolls it back.
    assert driver.status(raw) == TransactionStatus.IDLE
    job = rl.enqueue(raw, JOB_TYPE, {"n": 1})
    assert driver.status(raw) == TransactionStatus.INTRANS
    assert rl.get_job(orders, job.id) is None
    raw.commit()
    assert rl.get_job(orders, job.id) is not None


def test_dict_rows_by_default_still_work(driver, raw, orders):
    driver.use_dict_rows(raw)
    job = rl.enqueue(raw, JOB_TYPE, {"n": 1})
    assert rl.get_job(raw, job.id).payload == {"n": 1}
    assert rl.count_jobs(raw) == 1
    raw.commit()
    assert rl.get_job(orders, job.id).payload == {"n": 1}


def test_a_closed_connection_is_refused_with_invalid_argument(driver, raw):
    raw.close()
    with pytest.raises(rl.InvalidArgument, match=driver.closed_name):
        rl.enqueue(raw, JOB_TYPE, {})


def test_autocommit_connection_commits_each_statement_as_it_is(driver, raw, orders):
    raw.autocommit = True  # the same attribute on both drivers
    job = rl.enqueue(raw, JOB_TYPE, {"n": 1})
    # Visible at once to other connections: the caller chose autocommit.
    assert rl.get_job(orders, job.id) is not None
    assert raw.autocommit is True
    assert driver.status(raw) == TransactionStatus.IDLE


def test_its_own_search_path_is_used_and_errors_are_coded(driver, raw, orders):
    with orders.begin() as conn:
        conn.execute(text("CREATE SCHEMA elsewhere"))
    with raw.cursor() as cursor:
        cursor.execute("SET search_path TO elsewhere")
    # The connection's own search path finds no job tables there, and nothing here
    # overrides it: the coded answer says to migrate.
    with pytest.raises(rl.SchemaMismatch, match=r'db\.schema_mismatch: .*\(relation "job_queue" does not exist\)'):
        rl.enqueue(raw, JOB_TYPE, {"n": 1})
    assert driver.status(raw) == TransactionStatus.INERROR
    raw.rollback()
    with raw.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def test_a_lost_connection_raises_connection_failed(raw, orders):
    with raw.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    raw.rollback()
    terminate_backend(orders, pid)
    with pytest.raises(rl.ConnectionFailed):
        rl.enqueue(raw, JOB_TYPE, {"n": 1})


# --- what one driver's raw connection alone has ---------------------------------


def test_raw_psycopg2_connection_is_left_open_in_its_transaction_and_unchanged(orders, fresh_database):
    raw = psycopg2_connect(fresh_database)
    try:
        # What Django does to its connections: jsonb comes back as text.
        psycopg2.extras.register_default_jsonb(conn_or_curs=raw, loads=lambda value: value)
        with raw.cursor() as cursor:
            cursor.execute("SET LOCAL application_name = 'caller-txn'")
            # Another library (Django's backend) may have registered psycopg2's UUID
            # adapter process-wide; what matters is that enqueue changes nothing.
            cursor.execute("SELECT gen_random_uuid()")
            uuid_type_before = type(cursor.fetchone()[0])

        job = rl.enqueue(raw, JOB_TYPE, {"n": 1})

        # Our statements decode JSON and UUIDs for themselves...
        assert job.payload == {"n": 1}
        assert rl.get_job(raw, job.id).id == job.id
        # ...without changing how the caller's connection decodes them.
        with raw.cursor() as cursor:
            cursor.execute("SELECT payload, id FROM job_queue WHERE id = %s", (str(job.id),))
            payload, job_id = cursor.fetchone()
            assert payload == '{"n": 1}' and type(job_id) is uuid_type_before
            # The transaction is still the caller's: its SET LOCAL is still in force.
            cursor.execute("SHOW application_name")
            assert cursor.fetchone()[0] == "caller-txn"
        assert not raw.closed
        assert raw.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_INTRANS
        raw.rollback()
    finally:
        raw.close()
    assert rl.count_jobs(orders) == 0


def test_raw_psycopg_connection_is_left_open_in_its_transaction_with_its_settings_and_loaders(orders, fresh_database):
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


def test_a_transaction_block_on_an_autocommit_psycopg_connection_is_joined(orders, fresh_database):
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


# --- other binds ----------------------------------------------------------------


def test_lifecycle_calls_accept_a_session(orders):
    job = rl.enqueue(orders, JOB_TYPE, {})
    claimed = claim_one(orders)
    with Session(bind=orders) as session:
        mark_job_running(session, LeaseIdentity.of(claimed))
        complete_job_success(session, **identity(claimed))
        # Not committed yet: the worker's view is unchanged.
        assert get_job(orders, job.id).status is JobStatus.LEASED
        session.commit()
    assert get_job(orders, job.id).status is JobStatus.SUCCEEDED


def test_a_bind_of_another_kind_is_refused_with_invalid_argument(orders):
    with pytest.raises(rl.InvalidArgument, match="bind must be an Engine, a Connection, an ORM Session"):
        rl.enqueue("postgresql://app@localhost/app", JOB_TYPE, {})


def test_a_session_that_cannot_connect_raises_connection_failed(tmp_path):
    unreachable = rl.create_engine(f"postgresql://app@/app?host={tmp_path}")
    try:
        with Session(bind=unreachable) as session, pytest.raises(rl.ConnectionFailed):
            rl.enqueue(session, JOB_TYPE, {})
    finally:
        unreachable.dispose()

