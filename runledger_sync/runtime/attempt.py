"""One attempt's state, shared by the pool thread that runs it and the timer thread that watches it."""

from __future__ import annotations

import threading
import time
from typing import Any, Optional
from uuid import UUID

from sqlalchemy.engine import Engine

from runledger_sync.config import JobsConfig
from runledger_sync.core.errors import (
    LeaseOwnerMismatch,
    WorkflowReleaseConflict,
)
from runledger_sync.core.outcomes import (
    LEASE_OWNER_MISMATCH_CODE,
    LeaseLost,
    Transition,
)
from runledger_sync.core.records import JobRecord
from runledger_sync.core.workflow import WorkflowContext
from runledger_sync.core.types import (
    JobCompletion,
    JobContext,
)
from runledger_sync.logging import get_logger, job_log_fields
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.hot_path import HotPathWriters
from runledger_sync.store import lifecycle, workflows

log = get_logger(__name__)

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
            workflow=None if job.workflow_step_id is None else self._workflow_context(job.workflow_step_id),
            _progress_reporter=self._report_progress,
            _completer=self._complete_in,
        )
        self.log_fields = job_log_fields(
            job_id=job.id, job_type=job.job_type, run_number=job.run_number, attempt=job.attempt,
            organization_id=job.organization_id, worker_id=worker_id,
        )
        self.gate = OutcomeGate()
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

    def _workflow_context(self, step_id: UUID) -> WorkflowContext:
        # Read when the handler first asks, so a step that never looks pays no query.
        return WorkflowContext(
            step_id,
            lambda step: workflows.load_step(self.engine, step),
            lambda run_id, key: workflows.step_output(self.engine, run_id, key),
        )

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
        except WorkflowReleaseConflict as conflict:
            # The step's run is being cancelled: write nothing for the attempt and
            # leave the lease, which the reaper finishes once the cancel committed.
            self.lease_lost = LeaseLost(conflict.code, conflict.message)
            raise
        self.completed_in_transaction = True
        return record
