"""One attempt: its phase, who decided its outcome, and why its handler was told to stop, behind one lock.

Three threads touch an attempt: the pool thread that runs it, the watch on
that thread's timer (renewals, the deadline), and the polling thread (an
operator's cancel its listener heard, and its drain at shutdown); the
completer's thread ends it once its outcome is durable. Each moves it only
through the methods below, under the attempt's one lock:

    STARTING --running write landed--> RUNNING --take(by)--> DECIDED --end()--> ENDED
        \\--------------------------- take(by) / end("not_started") ----------------/

Exactly one of them takes the attempt's outcome (:meth:`Attempt.take`); the
others' results are discarded. Beside the phase, the attempt keeps what forced
it to stop (an operator's cancel, a lost lease, the deadline, the worker's
shutdown: :meth:`Attempt.forced_outcome`), which decides what the handler's return or
exception means, whoever takes the outcome.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from functools import cached_property
from typing import Any, Callable, Iterator, Optional, cast
from uuid import UUID


from runledger_sync.config import JobsConfig
from runledger_sync.core.errors import InvalidArgument, LeaseOwnerMismatch
from runledger_sync.core.outcomes import (
    LEASE_OWNER_MISMATCH_CODE,
    Canceled,
    LeaseLost,
    Outcome,
    Succeed,
    Transition,
    timeout_failure,
)
from runledger_sync.core.records import JobRecord, LeaseIdentity
from runledger_sync.core.types import JobCompletion, JobContext
from runledger_sync.core.workflow import WorkflowAppend, WorkflowContext, WorkflowRunRecord
from runledger_sync.core.workflow_errors import WorkflowReleaseConflict
from runledger_sync.logging import JOB_LINES_LOGGER_NAME, get_logger, job_log_fields
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.attempt.completer import Completer
from runledger_sync.runtime.worker.tally import OutcomeTally
from runledger_sync.store.driver import Driver, driver_for

log = get_logger(__name__)
#: One INFO line per finished job, off unless logging asks for it (see runledger_sync.logging).
job_lines = get_logger(JOB_LINES_LOGGER_NAME)

UNKNOWN_WORKER_ID = "unknown-worker"


class Phase(enum.Enum):
    STARTING = "starting"  # claimed; the handler has not started
    RUNNING = "running"  # the handler runs; the watch renews the lease
    DECIDED = "decided"  # one outcome was taken; it is being written, or nothing is to be
    ENDED = "ended"  # counted, logged, slot given back


class Decider(enum.Enum):
    """Who took the attempt's one outcome."""

    HANDLER = "handler"  # the pool thread, with what the handler returned or raised
    WATCH = "watch"  # the deadline's grace ran out, or the lease was lost
    CANCEL = "cancel"  # an operator's cancel
    DRAIN = "drain"  # the worker's drain left a handler that ignored its stop
    ABANDONED = "abandoned"  # the run ended with no outcome taken (it crashed): nothing is written, the lease runs out


def outcome_fields(transition: Optional[Transition]) -> dict[str, Any]:
    """How the attempt ended, for its closing log line (never the payload or the output)."""
    return {"outcome": "undecided"} if transition is None else transition.log_fields()


def lease_identity(job: JobRecord) -> LeaseIdentity:
    """The lease a claimed job runs under: every write of the attempt is fenced by it."""
    return LeaseIdentity(job.id, job.run_number, job.attempt, job.worker_id or UNKNOWN_WORKER_ID)


class Attempt:
    """Everything one claimed job needs while it runs, and where it is (see the module docstring)."""

    def __init__(
        self, driver: Driver, registry: JobRegistry, job: JobRecord, config: JobsConfig,
        completer: Optional[Completer], *, tally: Optional[OutcomeTally] = None,
        on_ended: Optional[Callable[[], None]] = None,
    ) -> None:
        self.started = time.monotonic()
        self.driver = driver
        self._completer = completer
        #: Told of failed lease renewals; None when metrics are off.
        self.observer = tally.observer if tally is not None else None
        #: How long the handler ran, once it has returned.
        self.handler_seconds: Optional[float] = None
        self.registry = registry
        self.job = job
        self.config = config
        self.identity = lease_identity(job)
        self.context = JobContext(
            job_id=job.id,
            run_number=job.run_number,
            attempt=job.attempt,
            organization_id=job.organization_id,
            worker_id=self.identity.worker_id,
            job_type=job.job_type,
            checkpoint=job.checkpoint,
            workflow=None if job.workflow_step_id is None else self._workflow_context(job.workflow_step_id),
            meta=job.meta,
            batch_id=job.batch_id,
            _progress_reporter=self._report_progress,
            _completer=self._complete_in,
        )
        #: When the lease runs out by this process's clock, at the latest: TTL after
        #: the last renewal was sent (the claim for the first one, a little before this).
        self.local_lease_deadline = time.monotonic() + config.lease_ttl_seconds
        self._tally = tally
        self._on_ended = on_ended
        self._lock = threading.Lock()
        self._phase = Phase.STARTING
        self._decided_by: Optional[Decider] = None
        #: Made by the first wait (most attempts end before their watch ever sleeps); set once decided or ended.
        self._decided_event: Optional[threading.Event] = None
        self._canceled: Optional[Canceled] = None
        self._lease_lost: Optional[LeaseLost] = None
        self._deadline_passed = False
        self._interrupted = False
        self._verdict_pending = False
        self._completed_in_transaction = False
        self._ended_with: Optional[Transition] = None

    # -- the phase -----------------------------------------------------------------

    def begin_running(self) -> None:
        """The running write landed: the handler starts now."""
        with self._lock:
            if self._phase is Phase.STARTING:
                self._phase = Phase.RUNNING

    def take(self, by: Decider) -> bool:
        """Take the attempt's one outcome for ``by``; False when another already took it (then ``by``'s is discarded)."""
        with self._lock:
            if self._decided_by is not None or self._phase is Phase.ENDED:
                return False
            self._decided_by, self._phase = by, Phase.DECIDED
            event = self._decided_event
        if event is not None:
            event.set()
        return True

    def wait_decided(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` unless the attempt's outcome is taken meanwhile; True once it is."""
        with self._lock:
            if self.is_decided:
                return True
            if self._decided_event is None:
                self._decided_event = threading.Event()
            event = self._decided_event
        return event.wait(seconds)

    @property
    def is_decided(self) -> bool:
        """True once the outcome is taken (or the attempt ended without one)."""
        return self._decided_by is not None or self._phase is Phase.ENDED

    def ended_with(self, transition: Transition) -> None:
        """Record the transition the attempt ended with (written, or nothing to write), for its closing line."""
        self._ended_with = transition

    # -- what forced the handler to stop --------------------------------------------

    def cancel(self, canceled: Canceled) -> None:
        """An operator canceled the job: the strongest reason to stop (the cancel wrote the job's end)."""
        with self._lock:
            self._canceled = canceled
        self.context.request_cancel(canceled.reason)

    def lose_lease(self, lost: LeaseLost, *, verdict_pending: bool = False) -> None:
        """The lease is gone (or, with ``verdict_pending``, ran out by the local clock with a renewal unanswered)."""
        with self._lock:
            self._lease_lost = lost
            self._verdict_pending = self._verdict_pending or verdict_pending
        self.context.request_cancel("lease_lost")

    def pass_deadline(self) -> None:
        """The handler's time is up: told to stop; if it then stops, or its grace runs out, it is a timeout."""
        with self._lock:
            self._deadline_passed = True
        self.context.request_cancel("timeout")

    def interrupt(self) -> None:
        """Ask the handler to stop for the worker's shutdown.

        A handler that stops because it was told to (``JobCancelled``) is queued again
        without spending an attempt; whatever else it ends with is its outcome as usual.
        """
        with self._lock:
            self._interrupted = True
        self.context.request_cancel("shutdown")

    def forced_outcome(self) -> Optional[Outcome]:
        """The outcome forced on the attempt, strongest first (a cancel, a lost lease, the deadline), if any was."""
        with self._lock:
            if self._canceled is not None:
                return self._canceled
            if self._lease_lost is not None:
                return self._lease_lost
            return timeout_failure() if self._deadline_passed else None

    @property
    def canceled(self) -> Optional[Canceled]:
        return self._canceled

    @property
    def lease_lost(self) -> Optional[LeaseLost]:
        return self._lease_lost

    @property
    def deadline_passed(self) -> bool:
        return self._deadline_passed

    @property
    def interrupted(self) -> bool:
        return self._interrupted

    @property
    def verdict_pending(self) -> bool:
        """The lease ran out by the local clock with a renewal unanswered: the watch logs the verdict once it has one."""
        return self._verdict_pending

    @property
    def completed_in_transaction(self) -> bool:
        """The handler wrote its success in its own transaction (``ctx.complete_in``)."""
        return self._completed_in_transaction

    # -- the end ---------------------------------------------------------------------

    def end(self, outcome: Optional[str] = None) -> None:
        """The attempt is over: count it, log it (INFO on the job-lines logger, DEBUG here), and give its slot back.

        Only the first call counts.
        """
        with self._lock:
            if self._phase is Phase.ENDED:
                return
            self._phase = Phase.ENDED
            event = self._decided_event
        if event is not None:
            event.set()
        ended = {"outcome": outcome} if outcome is not None else outcome_fields(self._ended_with)
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

    @cached_property
    def completer(self) -> Completer:
        """The worker's completer; without one, this attempt's outcome is written at once on the deciding thread."""
        if self._completer is not None:
            return self._completer
        return Completer(self.driver, "runledger-completer", max_output_bytes=self.config.max_output_bytes,
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
            self.driver.load_step,
            self.driver.step_output,
            self._append_workflow_steps,
        )

    def _append_workflow_steps(self, run_id: UUID, more: WorkflowAppend, *, mutation_key: str, bind: Any,
                               max_payload_bytes: int) -> WorkflowRunRecord:
        # In the handler's transaction when it names one (the one it completes in), else on the worker's own.
        driver = self.driver if bind is None else driver_for(bind)
        return driver.append_workflow_steps(run_id, more, mutation_key=mutation_key, max_payload_bytes=max_payload_bytes)

    def _report_progress(self, context: JobContext, done: Optional[int], total: Optional[int], checkpoint: Any) -> None:
        self.driver.update_job_progress(
            **self.identity.keywords(), progress_done=done, progress_total=total, checkpoint=checkpoint,
            max_checkpoint_bytes=self.config.max_payload_bytes,
        )

    def _complete_in(self, context: JobContext, bind: Any, completion: Optional[JobCompletion]) -> JobRecord:
        if self._lease_lost is not None or self._canceled is not None:
            raise LeaseOwnerMismatch(
                f"job {self.job.id} was canceled or lost its lease before the handler completed it",
                job_id=str(self.job.id),
            )
        # Past the deadline the attempt is a timeout; a success now would contradict it.
        context.check_cancelled()
        if completion is not None and completion.continue_after is not None:
            raise InvalidArgument("completion", "continue_after", "a JobCompletion without continue_after "
                                  "(return a continuation from the handler instead)")
        handlers_transaction = driver_for(bind)
        [refused] = handlers_transaction.apply_transitions([(self.identity, Succeed(completion or JobCompletion()))],
                                             max_output_bytes=self.config.max_output_bytes,
                                             max_checkpoint_bytes=self.config.max_payload_bytes)
        if isinstance(refused, LeaseOwnerMismatch):
            # The fence refused the write, so the lease is gone: end the attempt as a
            # lost lease (nothing written, the reaper recovers it), as a heartbeat would.
            self.lose_lease(LeaseLost(LEASE_OWNER_MISMATCH_CODE, "Job lease ownership was lost during processing."))
            raise refused
        if isinstance(refused, WorkflowReleaseConflict):
            # The step's run is being cancelled: write nothing for the attempt and
            # leave the lease, which the reaper finishes once the cancel committed.
            with self._lock:
                self._lease_lost = LeaseLost(refused.code, refused.message)
            raise refused
        # The row as the handler's transaction now sees it, which the caller is promised
        # (never None: this transaction holds the row it just wrote).
        record = cast(JobRecord, handlers_transaction.get_job(self.job.id))
        self._completed_in_transaction = True
        return record


class RunningHandlers:
    """The attempts whose handler is running now, by job id.

    The worker adds each attempt just before its handler starts and removes it
    when the handler returns. A cancel's notification finds the attempt here;
    the worker's drain tells every one of them to stop. One job id may name two
    attempts for a moment: a handler left running after its lease was lost, and
    the job's next attempt on this same worker.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_job: dict[UUID, list[Attempt]] = {}

    def add(self, attempt: Attempt) -> None:
        with self._lock:
            self._by_job.setdefault(attempt.job.id, []).append(attempt)

    def discard(self, attempt: Attempt) -> None:
        with self._lock:
            running = self._by_job.get(attempt.job.id)
            if running is not None and attempt in running:
                running.remove(attempt)
                if not running:
                    del self._by_job[attempt.job.id]

    def __iter__(self) -> Iterator[Attempt]:
        with self._lock:
            snapshot = [attempt for running in self._by_job.values() for attempt in running]
        return iter(snapshot)

    def of_job(self, job_id: UUID) -> list[Attempt]:
        with self._lock:
            return list(self._by_job.get(job_id, ()))
