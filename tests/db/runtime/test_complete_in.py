"""``ctx.complete_in(conn)``: a handler writes its success in the transaction of its own effects.

The effect row (``side_effects``) and the job's SUCCEEDED commit together or
not at all; when the handler's transaction does not commit, the worker falls
back to writing the handler's outcome as usual.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import psycopg2
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from runledger_sync.core import errors
from runledger_sync.core.types import JobCompletion, JobContext, JobFailure
from runledger_sync.runtime.attempt.run import process_claimed_job
from runledger_sync.store.enqueue.enqueue import enqueue
from runledger_sync.store.driver import driver_for
from tests import handlers as h
from tests.handlers import MAX_BLOCK_SECONDS, fast_config
from tests.support import JOB_TYPE, claim_one, event_types, expire_lease, lock_waiters, rows, scalar, wait_until

INSERT_EFFECT = "INSERT INTO side_effects VALUES (:j, :a, 'effect')"


def psycopg2_connect(url: str) -> Any:
    parsed = make_url(url)
    options: dict[str, Any] = {"dbname": parsed.database, "user": parsed.username}
    host, port = parsed.host or parsed.query.get("host"), parsed.port or parsed.query.get("port")
    extra = {"host": host, "port": port, "password": parsed.password}
    options.update({key: value for key, value in extra.items() if value})
    return psycopg2.connect(**options)


@contextmanager
def sa_connection(engine: Any, url: str) -> Iterator[tuple[Any, Callable[[JobContext], None]]]:
    with engine.begin() as conn:
        yield conn, lambda ctx: conn.execute(text(INSERT_EFFECT), {"j": ctx.job_id, "a": ctx.attempt})


@contextmanager
def orm_session(engine: Any, url: str) -> Iterator[tuple[Any, Callable[[JobContext], None]]]:
    with Session(bind=engine) as session, session.begin():
        yield session, lambda ctx: session.execute(text(INSERT_EFFECT), {"j": ctx.job_id, "a": ctx.attempt})


@contextmanager
def raw_psycopg2(engine: Any, url: str) -> Iterator[tuple[Any, Callable[[JobContext], None]]]:
    raw = psycopg2_connect(url)
    try:
        def write(ctx: JobContext) -> None:
            with raw.cursor() as cursor:
                cursor.execute("INSERT INTO side_effects VALUES (%s, %s, 'effect')", (str(ctx.job_id), ctx.attempt))

        # psycopg2's own context manager: commit on success, roll back on an exception.
        with raw:
            yield raw, write
    finally:
        raw.close()


TRANSACTIONS = {"connection": sa_connection, "session": orm_session, "psycopg2": raw_psycopg2}


@pytest.fixture
def effects_table(engine):
    with engine.begin() as conn:
        conn.execute(text(h.SIDE_EFFECTS_DDL))
    return engine


def run_one(engine, handler, config=None, **options):
    config = config or fast_config()
    registry = h.registry_with(JOB_TYPE, handler, **options)
    registry.sync_definitions(engine)
    enqueue(engine, JOB_TYPE, {"n": 1})
    job = claim_one(engine, worker_id=config.worker_id, lease_ttl_seconds=config.lease_ttl_seconds)
    process_claimed_job(driver_for(engine), registry, job, config)
    return job


def job_row(engine, job_id):
    return rows(engine, "SELECT * FROM job_queue WHERE id = :id", id=job_id)[0]


def effect_count(engine):
    return scalar(engine, "SELECT count(*) FROM side_effects")


def messages(caplog):
    return [record.getMessage() for record in caplog.records]


@pytest.mark.parametrize("kind", sorted(TRANSACTIONS))
def test_effect_and_success_commit_together_and_the_worker_writes_nothing_more(
        effects_table, fresh_database, probe, logs, kind):
    engine = effects_table

    def body(ctx, payload, call):
        with TRANSACTIONS[kind](engine, fresh_database) as (bind, write_effect):
            write_effect(ctx)
            record = ctx.complete_in(bind, JobCompletion(output={"invoice": 7}).with_progress(1, 1))
            probe.note(record.status.value)
        return JobCompletion(output={"ignored": True})

    job = run_one(engine, h.scripted(probe, body))

    row = job_row(engine, job.id)
    assert (row.status, row.output, row.progress_done) == ("SUCCEEDED", {"invoice": 7}, 1)
    assert effect_count(engine) == 1
    assert probe.notes == ["SUCCEEDED"]
    assert event_types(engine, job.id) == ["SUCCEEDED"]  # the transitions list: the worker writes nothing more
    assert "job success committed in the handler's transaction" in messages(logs)
    assert "failed to mark job success" not in messages(logs)


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (JobFailure.retryable("test.later", "try again"), "PENDING", "RETRYABLE"),
        (RuntimeError("boom after complete_in"), "PENDING", "RETRYABLE"),  # a plain exception spends an attempt
    ],
)
def test_handler_raising_after_complete_in_rolls_back_effect_and_success(
        effects_table, fresh_database, probe, logs, error, status, kind):
    engine = effects_table

    def body(ctx, payload, call):
        with sa_connection(engine, fresh_database) as (conn, write_effect):
            write_effect(ctx)
            ctx.complete_in(conn)
            raise error

    job = run_one(engine, h.scripted(probe, body))

    row = job_row(engine, job.id)
    assert (row.status, row.status_reason) == (status, kind)
    assert effect_count(engine) == 0
    assert "SUCCEEDED" not in event_types(engine, job.id)
    assert ("handler completed the job in its own transaction but did not commit it; writing its outcome"
            in messages(logs))


def test_complete_in_rolled_back_then_returned_falls_back_to_the_normal_success_write(effects_table, probe, logs):
    engine = effects_table

    def body(ctx, payload, call):
        with engine.connect() as conn:
            conn.begin()
            conn.execute(text(INSERT_EFFECT), {"j": ctx.job_id, "a": ctx.attempt})
            ctx.complete_in(conn, JobCompletion(output={"from": "complete_in"}))
            conn.rollback()
        return JobCompletion(output={"from": "return"})

    job = run_one(engine, h.scripted(probe, body))

    row = job_row(engine, job.id)
    assert (row.status, row.output) == ("SUCCEEDED", {"from": "return"})
    assert effect_count(engine) == 0
    assert event_types(engine, job.id).count("SUCCEEDED") == 1


@pytest.mark.parametrize(
    "config",
    [
        # The heartbeat notices the expired lease first, so complete_in refuses without writing.
        fast_config(),
        # No heartbeat runs before complete_in, so the store's lease fence refuses it: the
        # job was handed on (an expired lease alone does not stop an outcome).
        fast_config(lease_ttl_seconds=30, heartbeat_interval_seconds=20),
    ],
    ids=["heartbeat-noticed", "fence"],
)
def test_lease_lost_before_complete_in_raises_mismatch_and_the_effect_is_not_committed(
        effects_table, fresh_database, probe, logs, config):
    engine = effects_table
    lease_expired = threading.Event()

    def body(ctx, payload, call):
        probe.note("started")
        assert lease_expired.wait(MAX_BLOCK_SECONDS)
        if config.heartbeat_interval < 1:
            ctx.wait_cancelled(MAX_BLOCK_SECONDS)
        with sa_connection(engine, fresh_database) as (conn, write_effect):
            write_effect(ctx)
            try:
                ctx.complete_in(conn)
            except errors.LeaseOwnerMismatch as mismatch:
                probe.note(mismatch.code)
                raise

    registry = h.registry_with(JOB_TYPE, h.scripted(probe, body))
    registry.sync_definitions(engine)
    job = enqueue(engine, JOB_TYPE, {"n": 1})
    claimed = claim_one(engine, worker_id=config.worker_id, lease_ttl_seconds=config.lease_ttl_seconds)
    worker = threading.Thread(target=process_claimed_job, args=(driver_for(engine), registry, claimed, config), daemon=True)
    worker.start()
    with probe.lock:
        assert probe.lock.wait_for(lambda: "started" in probe.notes, 10)
    expire_lease(engine, job.id)
    if config.heartbeat_interval >= 1:
        with engine.begin() as connection:
            connection.execute(text("UPDATE job_queue SET worker_id = 'another-worker' WHERE id = :id"),
                               {"id": job.id})
    lease_expired.set()
    worker.join(15)

    assert not worker.is_alive()
    assert probe.notes == ["started", "job.lease_owner_mismatch"]
    assert effect_count(engine) == 0
    # Nothing was written under the lost lease: the reaper recovers the job.
    assert job_row(engine, job.id).status == "LEASED"
    assert "SUCCEEDED" not in event_types(engine, job.id)


def test_complete_in_after_the_deadline_is_refused_as_a_timeout(effects_table, fresh_database, probe, logs):
    engine = effects_table

    def body(ctx, payload, call):
        ctx.wait_cancelled(MAX_BLOCK_SECONDS)
        with sa_connection(engine, fresh_database) as (conn, write_effect):
            write_effect(ctx)
            ctx.complete_in(conn)

    job = run_one(engine, h.scripted(probe, body), timeout_seconds=1)

    row = job_row(engine, job.id)
    assert (row.status, row.status_reason, row.last_error_code) == ("PENDING", "TIMEOUT", "job.timeout_exceeded")
    assert effect_count(engine) == 0


def test_heartbeats_blocked_by_the_handler_transaction_do_not_end_the_attempt(
        effects_table, fresh_database, probe, logs):
    engine = effects_table
    config = fast_config(heartbeat_interval_seconds=0.2)

    def body(ctx, payload, call):
        with sa_connection(engine, fresh_database) as (conn, write_effect):
            write_effect(ctx)
            ctx.complete_in(conn)
            # Hold the row lock until a heartbeat waits on it, then keep running after the commit.
            probe.note(wait_until(lambda: lock_waiters(engine), timeout=MAX_BLOCK_SECONDS,
                                  what="a heartbeat waiting on the handler's lock"))
        time.sleep(0.5)  # the handler's own work after its commit, while the heartbeat is answered

    job = run_one(engine, h.scripted(probe, body), config=config)

    assert probe.notes and probe.notes[0] >= 1
    assert job_row(engine, job.id).status == "SUCCEEDED"
    assert effect_count(engine) == 1
    logged = messages(logs)
    assert "job heartbeat lost lease ownership" not in logged
    assert "handler finished after its attempt was already decided; result discarded" not in logged


def test_complete_in_outside_a_worker_is_refused():
    ctx = JobContext(job_id=None, run_number=1, attempt=1, organization_id=None, worker_id="w")
    with pytest.raises(RuntimeError, match="only available inside a worker"):
        ctx.complete_in(object())
