"""One lease fence for every lease-guarded write, single or grouped (spec 3; spec 14, item 17).

Each write waits on the job's row lock held by another transaction. If that
transaction renewed the lease, the write must be judged on the renewed row and
land; if the lease ran out during the wait, the write must be refused and leave
the row LEASED. The unstarted release is the one write without a live-lease
test: handing back an unstarted claim is what the reaper does to an expired one.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest
from sqlalchemy import text

from runledger_sync.core import errors
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.types import JobFailure
from runledger_sync.store.enqueue.enqueue import enqueue
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success, release_unstarted_job_claim
from runledger_sync.store.attempt.running import mark_jobs_running
from runledger_sync.store.attempt.running import heartbeat_job, mark_job_running, update_job_progress
from tests.support import JOB_TYPE, claim_one, define, rows, scalar, wait_until, write_successes

#: Short enough to run out during the wait, long enough to be live when the write starts.
SHORT_LEASE_SECONDS = 0.4


def _single(call: Callable[[Any, LeaseIdentity], Any]) -> Callable[[Any, LeaseIdentity], Any]:
    def write(engine: Any, lease: LeaseIdentity) -> Any:
        try:
            return call(engine, lease)
        except errors.RunledgerError as error:
            return error

    return write


def _grouped(call: Callable[[Any, LeaseIdentity], list]) -> Callable[[Any, LeaseIdentity], Any]:
    def write(engine: Any, lease: LeaseIdentity) -> Any:
        [result] = call(engine, lease)
        return result

    return write


#: write name -> (the write, the row it leaves when it lands: status, stage, progress_done)
WRITES: dict[str, tuple[Callable[[Any, LeaseIdentity], Any], tuple[str, str, Any]]] = {
    "success": (_single(lambda e, lease: complete_job_success(e, **lease.keywords())),
                ("SUCCEEDED", "completed", None)),
    "failure": (_single(lambda e, lease: complete_job_failure(
        e, **lease.keywords(), failure=JobFailure.retryable("t.retry", "again"), retry_delay_ms=60_000)),
        ("PENDING", "queued", None)),
    "heartbeat": (_single(lambda e, lease: heartbeat_job(
        e, **lease.keywords(), lease_ttl_seconds=30, lock_timeout_ms=20_000)), ("LEASED", "queued", None)),
    "progress": (_single(lambda e, lease: update_job_progress(
        e, **lease.keywords(), progress_done=1, progress_total=4)), ("LEASED", "queued", 1)),
    "running": (_single(lambda e, lease: mark_job_running(e, lease)), ("LEASED", "running", None)),
    "release": (_single(lambda e, lease: release_unstarted_job_claim(
        e, **lease.keywords(), reason="TEST", delay_ms=0)), ("PENDING", "queued", None)),
    "group running": (_grouped(lambda e, lease: mark_jobs_running(e, [lease])),
                      ("LEASED", "running", None)),
    "group success": (_grouped(lambda e, lease: write_successes(e, [(lease, None)])),
                      ("SUCCEEDED", "completed", None)),
}


@pytest.fixture
def leased(engine) -> LeaseIdentity:
    define(engine, max_attempts=3)
    enqueue(engine, JOB_TYPE, {})
    return LeaseIdentity.of(claim_one(engine, lease_ttl_seconds=SHORT_LEASE_SECONDS))


def _write_behind(engine: Any, lease: LeaseIdentity, holder_sql: str, write: Callable, end_holder: str) -> Any:
    """Run ``write`` while another transaction (``holder_sql``) holds the row, until the lease has run out."""
    results: list[Any] = []
    with engine.connect() as holder:
        holder.execute(text(holder_sql), {"id": lease.job_id})
        writer = threading.Thread(target=lambda: results.append(write(engine, lease)))
        writer.start()
        # Signals, not sleeps: the writer is queued on the lock, and the lease it began with has run out.
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM pg_stat_activity "
                                          "WHERE datname = current_database() AND wait_event_type = 'Lock'") == 1)
        wait_until(lambda: _original_lease_over(engine, lease))
        getattr(holder, end_holder)()
        writer.join(20)
    assert not writer.is_alive() and len(results) == 1
    return results[0]


def _original_lease_over(engine: Any, lease: LeaseIdentity) -> bool:
    # The attempt row keeps when the claim began: lease start + the short TTL is the original expiry.
    return scalar(engine, "SELECT clock_timestamp() > leased_at + make_interval(secs => :ttl) FROM job_attempts "
                          "WHERE job_id = :id AND attempt = :attempt",
                  id=lease.job_id, attempt=lease.attempt, ttl=SHORT_LEASE_SECONDS)


def _row(engine: Any, lease: LeaseIdentity) -> tuple:
    return tuple(rows(engine, "SELECT status, stage, progress_done FROM job_queue WHERE id = :id", id=lease.job_id)[0])


@pytest.mark.parametrize("name", list(WRITES))
def test_a_write_waiting_on_the_row_lock_is_judged_on_the_lease_renewed_meanwhile(engine, leased, name):
    write, landed = WRITES[name]
    result = _write_behind(
        engine, leased,
        "UPDATE job_queue SET lease_expires_at = clock_timestamp() + interval '30 seconds' WHERE id = :id",
        write, "commit",
    )
    assert not isinstance(result, errors.RunledgerError), f"{name} was refused: {result!r}"
    assert _row(engine, leased) == landed


#: The writes that keep a job running need a live lease; an outcome (and the release) only a held one.
OUTCOMES = ("success", "failure", "group success")


@pytest.mark.parametrize("name", [name for name in WRITES if name != "release" and name not in OUTCOMES])
def test_a_write_waiting_on_the_row_lock_while_the_lease_runs_out_is_refused(engine, leased, name):
    write, _ = WRITES[name]
    before = rows(engine, "SELECT * FROM job_queue WHERE id = :id", id=leased.job_id)
    result = _write_behind(engine, leased, "SELECT 1 FROM job_queue WHERE id = :id FOR UPDATE", write, "rollback")
    assert isinstance(result, errors.LeaseOwnerMismatch), f"{name} gave {result!r}"
    assert result.code == "job.lease_owner_mismatch"
    assert rows(engine, "SELECT * FROM job_queue WHERE id = :id", id=leased.job_id) == before
    assert _row(engine, leased) == ("LEASED", "queued", None)


@pytest.mark.parametrize("name", OUTCOMES)
def test_an_outcome_waiting_on_the_row_lock_while_the_lease_runs_out_still_lands(engine, leased, name):
    write, landed = WRITES[name]
    result = _write_behind(engine, leased, "SELECT 1 FROM job_queue WHERE id = :id FOR UPDATE", write, "rollback")
    assert not isinstance(result, errors.RunledgerError), f"{name} was refused: {result!r}"
    assert _row(engine, leased) == landed


def test_an_unstarted_release_waiting_while_the_lease_runs_out_still_hands_the_claim_back(engine, leased):
    write, landed = WRITES["release"]
    result = _write_behind(engine, leased, "SELECT 1 FROM job_queue WHERE id = :id FOR UPDATE", write, "rollback")
    assert not isinstance(result, errors.RunledgerError), repr(result)
    assert _row(engine, leased) == landed
    assert scalar(engine, "SELECT attempt FROM job_queue WHERE id = :id", id=leased.job_id) == 0
