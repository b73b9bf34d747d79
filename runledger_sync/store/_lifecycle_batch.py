"""Lifecycle writes for many leases at once: mark running, and each decided outcome.

The worker's hot path writes stage ``running`` and SUCCEEDED for every job;
one transaction per job makes each cost a round trip and a commit. These
functions write a whole group of leases in one transaction, behind the same
lease fence as the single writes (:mod:`runledger_sync.store._fence`).

Each lease gets its own answer: None once written, or ``LeaseOwnerMismatch``
when its fence refused it; a refused lease never stops the others from landing.
The statements return only each written lease, not its row: the worker needs
no more, and reading back and decoding whole rows (payloads included) cost
about as much as the rest of the write's client time.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence
from uuid import UUID

from sqlalchemy import BigInteger, Text, and_, cast, select
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.errors import InvalidCompletionProgress, InvalidProgress, LeaseOwnerMismatch
from runledger_sync.core.continuation import delay_ms
from runledger_sync.core.exception_rules import STOPPED_BY_EVENT_KEY
from runledger_sync.core.outcomes import Continue, DeadLetter, EarlierAttempts, Retry, Succeed
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.types import EventLog, JobCompletion
from runledger_sync.core.states import JobStatus
from runledger_sync.core.workflow_errors import WorkflowReleaseConflict
from runledger_sync.db.schema import job_attempts, job_queue
from runledger_sync.store._binds import Bind
from runledger_sync.store._errors import run_in_transaction
from runledger_sync.store._fence import (
    IDENTITY_ARRAYS,
    by_listed_ids,
    lease_mismatch,
    leases_columns,
    live_lease,
    outcome_lease,
    unnested,
    write_fenced,
)
from runledger_sync.store._prepared import PreparedStatement
from runledger_sync.store._sql import check_identity, event_log_params
from runledger_sync.store._transitions import (
    CONTINUATION_ARRAYS,
    FAILURE_ARRAYS,
    build_continuation,
    build_failure,
    build_running,
    build_success,
    earlier_attempts,
    failure_params,
)
from runledger_sync.store._workflow_steps import job_ends, jobs_ended

_q = job_queue.c
_a = job_attempts.c

#: Per-lease result: None once written, or why it was not: its fence refused it, or
#: (a workflow's job) its run is being cancelled.
LeaseResult = Optional[LeaseOwnerMismatch | WorkflowReleaseConflict]

#: What a group write returns per written lease, and what its attempt and event rows need.
_WRITTEN = (_q.id, _q.run_number, _q.attempt, _q.stage, _q.progress_done, _q.progress_total, _q.workflow_step_id)

_SUCCESS_ARRAYS = (
    ("progress_done", "new_progress_done", ARRAY(BigInteger)),
    ("progress_total", "new_progress_total", ARRAY(BigInteger)),
    ("checkpoint", "new_checkpoint", ARRAY(Text)),
    ("output", "new_output", ARRAY(Text)),
)


def _live_leases(leases: Any) -> Any:
    """Rows of these lease identities, still LEASED, whose lease is live now."""
    return and_(live_lease(*leases_columns(leases)), by_listed_ids())


def _held_leases(leases: Any) -> Any:
    """Rows of these lease identities, still LEASED, live or not (the fence of an outcome)."""
    return and_(outcome_lease(*leases_columns(leases)), by_listed_ids())


def _build_group_success(plain_jobs_only: bool) -> Any:
    values = unnested(IDENTITY_ARRAYS + _SUCCESS_ARRAYS)
    fence = _held_leases(values)
    return build_success(
        and_(fence, _q.workflow_step_id.is_(None)) if plain_jobs_only else fence,
        done=values.c.progress_done,
        total=values.c.progress_total,
        checkpoint=cast(values.c.checkpoint, JSONB),
        output=cast(values.c.output, JSONB),
        # What the workflow hook needs of a written row besides: its status.
        returning=(*_WRITTEN, _q.status, _q.last_error_code, _q.last_error_message),
    )


def _build_group_failure(plain_jobs_only: bool) -> Any:
    values = unnested(IDENTITY_ARRAYS + FAILURE_ARRAYS)
    fence = _held_leases(values)
    return build_failure(and_(fence, _q.workflow_step_id.is_(None)) if plain_jobs_only else fence, values)


def _build_group_continuation() -> Any:
    values = unnested(IDENTITY_ARRAYS + CONTINUATION_ARRAYS)
    return build_continuation(_held_leases(values), values)


_RUNNING = PreparedStatement("mark_running", build_running(_live_leases(unnested()), returning=_WRITTEN))
# Per outcome, the plain jobs' write, which needs no workflow hook, so its one
# query is the whole transaction; and the write of any job, whose steps end after it.
_SUCCESS_STATEMENTS = (
    PreparedStatement("complete_success_plain", _build_group_success(plain_jobs_only=True)),
    PreparedStatement("complete_success", _build_group_success(plain_jobs_only=False)),
)
_FAILURE_STATEMENTS = (
    PreparedStatement("complete_failure_plain", _build_group_failure(plain_jobs_only=True)),
    PreparedStatement("complete_failure", _build_group_failure(plain_jobs_only=False)),
)
# A continuation leaves a workflow job's step RUNNING, so one statement serves every job.
_CONTINUATION = PreparedStatement("complete_continuation", _build_group_continuation())


def mark_jobs_running(
    bind: Bind, identities: Sequence[LeaseIdentity], *, event_log: EventLog | str = EventLog.FULL
) -> list[LeaseResult]:
    """Persist stage ``running`` for many claimed jobs in one transaction.

    Same effect per job as :func:`runledger_sync.store._running.mark_job_running`.

    Args:
        event_log: ``full`` writes a STAGE_CHANGED event per job; ``transitions``
            does not (the worker passes ``JobsConfig.event_log``).

    Returns:
        One result per identity, in order: None once written, or a ``LeaseOwnerMismatch``.

    Raises:
        InvalidArgument: ``event_log`` is not a level of :class:`EventLog`.
        CommitOutcomeUnknown: the connection was lost while the write ran; it may have landed.
    """
    flag = event_log_params(event_log)
    checked = [check_identity(*_identity_values(identity)) for identity in identities]
    if not checked:
        return []
    return run_in_transaction(bind, lambda connection: write_leases(connection, _RUNNING, checked, flag),
                              one_query=True)


def complete_jobs_success(
    bind: Bind, completions: Sequence[tuple[LeaseIdentity, Optional[JobCompletion]]], *,
    max_output_bytes: int = check.DEFAULT_MAX_OUTPUT_BYTES, max_checkpoint_bytes: int = check.DEFAULT_MAX_PAYLOAD_BYTES,
    retry: bool = True,
) -> list[LeaseResult]:
    """Finish many leased jobs as SUCCEEDED, the plain ones in one transaction.

    Same effect per job as :func:`runledger_sync.store.lifecycle.complete_job_success`.
    Plain jobs are written together in one query. Workflow jobs (and any lease that
    query refused) follow in a transaction of their own that also ends their steps;
    one whose run a cancel holds is answered ``WorkflowReleaseConflict`` and written
    later, without costing the others theirs.

    Returns:
        One result per identity, in order: None once written, a ``LeaseOwnerMismatch``,
        or a ``WorkflowReleaseConflict``.

    Raises:
        InvalidCompletionProgress: one completion's progress is invalid, alone or
            merged with the stored progress; nothing of that transaction is written
            (plain jobs already written by the first one stay written).
        OutputTooLarge: one output is larger than ``max_output_bytes``; nothing written.
        CheckpointTooLarge: one checkpoint is larger than ``max_checkpoint_bytes``; nothing written.
        CommitOutcomeUnknown: the connection was lost while the write ran; it may have landed.
    """
    values: list[tuple[LeaseIdentity, tuple[Any, ...]]] = []
    for identity, completion in completions:
        completion = completion or JobCompletion()
        check.check_progress_values(completion.progress_done, completion.progress_total, completion=True)
        values.append((check_identity(*_identity_values(identity)), (
            completion.progress_done, completion.progress_total,
            _checkpoint_or_none(completion.checkpoint, max_checkpoint_bytes),
            None if completion.output is None else check.serialize_output(completion.output, max_bytes=max_output_bytes),
        )))
    try:
        return _write_plain_then_workflow(bind, values, _SUCCESS_ARRAYS, _SUCCESS_STATEMENTS, retry=retry)
    except InvalidProgress as exc:
        raise InvalidCompletionProgress(
            "Handler returned invalid success progress: merged with the stored progress, "
            "progress_done would exceed progress_total."
        ) from exc


def complete_jobs_failure(
    bind: Bind, failures: Sequence[tuple[LeaseIdentity, Retry | DeadLetter]], *, retry: bool = True,
) -> list[LeaseResult]:
    """Record many failed attempts as decided: each retried after its delay, or dead-lettered.

    Same effect per job as :func:`runledger_sync.store.lifecycle.complete_job_failure`,
    but the transition is written as the worker decided it
    (:func:`runledger_sync.core.outcomes.decide_failure`), never decided again here,
    with the exception's type and traceback the transition carries on its attempt row.
    Plain jobs are written in one query, workflow jobs after them as
    :func:`complete_jobs_success` does.

    Returns:
        One result per identity, in order: None once written, a ``LeaseOwnerMismatch``,
        or a ``WorkflowReleaseConflict``.

    Raises:
        CommitOutcomeUnknown: the connection was lost while the write ran; it may have landed.
    """
    values: list[tuple[LeaseIdentity, tuple[Any, ...]]] = []
    for identity, transition in failures:
        delay = transition.delay_ms if isinstance(transition, Retry) else 0
        params = failure_params(transition.failure, max(0, delay), _hint_of(transition), transition.evidence)
        values.append((check_identity(*_identity_values(identity)), (
            params["kind"], params["code"], params["message"], params["retry_delay"],
            isinstance(transition, DeadLetter), params["event_extra"], params["error_type"], params["traceback"],
        )))
    return _write_plain_then_workflow(bind, values, FAILURE_ARRAYS, _FAILURE_STATEMENTS, retry=retry)


def complete_jobs_continuation(
    bind: Bind, continuations: Sequence[tuple[LeaseIdentity, Continue]], *,
    max_checkpoint_bytes: int = check.DEFAULT_MAX_PAYLOAD_BYTES, retry: bool = True,
) -> list[LeaseResult]:
    """End many leased jobs' runs in continuations (spec T14), in one transaction.

    Each job goes back to PENDING as its next run, attempt 0, due after its
    delay, with the checkpoint and progress given (None keeps the stored ones).
    A workflow job's step stays RUNNING. Whether a continuation is allowed (the
    definition's cap, the step's opt-in) was decided before
    (:func:`runledger_sync.core.outcomes.decide_continuation`).

    Returns:
        One result per identity, in order: None once written, or a ``LeaseOwnerMismatch``.

    Raises:
        InvalidCompletionProgress: one continuation's progress merged with the stored
            progress is invalid; nothing written.
        CheckpointTooLarge: one checkpoint is larger than ``max_checkpoint_bytes``; nothing written.
        CommitOutcomeUnknown: the connection was lost while the write ran; it may have landed.
    """
    values: list[tuple[LeaseIdentity, tuple[Any, ...]]] = []
    for identity, transition in continuations:
        check.check_progress_values(transition.progress_done, transition.progress_total, completion=True)
        values.append((check_identity(*_identity_values(identity)), (
            transition.delay_ms, _checkpoint_or_none(transition.checkpoint, max_checkpoint_bytes),
            transition.progress_done, transition.progress_total,
        )))
    if not values:
        return []
    try:
        return _write_values(bind, _CONTINUATION, values, CONTINUATION_ARRAYS, workflow=False, retry=retry)
    except InvalidProgress as exc:
        raise InvalidCompletionProgress(
            "Handler returned invalid continuation progress: merged with the stored progress, "
            "progress_done would exceed progress_total."
        ) from exc


def _hint_of(transition: Retry | DeadLetter) -> dict[str, Any]:
    """What the failure events record besides the failure.

    A retry's handler hint (the attempt row keeps the delay it made), or the job
    type's setting that dead-lettered the handler's exception at once.
    """
    if isinstance(transition, DeadLetter) and transition.stopped_by is not None:
        return {STOPPED_BY_EVENT_KEY: transition.stopped_by.value}
    hint = transition.failure.retry_after
    if not isinstance(transition, Retry) or hint is None:
        return {}
    return {"retry_after_ms": delay_ms(hint)}


def _write_plain_then_workflow(
    bind: Bind, values: list[tuple[LeaseIdentity, tuple[Any, ...]]], arrays: Sequence[tuple[str, str, Any]],
    statements: tuple[PreparedStatement, PreparedStatement], *, retry: bool,
) -> list[LeaseResult]:
    """Write every lease's values: the plain jobs in one query, then the rest with their workflow steps.

    ``retry``: as :func:`~runledger_sync.store._errors.run_in_transaction`'s.
    """
    plain, whole = statements
    # Plain jobs first, in one query. A workflow's job is left out of it (its step
    # must end in the job's own transaction, which takes more statements than one
    # query can decide on) and written below with the rest that query refused.
    results: dict[int, LeaseResult] = {
        index: None for index, result in enumerate(_write_values(bind, plain, values, arrays, workflow=False, retry=retry))
        if result is None
    }
    # A workflow's job whose run a cancel holds cannot be written now: the group
    # is written again without it, so the other jobs still commit together.
    while len(results) < len(values):
        group = [index for index in range(len(values)) if index not in results]
        try:
            written = _write_values(bind, whole, [values[index] for index in group], arrays, workflow=True,
                                    retry=retry)
        except WorkflowReleaseConflict as conflict:
            held_back = [index for index in group
                         if str(values[index][0].job_id) in conflict.details.get("job_ids", ())]
            if not held_back:
                raise
            results.update((index, conflict) for index in held_back)
            continue
        results.update(zip(group, written, strict=True))
    return [results[index] for index in range(len(values))]


def _write_values(
    bind: Bind, statement: PreparedStatement, values: list[tuple[LeaseIdentity, tuple[Any, ...]]],
    arrays: Sequence[tuple[str, str, Any]], *, workflow: bool, retry: bool,
) -> list[LeaseResult]:
    identities = [identity for identity, _ in values]
    columns = {param: [row[position] for _, row in values] for position, (_, param, _) in enumerate(arrays)}

    def work(connection: Connection) -> list[LeaseResult]:
        if not workflow:
            return write_leases(connection, statement, identities, columns)
        # A savepoint: when a run's cancel refuses the step hooks, the job rows this
        # pass wrote must go too, even in a caller's transaction that goes on.
        with connection.begin_nested():
            return write_leases(connection, statement, identities, columns, end_steps=True)

    return run_in_transaction(bind, work, one_query=not workflow, retry=retry)


def read_earlier_attempts(bind: Bind, identity: LeaseIdentity) -> EarlierAttempts:
    """The run's attempts before ``identity``'s, as the dead-letter rule counts them (a lost connection is raised)."""
    return run_in_transaction(bind, lambda connection: earlier_attempts(
        connection, identity.job_id, identity.run_number, identity.attempt), one_repeatable_write=True, retry=False)


def read_back_outcomes(
    bind: Bind, outcomes: Sequence[tuple[LeaseIdentity, Succeed | Continue | Retry | DeadLetter]],
) -> list[Optional[bool | LeaseOwnerMismatch]]:
    """What the rows say of outcome writes whose reply was lost, in one read (a lost connection is raised, not retried).

    Returns:
        Per outcome, in order: True when its row shows the write landed; None
        while the job is still leased under the identity (the write is still to
        be made); a ``LeaseOwnerMismatch`` when the attempt ended otherwise
        meanwhile (a cancel, the reaper), so the write never lands.
    """
    ids = [identity.job_id for identity, _ in outcomes]
    rows = {row.id: row for row in run_in_transaction(bind, lambda connection: connection.execute(
        _READ_BACK, {"lease_job_ids": ids}).all(), one_repeatable_write=True, retry=False)}
    return [_what_the_row_says(rows.get(identity.job_id), identity, transition) for identity, transition in outcomes]


_READ_BACK = select(_q.id, _q.run_number, _q.attempt, _q.status, _q.last_error_code).where(by_listed_ids())


def _what_the_row_says(
    row: Any, identity: LeaseIdentity, transition: Succeed | Continue | Retry | DeadLetter,
) -> Optional[bool | LeaseOwnerMismatch]:
    if isinstance(transition, Continue) and row is not None and row.run_number > identity.run_number:
        # Only a continuation moves a leased job to its next run (a requeue takes a finished one).
        return True
    if row is not None and (row.run_number, row.attempt) == (identity.run_number, identity.attempt):
        if row.status == JobStatus.LEASED.value:
            return None
        if isinstance(transition, Succeed):
            if row.status == JobStatus.SUCCEEDED.value:
                return True
        # The reaper retries or dead-letters with its own code: a row with this failure's code is this write's.
        elif (isinstance(transition, (Retry, DeadLetter))
              and row.status in (JobStatus.PENDING.value, JobStatus.DEAD_LETTERED.value)
              and row.last_error_code == transition.failure.code):
            return True
    return lease_mismatch(identity)


def _identity_values(identity: LeaseIdentity) -> tuple[UUID, int, int, str]:
    return identity.job_id, identity.run_number, identity.attempt, identity.worker_id


def _checkpoint_or_none(value: Any, max_bytes: int) -> Optional[str]:
    return None if value is None else check.serialize_checkpoint(value, max_bytes=max_bytes)


def write_leases(
    connection: Connection, statement: PreparedStatement, identities: list[LeaseIdentity],
    values: dict[str, Any], *, end_steps: bool = False,
) -> list[LeaseResult]:
    """Lock the identities' rows, run ``statement``; answer each identity (``end_steps``: then end its workflow step)."""
    rows = write_fenced(connection, (statement,), identities, values).all()
    if end_steps:
        jobs_ended(connection, job_ends(rows))
    written = {(row.id, row.run_number, row.attempt) for row in rows}
    return [
        None if (identity.job_id, identity.run_number, identity.attempt) in written else lease_mismatch(identity)
        for identity in identities
    ]
