"""Every store write to job_queue and job_definitions moves updated_at: no trigger does it since revision 0003."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable

import pytest

from runledger_sync.core.records import JobDefinition, LeaseIdentity
from runledger_sync.core.types import JobCompletion, JobFailure
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success, release_unstarted_job_claim
from runledger_sync.store.attempt.running import mark_jobs_running
from runledger_sync.store.enqueue.enqueue import enqueue
from runledger_sync.store.definitions import set_job_definition_enabled, sync_job_definitions, upsert_job_definition
from runledger_sync.store.admin.actions import cancel_job, requeue_job
from runledger_sync.store.claim.claim import claim_jobs, claim_prestart_jobs_for_types
from runledger_sync.store.attempt.running import heartbeat_job, mark_job_running, update_job_progress
from runledger_sync.store.maintenance.reaper import reap_expired_leases
from tests.support import JOB_TYPE, define, expire_lease, rows, scalar, write_successes

LONG_AGO = datetime(2001, 1, 1, tzinfo=timezone.utc)


def backdate(engine: Any) -> None:
    with engine.begin() as connection:
        connection.exec_driver_sql("UPDATE job_queue SET updated_at = %(t)s", {"t": LONG_AGO})
        connection.exec_driver_sql("UPDATE job_definitions SET updated_at = %(t)s", {"t": LONG_AGO})


def leased(engine: Any, *, prestart: bool = True, max_attempts: int = 3) -> LeaseIdentity:
    define(engine, max_attempts=max_attempts)
    enqueue(engine, JOB_TYPE, {})
    claim = claim_prestart_jobs_for_types if prestart else claim_jobs
    [job] = claim(engine, worker_id="w", lease_ttl_seconds=30, limit=1, job_types=[JOB_TYPE])
    return LeaseIdentity.of(job)


def pending(engine: Any) -> None:
    define(engine)
    enqueue(engine, JOB_TYPE, {})


def fail(engine: Any, lease: LeaseIdentity, kind: Callable[..., JobFailure]) -> None:
    complete_job_failure(engine, **lease.keywords(), failure=kind("x.code", "failed"), retry_delay_ms=0)


#: name: (set the job up, the write whose updated_at is checked)
JOB_WRITES: dict[str, tuple[Callable[[Any], Any], Callable[[Any, Any], Any]]] = {
    "prestart claim": (pending, lambda e, _: claim_prestart_jobs_for_types(
        e, worker_id="w", lease_ttl_seconds=30, limit=1, job_types=[JOB_TYPE])),
    "direct claim": (pending, lambda e, _: claim_jobs(e, worker_id="w", lease_ttl_seconds=30, limit=1)),
    "mark running": (leased, lambda e, lease: mark_job_running(e, lease)),
    "grouped mark running": (leased, lambda e, lease: mark_jobs_running(e, [lease])),
    "progress": (leased, lambda e, lease: update_job_progress(e, **lease.keywords(), progress_done=1)),
    "heartbeat": (leased, lambda e, lease: heartbeat_job(e, **lease.keywords(), lease_ttl_seconds=30)),
    "success": (leased, lambda e, lease: complete_job_success(e, **lease.keywords())),
    "grouped success": (leased, lambda e, lease: write_successes(e, [(lease, JobCompletion())])),
    "retry": (leased, lambda e, lease: fail(e, lease, JobFailure.retryable)),
    "dead letter": (leased, lambda e, lease: fail(e, lease, JobFailure.terminal)),
    "unstarted release": (leased, lambda e, lease: release_unstarted_job_claim(
        e, **lease.keywords(), reason="test", delay_ms=0)),
    "reaper release": (leased, lambda e, lease: (expire_lease(e, lease.job_id), backdate(e),
                                                 reap_expired_leases(e, limit=10, default_retry_delay_ms=1000))),
    "reaper retry": (lambda e: leased(e, prestart=False), lambda e, lease: (
        expire_lease(e, lease.job_id), backdate(e), reap_expired_leases(e, limit=10, default_retry_delay_ms=1000))),
    "cancel": (pending, lambda e, _: cancel_job(e, scalar(e, "SELECT id FROM job_queue"))),
    "requeue": (lambda e: (pending(e), cancel_job(e, scalar(e, "SELECT id FROM job_queue"))),
                lambda e, _: requeue_job(e, scalar(e, "SELECT id FROM job_queue"))),
}


@pytest.mark.parametrize("name", list(JOB_WRITES))
def test_every_write_to_a_job_moves_its_updated_at(engine, name):
    setup, write = JOB_WRITES[name]
    state = setup(engine)
    backdate(engine)
    before = scalar(engine, "SELECT status FROM job_queue")

    write(engine, state)

    [row] = rows(engine, "SELECT status, updated_at, now() AS now FROM job_queue")
    assert LONG_AGO < row.updated_at <= row.now
    # The write happened: a refused one would leave updated_at alone and prove nothing.
    assert row.status != before or name in ("mark running", "grouped mark running", "progress", "heartbeat")


@pytest.mark.parametrize(
    "write",
    [
        lambda e: set_job_definition_enabled(e, JOB_TYPE, False),
        lambda e: upsert_job_definition(e, JobDefinition(JOB_TYPE, max_attempts=9)),
    ],
    ids=["enable or disable", "upsert"],
)
def test_every_write_to_a_definition_moves_its_updated_at(engine, write):
    define(engine)
    backdate(engine)

    write(engine)

    assert scalar(engine, "SELECT updated_at > :t FROM job_definitions", t=LONG_AGO) is True


def test_inserting_a_missing_definition_keeps_an_existing_ones_updated_at(engine):
    # sync_definitions(overwrite=False) is an insert that skips existing rows: nothing to stamp.
    define(engine)
    backdate(engine)

    sync_job_definitions(engine, [JobDefinition(JOB_TYPE, max_attempts=9)], overwrite=False)

    assert scalar(engine, "SELECT updated_at = :t FROM job_definitions", t=LONG_AGO) is True
