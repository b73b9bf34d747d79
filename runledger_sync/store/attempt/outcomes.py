"""Every decided outcome of a worker's attempts, written by one call: :func:`apply_transitions`.

A group may mix every kind of :data:`~runledger_sync.core.outcomes.Transition`
that writes (succeed, continue, retry, dead-letter). Each lease's transition
travels as one row of bound arrays, its kind among them, and one statement
writes the whole group: each column of job_queue and of the attempt row is a
``CASE`` on the row's kind, its events are one or two per row, a dead letter
is kept for each dead-lettered job. The kind is dispatched there, once, in
SQL; the caller only narrows what it decided to values (River's
``JobSetStateIfRunningMany``).

Every row is fenced by :func:`~runledger_sync.store.attempt.fence.outcome_lease`: its
lease must still be held (live or not), behind the fence's lock
(:func:`~runledger_sync.store.attempt.fence.write_fenced`). Plain jobs, and
continuations, which leave a workflow step running, are written in one query;
the jobs whose workflow steps end follow in a transaction of their own that
ends the steps and releases what depends on them.

Beside the write are the reads it needs: what a run's earlier attempts mean for a
failure's decision (:func:`read_earlier_attempts`), and which writes of a group
whose reply was lost landed (:func:`read_back_outcomes`).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from sqlalchemy import BigInteger, Text, and_, case, cast, func, literal, null, or_, select, true
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.continuation import CONTINUED_OUTCOME, HANDLER_CONTINUATION_REASON, delay_ms
from runledger_sync.core.errors import InvalidArgument, InvalidCompletionProgress, InvalidProgress, LeaseOwnerMismatch
from runledger_sync.core.exception_rules import STOPPED_BY_EVENT_KEY
from runledger_sync.core.outcomes import Continue, DeadLetter, EarlierAttempts, Retry, Succeed, Written
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.states import JobStage, JobStatus
from runledger_sync.core.types import JobCompletion, JobEventType
from runledger_sync.core.workflow_errors import WorkflowReleaseConflict
from runledger_sync.db.schema import job_attempts, job_dead_letters, job_events, job_queue
from runledger_sync.store.attempt.fence import (
    check_identity,
    IDENTITY_ARRAYS,
    LeaseResult,
    by_listed_ids,
    lease_mismatch,
    leases_columns,
    outcome_lease,
    unnested,
    write_leases,
)
from runledger_sync.store.attempt.transitions import earlier_attempts, failure_params
from runledger_sync.store.binds import Bind
from runledger_sync.store.sealing import sealed
from runledger_sync.store.notify import notify_ended
from runledger_sync.store.prepared import PreparedStatement
from runledger_sync.store.sql import attempt_of, milliseconds, ordinals
from runledger_sync.store.transactions import run_in_transaction

_q = job_queue.c
_a = job_attempts.c

# The kinds as the statement's CASE tests them.
_SUCCEED, _CONTINUE, _RETRY, _DEAD_LETTER = "succeed", "continue", "retry", "dead_letter"

#: (column of the unnested transitions, array parameter, its type): one transition per lease.
#: A column a kind does not use is NULL in its row.
TRANSITION_ARRAYS = (
    ("kind", "transition_kinds", ARRAY(Text)),
    # Succeed and Continue: None keeps the stored progress and checkpoint.
    ("progress_done", "new_progress_done", ARRAY(BigInteger)),
    ("progress_total", "new_progress_total", ARRAY(BigInteger)),
    ("checkpoint", "new_checkpoints", ARRAY(Text)),
    # Succeed only.
    ("output", "new_outputs", ARRAY(Text)),
    # Continue and Retry: when the job runs again.
    ("delay", "delays_ms", ARRAY(BigInteger)),
    # Retry and DeadLetter.
    ("failure_kind", "failure_kinds", ARRAY(Text)),
    ("code", "failure_codes", ARRAY(Text)),
    ("message", "failure_messages", ARRAY(Text)),
    ("event_extra", "event_extras", ARRAY(Text)),
    ("error_type", "error_types", ARRAY(Text)),
    ("traceback", "tracebacks", ARRAY(Text)),
)


def _build_apply(*, plain_jobs_only: bool) -> Any:
    leases = unnested(IDENTITY_ARRAYS + TRANSITION_ARRAYS)
    kind = leases.c.kind
    succeed, resume, retry, dead = (kind == literal(name) for name in (_SUCCEED, _CONTINUE, _RETRY, _DEAD_LETTER))
    fence = and_(outcome_lease(*leases_columns(leases)), by_listed_ids())
    if plain_jobs_only:
        # A continuation leaves its workflow step RUNNING, so only a step's end needs the workflow pass.
        fence = and_(fence, or_(_q.workflow_step_id.is_(None), resume))
    written = (
        job_queue.update()
        .where(fence)
        .values(
            status=case((succeed, JobStatus.SUCCEEDED.value), (dead, JobStatus.DEAD_LETTERED.value),
                        else_=JobStatus.PENDING.value),
            # A continuation starts the job's next run, at attempt 0 (spec T14).
            run_number=case((resume, _q.run_number + 1), else_=_q.run_number),
            attempt=case((resume, 0), else_=_q.attempt),
            continuations=case((resume, _q.continuations + 1), else_=_q.continuations),
            next_run_at=case((or_(resume, retry), func.now() + milliseconds(leases.c.delay)), else_=_q.next_run_at),
            finished_at=case((or_(succeed, dead), func.now()), else_=_q.finished_at),
            lease_expires_at=None,
            last_heartbeat_at=None,
            worker_id=None,
            stage=case((succeed, JobStage.COMPLETED.value), (resume, JobStage.QUEUED.value), else_=_q.stage),
            progress_done=func.coalesce(leases.c.progress_done, _q.progress_done),
            progress_total=func.coalesce(leases.c.progress_total, _q.progress_total),
            checkpoint=func.coalesce(cast(leases.c.checkpoint, JSONB), _q.checkpoint),
            output=case((succeed, cast(leases.c.output, JSONB)), else_=_q.output),
            status_reason=case((succeed, null()), (resume, HANDLER_CONTINUATION_REASON),
                               else_=leases.c.failure_kind),
            last_error_code=leases.c.code,
            last_error_message=leases.c.message,
        )
        .returning(
            # The identity written under: a continuation's row has moved on to its next run.
            _q.id, leases.c.run_number.label("run_number"), leases.c.attempt.label("attempt"), leases.c.n,
            _q.status, _q.stage, _q.progress_done, _q.progress_total, _q.next_run_at, _q.workflow_step_id,
            _q.last_error_code, _q.last_error_message,
            # What a dead letter keeps of the job.
            _q.job_type, _q.organization_id, _q.payload, _q.checkpoint,
            *(leases.c[name].label(f"t_{name}") for name in (
                "kind", "delay", "failure_kind", "code", "message", "event_extra", "error_type", "traceback")),
        )
        .cte("written")
    )
    w = written.c
    w_succeed, w_resume, w_retry, w_dead = (
        w.t_kind == literal(name) for name in (_SUCCEED, _CONTINUE, _RETRY, _DEAD_LETTER))
    w_failed = or_(w_retry, w_dead)
    attempt = (
        job_attempts.update()
        .where(attempt_of(written))
        .values(
            finished_at=func.now(),
            outcome=case((w_succeed, null()), (w_resume, CONTINUED_OUTCOME), else_=w.t_failure_kind),
            error_code=w.t_code,
            error_message=w.t_message,
            retry_delay_ms=case((w_retry, w.t_delay), else_=null()),
            error_type=case((w_failed, w.t_error_type), else_=_a.error_type),
            traceback=case((w_failed, w.t_traceback), else_=_a.traceback),
        )
        .cte("written_attempt")
    )
    kept = ("job_type", "organization_id", "run_number", "attempt", "error_code", "error_message",
            "payload_snapshot", "checkpoint_snapshot")
    dead_letter_insert = pg_insert(job_dead_letters).from_select(
        ["job_id", *kept],
        select(w.id, w.job_type, w.organization_id, w.run_number, w.attempt, w.t_code, w.t_message, w.payload,
               w.checkpoint).where(w_dead),
    )
    excluded = dead_letter_insert.excluded
    dead_letter = dead_letter_insert.on_conflict_do_update(
        index_elements=[job_dead_letters.c.job_id],
        set_={name: excluded[name] for name in kept} | {"failed_at": func.now()},
    ).cte("written_dead_letter")
    # A failure writes two events (FAILED, then RETRY_SCHEDULED or DEAD_LETTERED); the others one.
    kinds = ordinals(2)
    extra = cast(w.t_event_extra, JSONB)
    event_type = case(
        (w_succeed, JobEventType.SUCCEEDED.value),
        (w_resume, JobEventType.REQUEUED.value),
        (kinds.c.ord == 1, JobEventType.FAILED.value),
        (w_dead, JobEventType.DEAD_LETTERED.value),
        else_=JobEventType.RETRY_SCHEDULED.value,
    )
    payload = case(
        (w_succeed, func.jsonb_build_object()),
        (w_resume, func.jsonb_build_object("reason", HANDLER_CONTINUATION_REASON, "continue_after_ms", w.t_delay,
                                           "next_run_at", w.next_run_at)),
        (kinds.c.ord == 1, func.jsonb_build_object("kind", w.t_failure_kind, "error_code", w.t_code,
                                                   "error_message", w.t_message).op("||")(extra)),
        (w_dead, func.jsonb_build_object("kind", w.t_failure_kind, "error_code", w.t_code).op("||")(extra)),
        else_=func.jsonb_build_object("kind", w.t_failure_kind, "retry_delay_ms", w.t_delay,
                                      "next_run_at", w.next_run_at).op("||")(extra),
    )
    events = job_events.insert().from_select(
        ["job_id", "run_number", "attempt", "event_type", "stage", "progress_done", "progress_total", "payload"],
        select(w.id, w.run_number, w.attempt, event_type, w.stage, w.progress_done, w.progress_total, payload)
        .select_from(written.join(kinds, true()))
        .where(or_(kinds.c.ord == 1, w_failed))
        .order_by(kinds.c.ord),
    ).cte("written_events")
    # What the fence's answer and the workflow pass need of each written row; ended jobs notify.
    return (
        select(w.id, w.run_number, w.attempt, w.n, w.status, w.workflow_step_id, w.last_error_code,
               w.last_error_message)
        .add_cte(attempt, dead_letter, events)
        .where(notify_ended(written))
    )


# The plain jobs' write, which needs no workflow pass, so its one query is the
# whole transaction; and the write of any job, whose steps end after it.
_APPLY_STATEMENTS = (
    PreparedStatement("apply_transitions_plain", _build_apply(plain_jobs_only=True)),
    PreparedStatement("apply_transitions", _build_apply(plain_jobs_only=False)),
)


def apply_transitions(
    bind: Bind, items: Sequence[tuple[LeaseIdentity, Written]], *,
    max_output_bytes: int = check.DEFAULT_MAX_OUTPUT_BYTES, max_checkpoint_bytes: int = check.DEFAULT_MAX_PAYLOAD_BYTES,
    retry: bool = True,
) -> list[LeaseResult]:
    """Write each lease's decided transition (succeed, continue, retry, dead-letter), a group of any mix at once.

    Each is written as decided (:func:`runledger_sync.core.outcomes.decide_failure`,
    :func:`~runledger_sync.core.outcomes.decide_continuation`), never decided
    again here, under its lease's outcome fence. Plain jobs and continuations
    are written together in one query. Jobs whose workflow steps end (and any
    lease that query refused) follow in a transaction of their own that also
    ends their steps; one whose run a cancel holds is answered
    ``WorkflowReleaseConflict`` and written later, without costing the others theirs.

    Args:
        bind: an Engine or HeldConnection (committed here), or a caller's Connection,
            ORM Session or psycopg connection whose transaction the call joins.
        items: (lease identity, transition) pairs; the identities' jobs are distinct.
        max_output_bytes: the largest success output stored (JSON bytes).
        max_checkpoint_bytes: the largest checkpoint stored (JSON bytes).
        retry: False for a caller with a retry policy of its own (the worker's
            completer): a lost connection is raised at once.

    Returns:
        One result per item, in order: None once written, a ``LeaseOwnerMismatch``
        (its fence refused it), or a ``WorkflowReleaseConflict``.

    Raises:
        InvalidArgument: an item's transition is not one that writes; nothing written.
        InvalidCompletionProgress: one item's progress is invalid, alone or merged
            with the stored progress; nothing of that transaction is written
            (plain jobs already written by the first one stay written).
        OutputTooLarge: one output is larger than ``max_output_bytes``; nothing written.
        CheckpointTooLarge: one checkpoint is larger than ``max_checkpoint_bytes``; nothing written.
        CommitOutcomeUnknown: the connection was lost while the write ran; it may have landed.
    """
    values = [
        (check_identity(identity.job_id, identity.run_number, identity.attempt, identity.worker_id),
         _sealed_row(_row_of(transition, max_output_bytes, max_checkpoint_bytes), identity.job_id))
        for identity, transition in items
    ]
    if not values:
        return []
    try:
        return _write_plain_then_workflow(bind, values, retry=retry)
    except InvalidProgress as exc:
        # The job's last error names what its handler returned (the completer splits
        # a refused group down to the one job it concerns).
        returned = {_SUCCEED: "success", _CONTINUE: "continuation"}
        kinds = sorted({returned[row[0]] for _, row in values if row[0] in returned})
        raise InvalidCompletionProgress(
            f"Handler returned invalid {' or '.join(kinds)} progress: merged with the stored progress, "
            "progress_done would exceed progress_total."
        ) from exc


def _row_of(transition: Any, max_output_bytes: int, max_checkpoint_bytes: int) -> tuple[Any, ...]:
    """``transition`` as its row of :data:`TRANSITION_ARRAYS`, each value checked and made storable."""
    if isinstance(transition, Succeed):
        completion = transition.completion or JobCompletion()
        check.check_progress_values(completion.progress_done, completion.progress_total, completion=True)
        output = None if completion.output is None else check.serialize_output(
            completion.output, max_bytes=max_output_bytes)
        return (_SUCCEED, completion.progress_done, completion.progress_total,
                _checkpoint_or_none(completion.checkpoint, max_checkpoint_bytes), output, None) + (None,) * 6
    if isinstance(transition, Continue):
        check.check_progress_values(transition.progress_done, transition.progress_total, completion=True)
        return (_CONTINUE, transition.progress_done, transition.progress_total,
                _checkpoint_or_none(transition.checkpoint, max_checkpoint_bytes), None,
                transition.delay_ms) + (None,) * 6
    if isinstance(transition, (Retry, DeadLetter)):
        delay = max(0, transition.delay_ms) if isinstance(transition, Retry) else 0
        params = failure_params(transition.failure, delay, _hint_of(transition), transition.evidence)
        return (_RETRY if isinstance(transition, Retry) else _DEAD_LETTER, None, None, None, None, delay,
                params["kind"], params["code"], params["message"], params["event_extra"], params["error_type"],
                params["traceback"])
    raise InvalidArgument("transition", transition, "a Succeed, Continue, Retry or DeadLetter")


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


def _sealed_row(row: tuple[Any, ...], job_id: Any) -> tuple[Any, ...]:
    """A row with its checkpoint and output (places 3 and 4) sealed for their job; as it is without keys."""
    if row[3] is None and row[4] is None:
        return row
    return row[:3] + (sealed(row[3], job_id), sealed(row[4], job_id)) + row[5:]


def _checkpoint_or_none(value: Any, max_bytes: int) -> Optional[str]:
    return None if value is None else check.serialize_checkpoint(value, max_bytes=max_bytes)


def _write_plain_then_workflow(
    bind: Bind, values: list[tuple[LeaseIdentity, tuple[Any, ...]]], *, retry: bool,
) -> list[LeaseResult]:
    plain, whole = _APPLY_STATEMENTS
    # Plain jobs first, in one query. A job whose workflow step ends is left out
    # of it (its step must end in the job's own transaction, which takes more
    # statements than one query can decide on) and written below with the rest
    # that query refused.
    results: dict[int, LeaseResult] = {
        index: None for index, result in enumerate(_write_values(bind, plain, values, workflow=False, retry=retry))
        if result is None
    }
    # A workflow's job whose run a cancel holds cannot be written now: the group
    # is written again without it, so the other jobs still commit together.
    while len(results) < len(values):
        group = [index for index in range(len(values)) if index not in results]
        try:
            written = _write_values(bind, whole, [values[index] for index in group], workflow=True, retry=retry)
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
    bind: Bind, statement: PreparedStatement, values: list[tuple[LeaseIdentity, tuple[Any, ...]]], *,
    workflow: bool, retry: bool,
) -> list[LeaseResult]:
    identities = [identity for identity, _ in values]
    columns = {param: [row[position] for _, row in values]
               for position, (_, param, _) in enumerate(TRANSITION_ARRAYS)}

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
    bind: Bind, outcomes: Sequence[tuple[LeaseIdentity, Written]],
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


def _what_the_row_says(row: Any, identity: LeaseIdentity, transition: Written) -> Optional[bool | LeaseOwnerMismatch]:
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
