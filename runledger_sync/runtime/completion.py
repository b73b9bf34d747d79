"""The attempt's one outcome write: decide the transition, write it, run the dead-letter hook.

A success goes to the success writer when there is one, and the pool thread
moves on: the writer's thread ends the attempt once its group is written (the
completer). A group that fails as a whole is written again job by job, on a
pool thread, so grouping never changes an outcome. Every other write goes
through :mod:`runledger_sync.store.apply`, which rides out a lost connection
and reads back a write whose reply was lost. A success is logged as failed
(ERROR) only when it did not land; one whose reply was lost is logged at INFO
once the row shows it landed.
"""

from __future__ import annotations

import time

from runledger_sync.core.errors import InvalidCompletionProgress, LeaseOwnerMismatch, RunledgerError
from runledger_sync.core.outcomes import (
    HANDLER_TRANSIENT_ERROR_CODE,
    INVALID_COMPLETION_PROGRESS_CODE,
    DeadLetter,
    LeaseLost,
    Outcome,
    Succeed,
)
from runledger_sync.core.store_errors import CommitOutcomeUnknown, ConnectionFailed
from runledger_sync.core.types import (
    JobCompletion,
    JobFailure,
    JobStatus,
)
from runledger_sync.core.workflow_errors import WorkflowReleaseConflict
from runledger_sync.logging import get_logger
from runledger_sync.runtime.attempt import JobExecution
from runledger_sync.runtime.hooks import run_dead_letter_hook
from runledger_sync.store.driver import apply_failure, apply_success, read_back

log = get_logger(__name__)

#: The least time an outcome write is given, even when the lease is nearly out:
#: one try and its read-back.
MIN_OUTCOME_WRITE_SECONDS = 1.0

SUCCESS_REPLY_LOST = "job success landed; its reply was lost"


def finish(execution: JobExecution, outcome: Outcome) -> bool:
    """Write the attempt's outcome; True when the success writer took it and will end the attempt."""
    if execution.completed_in_transaction and not isinstance(outcome, LeaseLost) and _committed_by_handler(
            execution, outcome):
        return False
    if isinstance(outcome, LeaseLost):
        execution.decided = outcome
        log.warning(
            "job processing aborted because durable lease maintenance was lost",
            extra=execution.log_fields | {"failure_code": outcome.code},
        )
        return False
    if isinstance(outcome, JobFailure):
        _complete_failure(execution, outcome)
        return False
    transition = execution.decided = Succeed(outcome)
    if execution.writers is not None:
        # The worker closes its writers only once every attempt has ended, so this one is open.
        execution.writers.success.post([(execution.identity, transition.completion)],
                                       lambda _item, result: _group_answered(execution, transition, result))
        return True
    _complete_success(execution, transition.completion)
    return False


def _committed_by_handler(execution: JobExecution, outcome: Outcome) -> bool:
    """True when nothing more is to be written for an attempt whose handler used complete_in.

    That is when its transaction committed the success, and when whether it did
    cannot be read (nothing could be written either; if it did not commit, the
    lease runs out and the reaper retries the job). Otherwise the outcome is
    written as usual; the lease fence makes that safe even if the read was
    wrong, since a second success or a late failure cannot land on a SUCCEEDED row.
    """
    try:
        landed = read_back(execution.engine, execution.identity, budget_seconds=_budget(execution))
    except ConnectionFailed as error:
        log.warning("could not read whether the handler's transaction committed the job's success; "
                    "if it did not, the reaper retries the job", extra=execution.log_fields | {"error": str(error)})
        return True
    if landed is None or landed.status is not JobStatus.SUCCEEDED:
        log.warning("handler completed the job in its own transaction but did not commit it; writing its outcome",
                    extra=execution.log_fields | {"outcome": type(outcome).__name__})
        return False
    execution.decided = Succeed(JobCompletion())
    if isinstance(outcome, JobFailure) and outcome.code == HANDLER_TRANSIENT_ERROR_CODE:
        # The connection failed after the commit: most often the commit's own reply was lost.
        log.info(SUCCESS_REPLY_LOST, extra=execution.log_fields | {"write": "handler_transaction",
                                                                  "error": outcome.message})
    elif isinstance(outcome, JobFailure):
        log.warning("handler failed after committing its own success; the success stands",
                    extra=execution.log_fields | {"failure_code": outcome.code})
    else:
        log.info("job success committed in the handler's transaction", extra=execution.log_fields)
    return True


def _complete_success(execution: JobExecution, completion: JobCompletion, *, maybe_landed: bool = False) -> None:
    try:
        landed = apply_success(execution.engine, execution.identity, completion, budget_seconds=_budget(execution),
                               maybe_landed=maybe_landed, max_output_bytes=execution.config.max_output_bytes)
    except InvalidCompletionProgress as error:
        log.warning("handler returned invalid success completion; marking job terminal",
                    extra=execution.log_fields | {"failure_code": error.code})
        _complete_failure(execution, JobFailure.terminal(INVALID_COMPLETION_PROGRESS_CODE, error.message))
    except WorkflowReleaseConflict as error:
        log.warning("job success completion conflicted with workflow cancellation; leaving lease for reaper recovery",
                    extra=execution.log_fields | {"error": str(error)})
    except CommitOutcomeUnknown as error:
        log.warning("job success may not have landed: its reply was lost and the database stayed out of reach; "
                    "if it did not land, the reaper retries the job", extra=execution.log_fields | {"error": str(error)})
    except RunledgerError as error:
        log.error("failed to mark job success", extra=execution.log_fields | {"error": str(error)})
    else:
        if landed.reply_lost:
            log.info(SUCCESS_REPLY_LOST, extra=execution.log_fields | {"write": "group" if maybe_landed else "alone"})


def _group_answered(execution: JobExecution, transition: Succeed, result: object) -> None:
    """On the success writer's thread: end the attempt, or have its success written alone."""
    if result is None:
        execution.end()
    elif isinstance(result, LeaseOwnerMismatch):
        # The group's transaction committed without this job's row: the fence refused it.
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
        # A group whose reply was lost may have landed: the row is read back before writing again.
        reply_lost = isinstance(error, CommitOutcomeUnknown)
        if not reply_lost:
            log.debug("group success write failed; writing the job alone",
                      extra=execution.log_fields | {"error": str(error)})
        _complete_success(execution, transition.completion, maybe_landed=reply_lost)
    finally:
        execution.end()


def _budget(execution: JobExecution) -> float:
    # A lost connection is retried for as long as the lease lasts (by this process's
    # clock), so a database restart shorter than the lease never hands the job to
    # the reaper, which would spend an attempt. Past its lease the attempt is the
    # reaper's: the fence would refuse the write anyway.
    return max(MIN_OUTCOME_WRITE_SECONDS, execution.local_lease_deadline - time.monotonic())


def _complete_failure(execution: JobExecution, failure: JobFailure) -> None:
    job = execution.job
    override = (execution.registry.retry_delay_override(job.job_type, failure.code)
                if failure.kind.is_retryable else None)
    try:
        transition, landed = apply_failure(execution.engine, job, execution.identity, failure,
                                           retry_delay_override=override, budget_seconds=_budget(execution))
    except WorkflowReleaseConflict as error:
        log.warning("job failure completion conflicted with workflow cancellation; leaving lease for reaper recovery",
                    extra=execution.log_fields | {"error": str(error)})
        return
    except CommitOutcomeUnknown as error:
        log.warning("job failure may not have landed: its reply was lost and the database stayed out of reach; "
                    "if it did not land, the reaper retries the job", extra=execution.log_fields | {"error": str(error)})
        return
    except RunledgerError as error:
        log.error("failed to mark job failure", extra=execution.log_fields | {"error": str(error)})
        return
    execution.decided = transition
    stored = landed.record
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
