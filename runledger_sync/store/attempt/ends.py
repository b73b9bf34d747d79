"""The fenced writes that end one lease's attempt, each on its own: success, failure, unstarted release.

Every one goes through the lease fence of :mod:`runledger_sync.store.attempt.fence`:
the row is locked first, then written by one statement that judges the lease
as the last committer left it and writes the attempt and event rows the step
implies. The worker writes its decided outcomes in groups
(:func:`runledger_sync.store.attempt.outcomes.apply_transitions`); the single
success and failure here serve tools and tests that lease jobs by hand, and the
worker hands back a claim that never started with :func:`release_unstarted_job_claim`.
"""

from __future__ import annotations

from typing import Any, Optional
from uuid import UUID

from sqlalchemy import BigInteger, Text, bindparam, cast, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.errors import (
    InvalidArgument,
    InvalidCompletionProgress,
    InvalidProgress,
    LeaseOwnerMismatch,
    UnstartedClaimReleaseNotApplicable,
)
from runledger_sync.core.evidence import FailureEvidence
from runledger_sync.core.outcomes import EarlierAttempts, dead_letter_reason
from runledger_sync.core.records import JobRecord, LeaseIdentity
from runledger_sync.core.types import JobCompletion, JobFailure
from runledger_sync.core.states import JobStatus
from runledger_sync.db.schema import job_queue
from runledger_sync.store.binds import Bind
from runledger_sync.store.sealing import sealed
from runledger_sync.store.transactions import run_in_transaction
from runledger_sync.store.attempt.fence import (
    check_identity,
    LOCK_LEASES, lease_mismatch, lease_params, one_lease, outcome_lease, write_fenced, write_one_fenced,
)
from runledger_sync.store.prepared import PreparedStatement
from runledger_sync.store.rows import to_job
from runledger_sync.store.attempt.transitions import RELEASE, build_failure, build_success, earlier_attempts, failure_params
from runledger_sync.store.workflows.steps import job_ends, jobs_ended, steps_handed_back

_q = job_queue.c
_LEASED = JobStatus.LEASED.value


_SUCCESS = PreparedStatement("success", build_success(
    outcome_lease(*one_lease()),
    done=bindparam("new_progress_done", type_=BigInteger),
    total=bindparam("new_progress_total", type_=BigInteger),
    checkpoint=cast(bindparam("new_checkpoint", type_=Text), JSONB),
    output=cast(bindparam("new_output", type_=Text), JSONB),
))


def complete_job_success(
    bind: Bind,
    *,
    job_id: UUID,
    run_number: int,
    attempt: int,
    worker_id: str,
    completion: Optional[JobCompletion] = None,
    max_output_bytes: int = check.DEFAULT_MAX_OUTPUT_BYTES,
    max_checkpoint_bytes: int = check.DEFAULT_MAX_PAYLOAD_BYTES,
) -> JobRecord:
    """Finish a leased job as SUCCEEDED, storing the completion's progress, checkpoint and output.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        max_output_bytes: the largest output stored (JSON bytes); the worker passes its
            ``JobsConfig.max_output_bytes``.
        max_checkpoint_bytes: the largest checkpoint stored (JSON bytes); the worker
            passes its ``JobsConfig.max_payload_bytes``.

    Raises:
        InvalidCompletionProgress: the completion's progress, alone or merged with
            the stored progress, is negative or has done > total; nothing written.
        OutputTooLarge: the output is larger than ``max_output_bytes``; nothing written.
        CheckpointTooLarge: the checkpoint is larger than ``max_checkpoint_bytes``; nothing written.
        LeaseOwnerMismatch: the lease is not this worker's or has expired.
    """
    identity = check_identity(job_id, run_number, attempt, worker_id)
    completion = completion or JobCompletion()
    check.check_progress_values(completion.progress_done, completion.progress_total, completion=True)
    params = identity.params() | {
        "new_progress_done": completion.progress_done,
        "new_progress_total": completion.progress_total,
        "new_checkpoint": None if completion.checkpoint is None else sealed(check.serialize_checkpoint(
            completion.checkpoint, max_bytes=max_checkpoint_bytes), identity.job_id),
        "new_output": None if completion.output is None else sealed(check.serialize_output(
            completion.output, max_bytes=max_output_bytes), identity.job_id),
    }

    def work(connection: Connection) -> JobRecord:
        record = write_one_fenced(connection, _SUCCESS, params, identity)
        if record.workflow_step_id is not None:
            jobs_ended(connection, job_ends([record]))
        return record

    try:
        return run_in_transaction(bind, work)
    except InvalidProgress as exc:
        # The CHECK constraint judged the completion merged with the stored progress.
        raise InvalidCompletionProgress(
            "Handler returned invalid success progress: merged with the stored progress, "
            "progress_done would exceed progress_total."
        ) from exc

_FAILURE = PreparedStatement("failure", build_failure(outcome_lease(*one_lease())))


def complete_job_failure(
    bind: Bind,
    *,
    job_id: UUID,
    run_number: int,
    attempt: int,
    worker_id: str,
    failure: JobFailure,
    retry_delay_ms: Optional[int],
    error_type: Optional[str] = None,
    traceback: Optional[str] = None,
) -> JobRecord:
    """Record a failed attempt: retry after ``retry_delay_ms``, or dead-letter the job.

    The job is dead-lettered when the failure kind is TERMINAL or PANICKED, or it
    spends the last allowed attempt: the rule of
    :func:`runledger_sync.core.outcomes.dead_letter_reason`, under which a
    transient failure (``job.handler_transient_error``) within its budget spends
    none. A missing or negative delay retries at once.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        error_type: the failing exception's qualified type name, kept on the attempt
            row (``runledger_sync.core.evidence`` makes it and ``traceback`` from an exception).
        traceback: its traceback; cut in the middle to 8192 characters when longer.

    Returns:
        The row after the write: PENDING (retry) or DEAD_LETTERED.

    Raises:
        LeaseOwnerMismatch: the lease is not this worker's or has expired.
    """
    identity = check_identity(job_id, run_number, attempt, worker_id)
    if not isinstance(failure, JobFailure):
        raise InvalidArgument("failure", failure, "a JobFailure")
    delay = 0 if retry_delay_ms is None or retry_delay_ms < 0 else check.check_int("retry_delay_ms", retry_delay_ms, (0, 2**62))
    params = identity.params() | failure_params(failure, delay, {}, FailureEvidence(error_type, traceback))

    def work(connection: Connection) -> JobRecord:
        # Whether this attempt ends the job is the core's rule, asked of the locked row.
        held = LOCK_LEASES.execute(connection, lease_params([identity])).first()
        if held is None:
            raise lease_mismatch(identity)
        earlier = EarlierAttempts()
        if failure.kind.is_retryable and identity.attempt >= held.max_attempts:
            # Below max_attempts claims no failure can spend the last attempt: the history is read only when it can.
            earlier = earlier_attempts(connection, identity.job_id, identity.run_number, identity.attempt)
        dead = dead_letter_reason(failure, identity.attempt, held.max_attempts, earlier) is not None
        row = _FAILURE.execute(connection, params | {"dead_letter": dead}).first()
        if row is None:
            raise lease_mismatch(identity)
        record = to_job(row)
        if record.workflow_step_id is not None:
            jobs_ended(connection, job_ends([record]))
        return record

    return run_in_transaction(bind, work)


_HOLDER = select(_q.worker_id, _q.status).where(_q.id == bindparam("lease_job_id", type_=PG_UUID(as_uuid=True)))


def release_unstarted_job_claim(
    bind: Bind,
    *,
    job_id: UUID,
    run_number: int,
    attempt: int,
    worker_id: str,
    reason: str,
    delay_ms: int,
) -> JobRecord:
    """Hand a prestart claim back to PENDING without spending its attempt.

    Only applies while RUNNING was never persisted for the attempt.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).

    Raises:
        LeaseOwnerMismatch: the job is leased to another worker.
        UnstartedClaimReleaseNotApplicable: RUNNING was persisted, the claim was
            not a prestart claim, or the job is not leased.
    """
    identity = check_identity(job_id, run_number, attempt, worker_id)
    check.check_text("reason", reason, max_length=255)
    params = identity.params() | {"reason": reason, "delay_ms": max(0, int(delay_ms))}
    return run_in_transaction(bind, lambda connection: _release(connection, identity, params))


def _release(connection: Connection, identity: LeaseIdentity, params: dict[str, Any]) -> JobRecord:
    # The fence's lock comes first, so the attempt row's execution marker is read
    # after any concurrent mark-running has committed or rolled back.
    row = write_fenced(connection, (RELEASE,), [identity], params).first()
    if row is not None:
        record = to_job(row)
        steps_handed_back(connection, [record])
        return record
    current = connection.execute(_HOLDER, {"lease_job_id": identity.job_id}).first()
    if current is not None and current.status == _LEASED and current.worker_id != identity.worker_id:
        raise LeaseOwnerMismatch(f"job {identity.job_id} is leased to another worker", job_id=str(identity.job_id))
    raise UnstartedClaimReleaseNotApplicable(
        f"job {identity.job_id} attempt {identity.attempt} cannot be released unstarted: RUNNING was persisted, "
        "it was not a prestart claim, or it is no longer leased",
        job_id=str(identity.job_id),
    )
