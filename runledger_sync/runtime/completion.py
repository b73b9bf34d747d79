"""The attempt's one outcome write: decide the transition, write it, run the dead-letter hook.

A success goes to the success writer when there is one, and the pool thread
moves on: the writer's thread ends the attempt once its group is written (the
completer). A group that fails as a whole is written again job by job, on a
pool thread, so grouping never changes an outcome. Every other write goes
through :func:`runledger_sync.store.apply.apply_transition`, which rides out a
lost connection and reads back an unknown commit.
"""

from __future__ import annotations

from runledger_sync.core.errors import (
    CommitOutcomeUnknown,
    InvalidCompletionProgress,
    LeaseOwnerMismatch,
    RunledgerError,
    WorkflowReleaseConflict,
)
from runledger_sync.core.outcomes import (
    INVALID_COMPLETION_PROGRESS_CODE,
    DeadLetter,
    LeaseLost,
    Outcome,
    Retry,
    Succeed,
    Transition,
    decide,
)
from runledger_sync.core.types import (
    JobCompletion,
    JobFailure,
    JobStatus,
)
from runledger_sync.logging import get_logger
from runledger_sync.runtime.attempt import JobExecution
from runledger_sync.runtime.hooks import run_dead_letter_hook
from runledger_sync.store.apply import apply_transition, landed_outcome

log = get_logger(__name__)

#: How long an outcome write keeps retrying a lost database connection.
OUTCOME_WRITE_BUDGET_SECONDS = 10.0


def finish(execution: JobExecution, outcome: Outcome) -> bool:
    """Write the attempt's outcome; True when the success writer took it and will end the attempt."""
    if execution.completed_in_transaction and not isinstance(outcome, LeaseLost) and _committed_by_handler(
            execution, outcome):
        execution.decided = Succeed(JobCompletion())
        return False
    transition = _decide(execution, outcome)
    if isinstance(transition, Succeed) and execution.writers is not None:
        # The worker closes its writers only once every attempt has ended, so this one is open.
        execution.decided = transition
        execution.writers.success.post([(execution.identity, transition.completion)],
                                       lambda _item, result: _group_answered(execution, transition, result))
        return True
    _apply(execution, transition)
    return False


def _decide(execution: JobExecution, outcome: Outcome) -> Transition:
    job = execution.job
    override = (execution.registry.retry_delay_override(job.job_type, outcome.code)
                if isinstance(outcome, JobFailure) and outcome.kind.is_retryable else None)
    return decide(job, outcome, retry_delay_override=override)


def _apply(execution: JobExecution, transition: Transition) -> None:
    """Write the one transition the attempt ended with (nothing for a lost lease)."""
    execution.decided = transition
    if isinstance(transition, LeaseLost):
        log.warning(
            "job processing aborted because durable lease maintenance was lost",
            extra=execution.log_fields | {"failure_code": transition.code},
        )
    elif isinstance(transition, Succeed):
        _complete_success(execution, transition.completion)
    else:
        _complete_failure(execution, transition)


def _committed_by_handler(execution: JobExecution, outcome: Outcome) -> bool:
    """True when the handler's complete_in transaction committed this attempt's success.

    Otherwise the outcome is written as usual; the lease fence makes that safe
    even if the read was wrong, since a second success or a late failure cannot
    land on a SUCCEEDED row.
    """
    landed = landed_outcome(execution.engine, execution.identity)
    if landed is None or landed.status is not JobStatus.SUCCEEDED:
        log.warning("handler completed the job in its own transaction but did not commit it; writing its outcome",
                    extra=execution.log_fields | {"outcome": type(outcome).__name__})
        return False
    if isinstance(outcome, JobFailure):
        log.warning("handler failed after committing its own success; the success stands",
                    extra=execution.log_fields | {"failure_code": outcome.code})
    else:
        log.info("job success committed in the handler's transaction", extra=execution.log_fields)
    return True


def _complete_success(execution: JobExecution, completion: JobCompletion) -> None:
    try:
        apply_transition(execution.engine, execution.identity, Succeed(completion), budget_seconds=_budget(execution),
                         max_output_bytes=execution.config.max_output_bytes)
    except InvalidCompletionProgress as error:
        log.warning("handler returned invalid success completion; marking job terminal",
                    extra=execution.log_fields | {"failure_code": error.code})
        _apply(execution, _decide(execution, JobFailure.terminal(INVALID_COMPLETION_PROGRESS_CODE, error.message)))
    except WorkflowReleaseConflict as error:
        log.warning("job success completion conflicted with workflow cancellation; leaving lease for reaper recovery",
                    extra=execution.log_fields | {"error": str(error)})
    except RunledgerError as error:
        log.error("failed to mark job success", extra=execution.log_fields | {"error": str(error)})


def _group_answered(execution: JobExecution, transition: Succeed, result: object) -> None:
    """On the success writer's thread: end the attempt, or have its success written alone."""
    if result is None:
        execution.end()
    elif isinstance(result, LeaseOwnerMismatch):
        log.error("failed to mark job success", extra=execution.log_fields | {"error": str(result)})
        execution.end()
    elif isinstance(result, WorkflowReleaseConflict):
        log.warning("job success completion conflicted with workflow cancellation; leaving lease for reaper recovery",
                    extra=execution.log_fields | {"error": str(result)})
        execution.end()
    else:
        # The group failed as a whole (another job's invalid progress, a lost
        # connection): this job's own write decides its outcome, off this thread.
        execution.hand_back(lambda: _write_alone_after_group(execution, transition, result))


def _write_alone_after_group(execution: JobExecution, transition: Succeed, error: object) -> None:
    try:
        if isinstance(error, CommitOutcomeUnknown) and landed_outcome(execution.engine, execution.identity) is not None:
            return
        log.debug("group success write failed; writing the job alone",
                  extra=execution.log_fields | {"error": str(error)})
        _apply(execution, transition)
    finally:
        execution.end()


def _budget(execution: JobExecution) -> float:
    # Past its lease the attempt is the reaper's: no outcome write outlives it.
    return min(OUTCOME_WRITE_BUDGET_SECONDS, execution.config.lease_ttl_seconds)


def _complete_failure(execution: JobExecution, transition: Retry | DeadLetter) -> None:
    job, failure = execution.job, transition.failure
    try:
        stored = apply_transition(execution.engine, execution.identity, transition, budget_seconds=_budget(execution))
    except WorkflowReleaseConflict as error:
        log.warning("job failure completion conflicted with workflow cancellation; leaving lease for reaper recovery",
                    extra=execution.log_fields | {"error": str(error)})
        return
    except RunledgerError as error:
        log.error("failed to mark job failure", extra=execution.log_fields | {"error": str(error)})
        return
    if not isinstance(transition, DeadLetter) or stored.status is not JobStatus.DEAD_LETTERED:
        return
    info = transition.info
    log.warning(
        "job dead lettered after handler failure",
        extra=execution.log_fields | {
            "max_attempts": job.max_attempts, "dead_letter_reason": info.reason.value,
            "failure_kind": failure.kind.value, "failure_code": failure.code, "failure_message": failure.message,
        },
    )
    handler = execution.registry.get(job.job_type)
    if handler is not None:
        run_dead_letter_hook(
            handler, execution.context, job.payload, info,
            timeout_seconds=execution.config.dead_letter_hook_timeout_seconds, log_fields=execution.log_fields,
        )
