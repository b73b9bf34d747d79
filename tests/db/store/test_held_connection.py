"""A HeldConnection keeps one backend for many store transactions and replaces it when it breaks."""

from __future__ import annotations

import pytest
from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.core import errors
from runledger_sync.store.enqueue.enqueue import enqueue
from runledger_sync.store.claim.claim import claim_prestart_jobs_for_types
from runledger_sync.store.transactions import HeldConnection
from runledger_sync.store.attempt.running import heartbeat_job
from tests.support import JOB_TYPE, define, scalar


def on_held(held: HeldConnection, sql: str) -> object:
    """One read on the held connection, rolled back so it leaves no transaction open."""
    with held.connect() as connection:
        value = connection.execute(text(sql)).scalar_one()
        connection.rollback()
    return value


def backend_pid(held: HeldConnection) -> object:
    return on_held(held, "SELECT pg_backend_pid()")


def test_transactions_share_one_backend_and_commit_each(engine, held):
    before = backend_pid(held)
    for n in range(3):
        enqueue(held, JOB_TYPE, {"n": n})
    assert backend_pid(held) == before
    # Committed: another connection sees every job.
    assert scalar(engine, "SELECT count(*) FROM job_queue") == 3


def test_a_refused_write_rolls_back_and_keeps_the_connection(engine, held):
    job = enqueue(engine, JOB_TYPE, {})
    before = backend_pid(held)
    with pytest.raises(errors.LeaseOwnerMismatch):
        heartbeat_job(held, job_id=job.id, run_number=1, attempt=1, worker_id="nobody",
                                lease_ttl_seconds=5)
    assert backend_pid(held) == before


def test_a_killed_backend_is_replaced_and_the_transaction_retried(engine, held):
    victim = backend_pid(held)
    assert scalar(engine, "SELECT pg_terminate_backend(:pid)", pid=victim) is True
    job = enqueue(held, JOB_TYPE, {"after": "kill"})
    assert rl.get_job(engine, job.id) is not None
    assert backend_pid(held) != victim


def synchronous_commit(connection) -> str:
    return connection.execute(text("SHOW synchronous_commit")).scalar_one()


def test_a_prestart_claim_skips_the_disk_wait_only_for_its_own_transaction(engine, held):
    enqueue(engine, JOB_TYPE, {})
    claimed = claim_prestart_jobs_for_types(held, worker_id="w", lease_ttl_seconds=30, limit=1,
                                                      job_types=[JOB_TYPE])
    assert len(claimed) == 1
    # SET LOCAL: the next transaction on the same connection waits for the disk again.
    assert on_held(held, "SHOW synchronous_commit") == "on"


def test_a_prestart_claim_in_the_callers_transaction_leaves_its_setting_alone(engine):
    define(engine)
    enqueue(engine, JOB_TYPE, {})
    with engine.connect() as connection:
        claimed = claim_prestart_jobs_for_types(connection, worker_id="w", lease_ttl_seconds=30, limit=1,
                                                          job_types=[JOB_TYPE])
        assert len(claimed) == 1
        assert synchronous_commit(connection) == "on"
        connection.commit()
