"""One attempt's state, shared by the pool thread that runs it and the timer thread that watches it."""

from __future__ import annotations

import logging
import threading
import time
from functools import cached_property
from typing import Any, Callable, Optional, cast
from uuid import UUID

from sqlalchemy.engine import Engine

from runledger_sync.config import JobsConfig
from runledger_sync.core.errors import InvalidArgument, LeaseOwnerMismatch
from runledger_sync.core.outcomes import (
    LEASE_OWNER_MISMATCH_CODE,
    Canceled,
    Continue,
    LeaseLost,
    Retry,
    Succeed,
    Transition,
)
from runledger_sync.core.flag import Flag
from runledger_sync.core.records import JobRecord, LeaseIdentity
from runledger_sync.core.workflow import WorkflowContext
from runledger_sync.core.types import (
    JobCompletion,
    JobContext,
)
from runledger_sync.core.workflow_errors import WorkflowReleaseConflict
from runledger_sync.logging import JOB_LINES_LOGGER_NAME, get_logger, job_log_fields
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.attempt.completer import Completer
from runledger_sync.runtime.worker.tally import OutcomeTally
from runledger_sync.store import driver

log = get_logger(__name__)
#: One INFO line per finished job, off unless logging asks for it (see runledger_sync.logging).
job_lines = get_logger(JOB_LINES_LOGGER_NAME)

UNKNOWN_WORKER_ID = "unknown-worker"


class OutcomeGate:
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


def outcome_fields(transition: Optional[Transition]) -> dict[str, Any]:
    """How the attempt ended, for its closing log line (never the payload or the output)."""
    if transition is None:
        return {"outcome": "undecided"}
    if isinstance(transition, LeaseLost):
        return {"outcome": "lease_lost", "failure_code": transition.code}
    if isinstance(transition, Canceled):
        return {"outcome": "canceled"}
    if isinstance(transition, Succeed):
        return {"outcome": "succeeded"}
    if isinstance(transition, Continue):
        return {"outcome": "continued"}
    failure = transition.failure
    ended = "retry_scheduled" if isinstance(transition, Retry) else "dead_lettered"
    return {"outcome": ended, "failure_kind": failure.kind.value, "failure_code": failure.code}


def _on_a_thread_of_its_own(work: Callable[[], None]) -> None:
    threading.Thread(target=work, name="runledger-follow-up", daemon=True).start()


def lease_identity(job: JobRecord) -> LeaseIdentity:
    """The lease a claimed job runs under: every write of the attempt is fenced by it."""
    return LeaseIdentity(job.id, job.run_number, job.attempt, job.worker_id or UNKNOWN_WORKER_ID)


class JobExecution:
    """Everything one claimed job needs while it runs."""

    def __init__(
        self, engine: Engine, registry: JobRegistry, job: JobRecord, config: JobsConfig,
        completer: Optional[Completer], *, tally: Optional[OutcomeTally] = None,
        on_ended: Optional[Callable[[], None]] = None, hand_back: Optional[Callable[[Callable[[], None]], None]] = None,
    ) -> None:
        self.started = time.monotonic()
        self.engine = engine
        self._completer = completer
        #: Told of failed lease renewals; None when metrics are off.
        self.observer = tally.observer if tally is not None else None
        #: How long the handler ran, once it has returned.
        self.handler_seconds: Optional[float] = None
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
            workflow=None if job.workflow_step_id is None else self._workflow_context(job.workflow_step_id),
            meta=job.meta,
            _progress_reporter=self._report_progress,
            _completer=self._complete_in,
        )
        self.gate = OutcomeGate()
        self.stop_watchdog = Flag()
        self.deadline_passed = Flag()
        self.lease_lost: Optional[LeaseLost] = None
        #: Set when an operator canceled the job while it ran (see runtime.cancels).
        self.canceled: Optional[Canceled] = None
        #: Set when the worker's shutdown told the handler to stop (its lease still holds).
        self.interrupted = False
        #: Set when the lease ran out by the local clock with a renewal still unanswered.
        self.lease_verdict_pending = Flag()
        #: When the lease runs out by this process's clock, at the latest: TTL after
        #: the last renewal was sent (the claim for the first one, a little before this).
        self.local_lease_deadline = time.monotonic() + config.lease_ttl_seconds
        #: Set once the handler wrote its success in its own transaction (complete_in).
        self.completed_in_transaction = False
        #: The transition the attempt ended with, once one was decided (by the handler or the watch).
        self.decided: Optional[Transition] = None
        self._tally = tally
        self._on_ended = on_ended
        self._ended = False
        #: Runs a follow-up write on a pool thread.
        self.hand_back = hand_back or _on_a_thread_of_its_own

    def end(self, outcome: Optional[str] = None) -> None:
        """The attempt is over: count it, log it (INFO on the job-lines logger, DEBUG here), and give its slot back.

        Only the first call counts.
        """
        if self._ended:
            return
        self._ended = True
        ended = {"outcome": outcome} if outcome is not None else outcome_fields(self.decided)
        if self._tally is not None:
            self._tally.count(ended["outcome"], self.job.job_type, self.handler_seconds)
        if job_lines.isEnabledFor(logging.INFO):
            job = self.job
            elapsed_ms = int((time.monotonic() - self.started) * 1000)
            code = f" {ended['failure_code']}" if "failure_code" in ended else ""
            job_lines.info(f"job {job.job_type} {job.id} {ended['outcome']}{code} (attempt {job.attempt}, "
                           f"{elapsed_ms} ms)", extra=self.log_fields | ended | {"elapsed_ms": elapsed_ms})
        if log.isEnabledFor(logging.DEBUG):
            log.debug("job processed", extra=self.log_fields | ended | {
                "elapsed_ms": int((time.monotonic() - self.started) * 1000)})
        if self._on_ended is not None:
            self._on_ended()

    def interrupt(self) -> None:
        """Ask the handler to stop for the worker's shutdown.

        A handler that stops because it was told to (``JobCancelled``) is queued again
        without spending an attempt; whatever else it ends with is its outcome as usual.
        """
        self.interrupted = True
        self.context.request_cancel("shutdown")

    @cached_property
    def completer(self) -> Completer:
        """The worker's completer; without one, this attempt's outcome is written at once on the deciding thread."""
        if self._completer is not None:
            return self._completer
        return Completer(self.engine, "runledger-completer", max_output_bytes=self.config.max_output_bytes,
                         max_checkpoint_bytes=self.config.max_payload_bytes,
                         threaded=False)

    @cached_property
    def log_fields(self) -> dict[str, Any]:
        """The attempt's identity for its log lines (built on first use: most jobs log nothing)."""
        job = self.job
        return job_log_fields(
            job_id=job.id, job_type=job.job_type, run_number=job.run_number, attempt=job.attempt,
            organization_id=job.organization_id, worker_id=self.identity.worker_id,
        )

    def _workflow_context(self, step_id: UUID) -> WorkflowContext:
        # Read when the handler first asks, so a step that never looks pays no query.
        return WorkflowContext(
            step_id,
            lambda step: driver.load_step(self.engine, step),
            lambda run_id, key: driver.step_output(self.engine, run_id, key),
        )

    def _report_progress(self, context: JobContext, done: Optional[int], total: Optional[int], checkpoint: Any) -> None:
        driver.update_job_progress(
            self.engine, **self.identity.keywords(), progress_done=done, progress_total=total, checkpoint=checkpoint,
            max_checkpoint_bytes=self.config.max_payload_bytes,
        )

    def _complete_in(self, context: JobContext, bind: Any, completion: Optional[JobCompletion]) -> JobRecord:
        if self.lease_lost is not None or self.canceled is not None:
            raise LeaseOwnerMismatch(
                f"job {self.job.id} was canceled or lost its lease before the handler completed it",
                job_id=str(self.job.id),
            )
        # Past the deadline the attempt is a timeout; a success now would contradict it.
        context.check_cancelled()
        if completion is not None and completion.continue_after is not None:
            raise InvalidArgument("completion", "continue_after", "a JobCompletion without continue_after "
                                  "(return a continuation from the handler instead)")
        [refused] = driver.apply_transitions(bind, [(self.identity, Succeed(completion or JobCompletion()))],
                                             max_output_bytes=self.config.max_output_bytes,
                                             max_checkpoint_bytes=self.config.max_payload_bytes)
        if isinstance(refused, LeaseOwnerMismatch):
            # The fence refused the write, so the lease is gone: end the attempt as a
            # lost lease (nothing written, the reaper recovers it), as a heartbeat would.
            self.lease_lost = LeaseLost(LEASE_OWNER_MISMATCH_CODE, "Job lease ownership was lost during processing.")
            context.request_cancel("lease_lost")
            raise refused
        if isinstance(refused, WorkflowReleaseConflict):
            # The step's run is being cancelled: write nothing for the attempt and
            # leave the lease, which the reaper finishes once the cancel committed.
            self.lease_lost = LeaseLost(refused.code, refused.message)
            raise refused
        # The row as the handler's transaction now sees it, which the caller is promised
        # (never None: this transaction holds the row it just wrote).
        record = cast(JobRecord, driver.get_job(bind, self.job.id))
        self.completed_in_transaction = True
        return record
