"""The failure writes keep an attempt's exception type and traceback on its row, in the same statement."""

from __future__ import annotations

from runledger_sync.core.evidence import MAX_TRACEBACK_CHARS, FailureEvidence
from runledger_sync.core.outcomes import DeadLetter, Retry
from runledger_sync.core.records import JobSpec, LeaseIdentity
from runledger_sync.core.types import JobDeadLetterInfo, JobDeadLetterReason, JobFailure
from runledger_sync.store.admin.jobs import get_dead_letter, list_attempts
from runledger_sync.store.admin.dead_letters import list_dead_letters
from runledger_sync.store.attempt.ends import complete_job_failure
from runledger_sync.store.maintenance.reaper import reap_expired_leases
from runledger_sync.store.enqueue.enqueue import enqueue_many
from runledger_sync.store.claim.claim import claim_prestart_jobs_for_types
from runledger_sync.store.attempt.outcomes import apply_transitions
from runledger_sync.store.attempt.running import mark_job_running
from tests.support import JOB_TYPE, define, expire_lease

TRACEBACK = "Traceback (most recent call last):\n  File \"app.py\", line 3, in lookup\nKeyError: 'missing_field'\n"


def claim(engine, count, max_attempts=3):
    define(engine, max_attempts=max_attempts)
    enqueue_many(engine, [JobSpec(JOB_TYPE, {"n": n}) for n in range(count)])
    jobs = claim_prestart_jobs_for_types(engine, worker_id="worker-a", lease_ttl_seconds=30, limit=count,
                                         job_types=[JOB_TYPE])
    assert len(jobs) == count
    return [LeaseIdentity.of(job) for job in jobs]


def evidence(engine, job_id):
    return [(a.error_type, a.traceback) for a in list_attempts(engine, job_id)]


def test_the_group_write_keeps_each_transitions_evidence_on_its_attempt_row(engine):
    leases = claim(engine, 3)
    failure = JobFailure.retryable("test.failed", "failed")
    declined = FailureEvidence("myapp.billing.Declined", TRACEBACK)
    dead = DeadLetter(failure, JobDeadLetterInfo(failure=failure, reason=JobDeadLetterReason.ATTEMPTS_EXHAUSTED,
                                                 max_attempts=3), FailureEvidence("KeyError", TRACEBACK))

    assert apply_transitions(engine, [
        (leases[0], Retry(failure, 1_000, declined)), (leases[1], dead), (leases[2], Retry(failure, 0)),
    ]) == [None] * 3

    assert evidence(engine, leases[0].job_id) == [("myapp.billing.Declined", TRACEBACK)]
    assert evidence(engine, leases[1].job_id) == [("KeyError", TRACEBACK)]
    assert evidence(engine, leases[2].job_id) == [(None, None)]  # no exception behind it: nothing to keep
    letter = get_dead_letter(engine, leases[1].job_id)
    assert (letter.error_type, letter.traceback) == ("KeyError", TRACEBACK)
    assert [(d.job_id, d.error_type) for d in list_dead_letters(engine)] == [(leases[1].job_id, "KeyError")]


def test_the_single_write_keeps_the_evidence_cut_to_the_cap_and_storable(engine):
    [lease] = claim(engine, 1)
    huge = "Traceback (most recent call last):\n" + "  File \"a.py\", line 1, in f\x00\n" * 2_000 + "KeyError: 'x'\n"

    complete_job_failure(engine, **lease.keywords(), failure=JobFailure.terminal("test.failed", "failed"),
                                   retry_delay_ms=None, error_type="KeyError", traceback=huge)

    [(error_type, kept)] = evidence(engine, lease.job_id)
    assert error_type == "KeyError"
    assert len(kept) <= MAX_TRACEBACK_CHARS and "characters cut ...]" in kept and "\x00" not in kept
    assert kept.startswith("Traceback (most recent call last):\n") and kept.endswith("KeyError: 'x'\n")


def test_an_attempt_the_reaper_ends_has_no_evidence(engine):
    [lease] = claim(engine, 1, max_attempts=1)
    mark_job_running(engine, lease)
    expire_lease(engine, lease.job_id)

    assert len(reap_expired_leases(engine, limit=10, default_retry_delay_ms=1).dead_lettered) == 1

    [attempt] = list_attempts(engine, lease.job_id)
    assert (attempt.outcome, attempt.error_type, attempt.traceback) == ("LEASE_EXPIRED", None, None)
    assert get_dead_letter(engine, lease.job_id).error_type is None
