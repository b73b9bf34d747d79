"""One claimed job, start to finish: the seed's ``process_claimed_job`` on threads.

The pool thread marks the job running, runs the handler and writes the
outcome. Beside it the pool thread's timer thread
(:mod:`runledger_sync.runtime.timer_thread`) renews the lease, watches the
deadline and notices an operator's cancel, from the first renewal or the
deadline on (a job done before then never wakes it). Both may try to end the
attempt (the handler returns; the deadline passes; the lease is lost), so whichever decides first
takes the attempt's one outcome through :class:`_OutcomeGate`; the other's
result is discarded. Threads cannot be killed: a handler that ignores its
cancellation flag keeps its pool thread (and so its concurrency slot) until it
returns, but its late result is never written.

Given :class:`HotPathWriters` (the worker loop always passes them), the
running and success writes of concurrent jobs go through group writers, one
transaction for many jobs; any group that fails as a whole is written again
job by job, so grouping never changes an outcome.

A handler may instead write its success itself, in its own transaction, with
``ctx.complete_in(conn)``. The job row then stays locked by that transaction
until it ends, and after the handler returns the worker reads the row: a
SUCCEEDED attempt means the handler committed and nothing more is written;
still LEASED means it did not, and the handler's outcome is written as usual.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Optional

from sqlalchemy.engine import Engine
from tenacity import Retrying, retry_if_exception_type, stop_before_delay, stop_when_event_set, wait_exponential

from runledger_sync.config import JobsConfig
from runledger_sync.core.errors import (
    CommitOutcomeUnknown,
    ConnectionFailed,
    InvalidArgument,
    InvalidCompletionProgress,
    InvalidPayload,
    JobCancelled,
    LeaseOwnerMismatch,
    RunledgerError,
    UnstartedClaimReleaseNotApplicable,
    WorkflowReleaseConflict,
)
from runledger_sync.core.records import JobRecord
from runledger_sync.core.types import (
    JobCompletion,
    JobContext,
    JobFailure,
    JobStatus,
)
from runledger_sync.core.outcomes import (
    HANDLER_ERROR_CODE,
    HANDLER_INVALID_RESULT_CODE,
    HANDLER_NOT_REGISTERED_CODE,
    HANDLER_PANIC_CODE,
    HANDLER_TRANSIENT_ERROR_CODE,
    INVALID_COMPLETION_PROGRESS_CODE,
    LEASE_OWNER_MISMATCH_CODE,
    MAINTENANCE_LOST,
    DeadLetter,
    LeaseLost,
    Outcome,
    Retry,
    Succeed,
    Transition,
    decide,
    timeout_failure,
)
from runledger_sync.core.validation import check_failure_code, completion_progress_problem, serialize_json
from runledger_sync.db.errors import is_transient_error
from runledger_sync.logging import get_logger, job_log_fields
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.group_writer import GroupWriter, Ticket
from runledger_sync.runtime.hooks import run_dead_letter_hook
from runledger_sync.runtime.pace import HandlerPace
from runledger_sync.runtime.timer_thread import TimerThread
from runledger_sync.store import admin, lifecycle, lifecycle_batch
from runledger_sync.store.held import HeldConnection

log = get_logger(__name__)

UNKNOWN_WORKER_ID = "unknown-worker"
RUNNING_PROGRESS_PERSIST_FAILED_REASON = "RUNNING_PROGRESS_PERSIST_FAILED"
#: How long a renewal still in flight when the lease ran out may take to answer,
#: so the lost attempt is logged with the database's reason when it has one.
LATE_RENEWAL_ANSWER_SECONDS = 1.0
#: Pauses between renewals retried after a lost connection (growing exponentially up to the max).
RENEWAL_RETRY_FIRST_PAUSE_SECONDS = 0.1
RENEWAL_RETRY_MAX_PAUSE_SECONDS = 1.0
#: How often a watchdog waiting on a renewal looks whether the attempt has ended.
RENEWAL_JOIN_STEP_SECONDS = 0.05
UNSTARTED_CLAIM_RETRY_DELAY_MS = 1_000
#: The longest a group write waits for items still on their way (a bound on the
#: delay grouping can add to one job's running or success write).
GROUP_LINGER_SECONDS = 0.002
#: How long an outcome write keeps retrying a lost database connection.
OUTCOME_WRITE_BUDGET_SECONDS = 10.0


SuccessItem = tuple[lifecycle.LeaseIdentity, Optional[JobCompletion]]


@dataclass(frozen=True)
class HotPathWriters:
    """The group writers for the two writes every job makes: running, then success."""

    running: GroupWriter[lifecycle.LeaseIdentity, None]
    success: GroupWriter[SuccessItem, None]
    #: Each writer's own connection, used only on its thread.
    connections: tuple[HeldConnection, ...]
    #: How long handlers take lately: how many others may succeed within the linger.
    pace: HandlerPace

    @classmethod
    def start(cls, engine: Engine, worker_id: str, *, in_flight: Callable[[], int]) -> "HotPathWriters":
        """Start both writers.

        The polling thread posts each claimed batch to the running writer whole,
        so that writer never waits for company.

        Args:
            in_flight: how many jobs are running now; any of them may be about to
                succeed, so the success writer lingers briefly for the company of
                those that handlers' recent pace says should come meanwhile.
        """
        running_connection, success_connection = HeldConnection(engine), HeldConnection(engine)
        pace = HandlerPace()
        running: GroupWriter[lifecycle.LeaseIdentity, None] = GroupWriter(
            f"runledger-running-{worker_id}",
            lambda group: lifecycle_batch.mark_jobs_running(running_connection, group),
        )
        success: GroupWriter[SuccessItem, None] = GroupWriter(
            f"runledger-success-{worker_id}",
            lambda group: lifecycle_batch.complete_jobs_success(success_connection, group),
            linger_seconds=GROUP_LINGER_SECONDS,
            still_coming=lambda: pace.finishing_within(in_flight() - success.waiting, GROUP_LINGER_SECONDS),
        )
        return cls(running=running, success=success, connections=(running_connection, success_connection), pace=pace)

    def close(self) -> None:
        self.running.close()
        self.success.close()
        # Both threads have stopped, so their connections are free to close here.
        for connection in self.connections:
            connection.close()


class _OutcomeGate:
    """Lets exactly one of the pool thread and the watchdog decide the attempt's outcome."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken = False

    def take(self) -> bool:
        with self._lock:
            if self._taken:
                return False
            self._taken = True
            return True


def lease_identity(job: JobRecord) -> lifecycle.LeaseIdentity:
    """The lease a claimed job runs under: every write of the attempt is fenced by it."""
    return lifecycle.LeaseIdentity(job.id, job.run_number, job.attempt, job.worker_id or UNKNOWN_WORKER_ID)


class JobExecution:
    """Everything one claimed job needs while it runs."""

    def __init__(
        self, engine: Engine, registry: JobRegistry, job: JobRecord, config: JobsConfig,
        writers: Optional[HotPathWriters],
    ) -> None:
        self.engine = engine
        self.writers = writers
        self.registry = registry
        self.job = job
        self.config = config
        self.identity = lease_identity(job)
        worker_id = self.identity.worker_id
        self.context = JobContext(
            job_id=job.id,
            run_number=job.run_number,
            attempt=job.attempt,
            organization_id=job.organization_id,
            worker_id=worker_id,
            job_type=job.job_type,
            checkpoint=job.checkpoint,
            _progress_reporter=self._report_progress,
            _completer=self._complete_in,
        )
        self.log_fields = job_log_fields(
            job_id=job.id, job_type=job.job_type, run_number=job.run_number, attempt=job.attempt,
            organization_id=job.organization_id, worker_id=worker_id,
        )
        self.gate = _OutcomeGate()
        self.stop_watchdog = threading.Event()
        self.deadline_passed = threading.Event()
        self.lease_lost: Optional[LeaseLost] = None
        #: Set when the lease ran out by the local clock with a renewal still unanswered.
        self.lease_verdict_pending = threading.Event()
        #: When the lease runs out by this process's clock, at the latest: TTL after
        #: the last renewal was sent (the claim for the first one, a little before this).
        self.local_lease_deadline = time.monotonic() + config.lease_ttl_seconds
        #: Set once the handler wrote its success in its own transaction (complete_in).
        self.completed_in_transaction = False
        #: The transition the attempt ended with, once one was decided (by the handler or the watch).
        self.decided: Optional[Transition] = None

    def _report_progress(self, context: JobContext, done: Optional[int], total: Optional[int], checkpoint: Any) -> None:
        lifecycle.update_job_progress(
            self.engine, **self.identity.keywords(), progress_done=done, progress_total=total, checkpoint=checkpoint
        )

    def _complete_in(self, context: JobContext, bind: Any, completion: Optional[JobCompletion]) -> JobRecord:
        if self.lease_lost is not None:
            raise LeaseOwnerMismatch(
                f"job {self.job.id} lost its lease before the handler completed it", job_id=str(self.job.id)
            )
        # Past the deadline the attempt is a timeout; a success now would contradict it.
        context.check_cancelled()
        try:
            record = lifecycle.complete_job_success(bind, **self.identity.keywords(), completion=completion)
        except LeaseOwnerMismatch:
            # The fence refused the write, so the lease is gone: end the attempt as a
            # lost lease (nothing written, the reaper recovers it), as a heartbeat would.
            self.lease_lost = LeaseLost(LEASE_OWNER_MISMATCH_CODE, "Job lease ownership was lost during processing.")
            context.request_cancel("lease_lost")
            raise
        self.completed_in_transaction = True
        return record


def process_claimed_job(
    engine: Engine, registry: JobRegistry, job: JobRecord, config: JobsConfig,
    writers: Optional[HotPathWriters] = None, running: Optional[Ticket[lifecycle.LeaseIdentity, None]] = None,
    timer: Optional[TimerThread] = None,
) -> None:
    """Run one claimed job and write its single outcome (or none when the lease was lost).

    Args:
        writers: group writers shared with the worker's other jobs; None writes
            this job's running and success on their own.
        running: this job's running write, already posted to ``writers.running``
            with the rest of its batch (the polling thread does so); None writes it
            here on its own.
        timer: the calling pool thread's heartbeat timer thread, free for this job;
            None starts one for this job alone.
    """
    if timer is not None:
        _process_with_timer(engine, registry, job, config, writers, running, timer)
        return
    timer = TimerThread(f"runledger-heartbeat-{job.id}")
    try:
        _process_with_timer(engine, registry, job, config, writers, running, timer)
    finally:
        timer.close()


def _process_with_timer(
    engine: Engine, registry: JobRegistry, job: JobRecord, config: JobsConfig,
    writers: Optional[HotPathWriters], running: Optional[Ticket[lifecycle.LeaseIdentity, None]],
    timer: TimerThread,
) -> None:
    execution = JobExecution(engine, registry, job, config, writers)
    started = time.monotonic()
    if not _mark_running_or_abort(execution, running):
        return
    if log.isEnabledFor(logging.DEBUG):
        # Payloads may hold secrets: only an operator's explicit log_payloads shows them.
        shown = {"payload": job.payload} if config.log_payloads else {}
        log.debug("job started", extra=execution.log_fields | shown)
    first_beat = time.monotonic() + config.heartbeat_interval
    # The timer thread wakes only if the job is still running when its first
    # renewal or its deadline comes; a job done sooner is simply withdrawn.
    timer.schedule(min(first_beat, _deadline(execution, started)), lambda: _watch(execution, started, first_beat))
    try:
        handler_started = time.monotonic()
        outcome = _run_handler(execution)
        if writers is not None:
            writers.pace.record(time.monotonic() - handler_started)
        if execution.lease_verdict_pending.is_set():
            # The lease ran out while a renewal was in flight: the watch logs the
            # verdict itself once that renewal has said why.
            timer.withdraw()
        elif execution.gate.take():
            execution.stop_watchdog.set()
            timer.withdraw()
            _finish(execution, outcome)
        elif not isinstance(outcome, LeaseLost):
            log.warning(
                "handler finished after its attempt was already decided; result discarded",
                extra=execution.log_fields | {"late_result": type(outcome).__name__},
            )
    finally:
        # The watch must never outlive the attempt. After a crash above it would
        # otherwise keep renewing a lease nobody works under and later write a
        # timeout; taking the gate leaves the lease to expire for the reaper, as
        # the seed's dropped task does. When the watch decided the outcome,
        # withdrawing waits for its write to land before the slot is freed.
        execution.gate.take()
        execution.stop_watchdog.set()
        timer.withdraw()
    log.info("job processed", extra=execution.log_fields | _outcome_fields(execution.decided) | {
        "elapsed_ms": int((time.monotonic() - started) * 1000)})


def _outcome_fields(transition: Optional[Transition]) -> dict[str, Any]:
    """How the attempt ended, for its closing log line (never the payload or the output)."""
    if transition is None:
        return {"outcome": "undecided"}
    if isinstance(transition, LeaseLost):
        return {"outcome": "lease_lost", "failure_code": transition.code}
    if isinstance(transition, Succeed):
        return {"outcome": "succeeded"}
    failure = transition.failure
    ended = "retry_scheduled" if isinstance(transition, Retry) else "dead_lettered"
    return {"outcome": ended, "failure_kind": failure.kind.value, "failure_code": failure.code}


# -- step 2: mark running -----------------------------------------------------------


def _mark_running_or_abort(
    execution: JobExecution, running: Optional[Ticket[lifecycle.LeaseIdentity, None]],
) -> bool:
    try:
        if running is not None:
            running.result()
        else:
            lifecycle.mark_job_running(execution.engine, execution.identity)
        return True
    except LeaseOwnerMismatch as error:
        log.warning(
            "aborting job before execution because lease ownership was already lost",
            extra=execution.log_fields | {"error": str(error)},
        )
        return False
    except RunledgerError as error:
        _release_after_running_persist_failure(execution, error)
        return False


def _release_after_running_persist_failure(execution: JobExecution, error: RunledgerError) -> None:
    fields = execution.log_fields | {"error": str(error)}
    try:
        lifecycle.release_unstarted_job_claim(
            execution.engine, **execution.identity.keywords(),
            reason=RUNNING_PROGRESS_PERSIST_FAILED_REASON, delay_ms=UNSTARTED_CLAIM_RETRY_DELAY_MS,
        )
    except UnstartedClaimReleaseNotApplicable as release_error:
        log.warning(
            "running progress could not be persisted; unstarted release no longer applies and the job "
            "will continue under the current lease owner",
            extra=fields | {"release_error": str(release_error)},
        )
    except RunledgerError as release_error:
        log.warning(
            "running progress could not be persisted; leaving claim for reaper recovery",
            extra=fields | {"release_error": str(release_error)},
        )
    else:
        log.warning("running progress could not be persisted; released unstarted claim back to pending", extra=fields)


# -- step 3: the handler and its watchdog ----------------------------------------------


def _run_handler(execution: JobExecution) -> Outcome:
    """Call the handler and narrow whatever it does to one Outcome."""
    handler = execution.registry.get(execution.job.job_type)
    if handler is None:
        return JobFailure.terminal(HANDLER_NOT_REGISTERED_CODE, "No handler is registered for this job type.")
    try:
        result = handler.execute(execution.context, execution.job.payload)
    except JobFailure as failure:
        return _unless_abandoned(execution, _recordable(failure))
    except JobCancelled as cancelled:
        return _abandoned_outcome(execution) or _panic(execution, cancelled)
    except BaseException as exc:  # noqa: BLE001 - a handler may raise anything, even SystemExit
        abandoned = _abandoned_outcome(execution)
        if abandoned is not None:
            return abandoned
        if isinstance(exc, execution.registry.retry_on(execution.job.job_type)):
            return JobFailure.retryable(HANDLER_ERROR_CODE, f"{type(exc).__name__}: {exc}")
        if isinstance(exc, execution.registry.transient_errors) or is_transient_error(exc):
            return _transient(execution, exc)
        return _panic(execution, exc)
    return _unless_abandoned(execution, _completion_outcome(result))


def _recordable(failure: JobFailure) -> JobFailure:
    """The handler's failure, or a terminal one when its code cannot be stored.

    The store would refuse the write, and the failure would be lost to a lease
    expiry. (NUL and lone surrogates in the code or message are replaced by the
    store, not refused.)
    """
    try:
        check_failure_code(failure.code)
    except InvalidArgument as error:
        return JobFailure.terminal(
            HANDLER_INVALID_RESULT_CODE, f"Handler raised a JobFailure whose {error.message}: {failure.message}"
        )
    return failure


def _completion_outcome(result: Any) -> Outcome:
    if result is None:
        return JobCompletion()
    if not isinstance(result, JobCompletion):
        return JobFailure.terminal(
            HANDLER_INVALID_RESULT_CODE,
            f"Handler returned {type(result).__name__}; expected None or JobCompletion.",
        )
    # Checked here, not left to the store: a str progress would crash the
    # comparison below, and a non-JSON output would fail the success write and
    # leave the lease to the reaper, which retries the same broken result.
    for name in ("progress_done", "progress_total"):
        value = getattr(result, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return JobFailure.terminal(
                HANDLER_INVALID_RESULT_CODE, f"Handler returned a JobCompletion whose {name} is not an int but a {type(value).__name__}."
            )
    for name in ("checkpoint", "output"):
        try:
            serialize_json(name, getattr(result, name))
        except InvalidPayload as error:
            return JobFailure.terminal(
                HANDLER_INVALID_RESULT_CODE,
                f"Handler returned a JobCompletion whose {name} is not JSON: {error.message}",
            )
    problem = completion_progress_problem(result.progress_done, result.progress_total)
    if problem is not None:
        return JobFailure.terminal(INVALID_COMPLETION_PROGRESS_CODE, problem)
    return result


def _abandoned_outcome(execution: JobExecution) -> Optional[Outcome]:
    """The outcome forced by the watchdog (deadline or lease loss), if it fired."""
    if execution.lease_lost is not None:
        return execution.lease_lost
    if execution.deadline_passed.is_set():
        return timeout_failure()
    return None


def _unless_abandoned(execution: JobExecution, outcome: Outcome) -> Outcome:
    return _abandoned_outcome(execution) or outcome


def _transient(execution: JobExecution, exc: BaseException) -> JobFailure:
    # A database restart is not a bug in the handler: the attempt retries. Only the
    # first line: a SQLAlchemy error goes on with the statement and its parameters.
    summary = f"{type(exc).__name__}: {(_text_of(exc).strip().splitlines() or [''])[0]}"
    log.warning("job handler hit a transient error; the attempt will be retried",
                extra=execution.log_fields | {"error": summary})
    return JobFailure.retryable(HANDLER_TRANSIENT_ERROR_CODE, summary)


def _text_of(exc: BaseException) -> str:
    try:
        return str(exc) or type(exc).__name__
    except Exception:  # noqa: BLE001 - a broken __str__ must not crash the pipeline
        return f"unprintable {type(exc).__name__}"


def _panic(execution: JobExecution, exc: BaseException) -> JobFailure:
    log.error(
        "job handler panicked",
        extra=execution.log_fields | {"traceback": "".join(traceback.format_exception(exc))},
    )
    return JobFailure.panicked(HANDLER_PANIC_CODE, f"Job handler panicked: {_text_of(exc)}")


def _deadline(execution: JobExecution, started: float) -> float:
    return started + max(1, execution.job.timeout_seconds)


def _watch(execution: JobExecution, started: float, next_beat: float) -> None:
    """Renew the lease, enforce the deadline, and after the grace period write the timeout."""
    try:
        _watch_until_done(execution, started, next_beat)
    except Exception as error:  # noqa: BLE001 - logged with the job's fields; the timer goes on
        log.exception("job watch crashed; its lease is no longer renewed",
                      extra=execution.log_fields | {"error": repr(error)})


def _watch_until_done(execution: JobExecution, started: float, next_beat: float) -> None:
    config = execution.config
    interval = config.heartbeat_interval
    deadline = _deadline(execution, started)
    give_up = deadline + config.timeout_grace_seconds
    while True:
        now = time.monotonic()
        wake_at = min(next_beat, give_up if execution.deadline_passed.is_set() else deadline)
        if execution.stop_watchdog.wait(max(0.0, wake_at - now)):
            return
        now = time.monotonic()
        if now >= deadline and not execution.deadline_passed.is_set():
            execution.deadline_passed.set()
            execution.context.request_cancel("timeout")
            log.warning("job exceeded its timeout; cancellation requested", extra=execution.log_fields)
        if execution.deadline_passed.is_set() and now >= give_up:
            if execution.gate.take():
                log.warning(
                    "handler ignored cancellation past its grace period; writing the timeout without it",
                    extra=execution.log_fields | {"grace_seconds": config.timeout_grace_seconds},
                )
                _finish(execution, timeout_failure())
            return
        if now >= next_beat:
            next_beat = now + interval
            if not _heartbeat(execution):
                return


def _renew_lease(execution: JobExecution) -> None:
    """Renew the lease, for no longer than the lease itself lasts by the local clock.

    A renewal sent into a dead network can hang far longer than the lease (no
    reply ever comes and nothing times it out). The lease is gone when its TTL
    has passed whether or not the database said so, so the attempt is treated as
    lost then; the renewal itself is left to finish or fail on its own. Until
    then a lost connection is retried: a database restart shorter than the lease
    costs the attempt nothing.
    """
    sent_at = time.monotonic()
    outcome: dict[str, BaseException] = {}

    retrying = Retrying(
        retry=retry_if_exception_type(ConnectionFailed),
        # No retry that could only land after the lease ran out, nor after the attempt ended.
        stop=stop_before_delay(max(0.0, execution.local_lease_deadline - sent_at))
        | stop_when_event_set(execution.stop_watchdog),
        wait=wait_exponential(multiplier=RENEWAL_RETRY_FIRST_PAUSE_SECONDS, max=RENEWAL_RETRY_MAX_PAUSE_SECONDS),
        sleep=execution.stop_watchdog.wait,
        reraise=True,
    )

    def renew() -> None:
        try:
            retrying(
                lifecycle.heartbeat_job, execution.engine, **execution.identity.keywords(),
                lease_ttl_seconds=execution.config.lease_ttl_seconds,
                lock_timeout_ms=execution.config.heartbeat_lock_timeout_ms,
            )
        except BaseException as error:  # noqa: BLE001 - handed to the watchdog, which decides
            outcome["error"] = error

    renewal = threading.Thread(target=renew, name=f"runledger-renew-{execution.job.id}", daemon=True)
    renewal.start()
    _join_unless_attempt_ended(execution, renewal, execution.local_lease_deadline)
    if execution.stop_watchdog.is_set():
        return  # the attempt ended meanwhile; its outcome, not this renewal, decides
    if renewal.is_alive():
        if not execution.completed_in_transaction:
            # Another worker may claim the job from now on: stop the handler at once,
            # then give the renewal a moment to say why (a row lock released just
            # after expiry answers with the owner mismatch the database decided).
            # _heartbeat replaces this verdict with the final one and logs it.
            execution.lease_verdict_pending.set()
            execution.lease_lost = MAINTENANCE_LOST
            execution.context.request_cancel("lease_lost")
        renewal.join(min(execution.config.heartbeat_interval_seconds, LATE_RENEWAL_ANSWER_SECONDS))
        if renewal.is_alive() or "error" not in outcome:
            raise ConnectionFailed(
                f"no answer to the lease renewal of job {execution.job.id} before its lease ran out")
    if "error" in outcome:
        raise outcome["error"]
    execution.local_lease_deadline = sent_at + execution.config.lease_ttl_seconds


def _join_unless_attempt_ended(execution: JobExecution, renewal: threading.Thread, deadline: float) -> None:
    # A handler that returns while a renewal hangs must not wait for the lease to run out.
    while renewal.is_alive() and not execution.stop_watchdog.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        renewal.join(min(remaining, RENEWAL_JOIN_STEP_SECONDS))


def _heartbeat(execution: JobExecution) -> bool:
    """Renew the lease; on failure mark the attempt lost and ask the handler to stop."""
    try:
        _renew_lease(execution)
        return True
    except RunledgerError as error:
        if execution.completed_in_transaction:
            # Since complete_in the handler's transaction holds the row: a heartbeat
            # waits on its lock, then misses once it commits. Neither is a lost
            # lease, and the lock keeps the attempt safe until the handler returns.
            log.debug("heartbeat skipped: the handler owns the completion",
                      extra=execution.log_fields | {"error": str(error)})
            return True
        if isinstance(error, LeaseOwnerMismatch):
            lost = LeaseLost(LEASE_OWNER_MISMATCH_CODE, "Job lease ownership was lost during processing.")
            reason = "canceled" if _was_canceled(execution) else "lease_lost"
            log.warning("job heartbeat lost lease ownership",
                        extra=execution.log_fields | {"error": str(error), "reason": reason})
        else:
            lost = MAINTENANCE_LOST
            reason = "lease_lost"
            log.warning(
                "aborting job because lease heartbeat could not be persisted",
                extra=execution.log_fields | {"error": str(error)},
            )
    # Lease loss is recorded by where it came from (here), never inferred from a
    # failure code, so a handler's own failure with the same code is persisted.
    execution.lease_lost = lost
    execution.context.request_cancel(reason)
    if execution.gate.take():
        _finish(execution, lost)  # writes nothing; logs which kind of lease loss ended the attempt
    return False


def _was_canceled(execution: JobExecution) -> bool:
    try:
        current = admin.get_job(execution.engine, execution.job.id)
    except RunledgerError:
        return False
    return current is not None and current.status is JobStatus.CANCELED


# -- steps 4-6: the one outcome write ------------------------------------------------


def _finish(execution: JobExecution, outcome: Outcome) -> None:
    if execution.completed_in_transaction and not isinstance(outcome, LeaseLost) and _committed_by_handler(
            execution, outcome):
        execution.decided = Succeed(JobCompletion())
        return
    _apply(execution, _decide(execution, outcome))


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
    try:
        current = admin.get_job(execution.engine, execution.job.id)
    except RunledgerError as error:
        log.warning("could not read back the handler's own completion; writing its outcome",
                    extra=execution.log_fields | {"error": str(error)})
        return False
    same_attempt = current is not None and (current.run_number, current.attempt) == (
        execution.identity.run_number, execution.identity.attempt)
    if not (same_attempt and current.status is JobStatus.SUCCEEDED):
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
        _write_success(execution, completion)
    except InvalidCompletionProgress as error:
        log.warning("handler returned invalid success completion; marking job terminal",
                    extra=execution.log_fields | {"failure_code": error.code})
        _apply(execution, _decide(execution, JobFailure.terminal(INVALID_COMPLETION_PROGRESS_CODE, error.message)))
    except WorkflowReleaseConflict as error:
        log.warning("job success completion conflicted with workflow cancellation; leaving lease for reaper recovery",
                    extra=execution.log_fields | {"error": str(error)})
    except RunledgerError as error:
        log.error("failed to mark job success", extra=execution.log_fields | {"error": str(error)})


def _write_success(execution: JobExecution, completion: JobCompletion) -> None:
    if execution.writers is not None:
        try:
            execution.writers.success.submit((execution.identity, completion))
            return
        except LeaseOwnerMismatch:
            raise
        except CommitOutcomeUnknown:
            if _landed(execution) is not None:
                return
        except RunledgerError as error:
            # The group failed as a whole (another job's invalid progress, a lost
            # connection): this job's own write decides its outcome.
            log.debug("group success write failed; writing the job alone",
                      extra=execution.log_fields | {"error": str(error)})
    _write(execution, lambda: lifecycle.complete_job_success(
        execution.engine, **execution.identity.keywords(), completion=completion))


def _complete_failure(execution: JobExecution, transition: Retry | DeadLetter) -> None:
    job, failure = execution.job, transition.failure
    delay = transition.delay_ms if isinstance(transition, Retry) else None
    try:
        stored = _write(execution, lambda: lifecycle.complete_job_failure(
            execution.engine, **execution.identity.keywords(), failure=failure, retry_delay_ms=delay))
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


def _write(execution: JobExecution, write: Callable[[], JobRecord]) -> JobRecord:
    """Run an outcome write, riding out a database restart within a bounded budget.

    A lost connection is retried; an unknown commit outcome is re-checked by
    reading the row, because repeating a write that landed would be refused by
    the fence and look like a lost lease.
    """
    give_up = time.monotonic() + min(OUTCOME_WRITE_BUDGET_SECONDS, execution.config.lease_ttl_seconds)
    while True:
        try:
            return write()
        except CommitOutcomeUnknown:
            landed = _landed(execution)
            if landed is not None:
                return landed
        except ConnectionFailed:
            if time.monotonic() >= give_up:
                raise
        if time.monotonic() >= give_up:
            raise ConnectionFailed("the outcome could not be written before the retry budget ran out")
        time.sleep(0.2)


def _landed(execution: JobExecution) -> Optional[JobRecord]:
    try:
        current = admin.get_job(execution.engine, execution.job.id)
    except RunledgerError:
        return None
    same_attempt = current is not None and (current.run_number, current.attempt) == (
        execution.identity.run_number, execution.identity.attempt)
    if same_attempt and current.status is not JobStatus.LEASED:
        return current
    return None
