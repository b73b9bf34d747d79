"""Work jobs in the test's own process: :func:`drain` runs every due job, :func:`run_job` one job.

Both take the worker's own path, step by step on the calling thread: the
worker's claim (a prestart claim, as a worker polling on one connection makes
it), the running write, the handler under its heartbeat and deadline watch, and
the one outcome write, with the retry rule, the dead-letter hook and a
workflow step's release of its dependents. Only the threads differ: one job at
a time, in claim order, on the caller's thread, so a breakpoint in a handler
stops the test itself. A handler's exception is recorded as the worker records
it (the job's ``last_error_code``, the attempt's traceback), never raised to the test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence
from uuid import UUID

from sqlalchemy.engine import Engine

from runledger_sync.config import JobsConfig, generate_worker_id
from runledger_sync.core import validation as check
from runledger_sync.core.errors import InvalidArgument, InvalidStateTransition, JobNotFound
from runledger_sync.core.records import JobRecord
from runledger_sync.core.types import JobFailure
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.attempt.run import process_claimed_job
from runledger_sync.runtime.worker.tally import OutcomeTally
from runledger_sync.runtime.attempt.watch import TimerThread
from runledger_sync.store.admin.actions import make_jobs_due
from runledger_sync.store.admin.jobs import get_job
from runledger_sync.store.driver import driver_for
from runledger_sync.store.enqueue.enqueue import enqueue
from runledger_sync.store.queues import explain_wait

#: The runtime's outcome names that read differently in a drain's summary.
_OUTCOME_NAMES = {"retry_scheduled": "retried"}
#: A drain's worker id starts so: the attempts it leaves behind say a test ran them.
WORKER_ID_PREFIX = "testing-"


@dataclass(frozen=True)
class DrainedJob:
    """One attempt a drain ran: the job and how its attempt ended."""

    id: UUID
    job_type: str
    #: ``succeeded``, ``retried``, ``dead_lettered``; or, rarely, ``canceled``, ``lease_lost``,
    #: ``not_started`` or ``undecided`` (the worker's own outcome names).
    outcome: str


@dataclass(frozen=True)
class DrainResult:
    """What :func:`drain` ran, in the order it ran it (a job retried within the drain appears once per attempt)."""

    jobs: tuple[DrainedJob, ...] = ()

    @property
    def by_outcome(self) -> dict[str, int]:
        """How many attempts ended each way, e.g. ``{"succeeded": 3, "retried": 1}``."""
        counts: dict[str, int] = {}
        for job in self.jobs:
            counts[job.outcome] = counts.get(job.outcome, 0) + 1
        return counts

    @property
    def succeeded(self) -> int:
        """How many attempts succeeded."""
        return self.by_outcome.get("succeeded", 0)

    @property
    def retried(self) -> int:
        """How many attempts failed with a retry scheduled."""
        return self.by_outcome.get("retried", 0)

    @property
    def dead_lettered(self) -> int:
        """How many attempts ended their job in the dead-letter state."""
        return self.by_outcome.get("dead_lettered", 0)

    def ids(self, outcome: Optional[str] = None) -> list[UUID]:
        """The ids of the attempts that ended with ``outcome`` (None: every attempt), in the order they ran."""
        return [job.id for job in self.jobs if outcome is None or job.outcome == outcome]

    def __len__(self) -> int:
        return len(self.jobs)


class _Outcomes:
    """The observer a drain hands the worker's tally: it keeps how each attempt ended.

    The worker's other reports (claims, group writes, renewals) mean nothing to a drain.
    """

    def __init__(self) -> None:
        self.ended: list[str] = []
        #: A Ctrl-C that reached the handler: the worker records it as a panic, and the drain then stops with it.
        self.interrupt: Optional[KeyboardInterrupt] = None

    def claimed(self, jobs: Sequence[JobRecord]) -> None:
        pass

    def job_finished(self, job_type: str, outcome: str, handler_seconds: Optional[float]) -> None:
        self.ended.append(_OUTCOME_NAMES.get(outcome, outcome))

    def group_written(self, writer: str, size: int, seconds: float) -> None:
        pass

    def heartbeat_failed(self, job_type: str) -> None:
        pass

    def attempt_failed(self, job_type: str, failure: JobFailure, exception: Optional[BaseException]) -> None:
        if isinstance(exception, KeyboardInterrupt):
            self.interrupt = exception


class _InProcessWorker:
    """The worker's claim and attempt, one job at a time on the calling thread."""

    def __init__(self, engine: Engine, registry: JobRegistry) -> None:
        self.engine = engine
        self.driver = driver_for(engine)
        self.registry = registry
        self.config = JobsConfig(worker_id=WORKER_ID_PREFIX + generate_worker_id())
        self.outcomes = _Outcomes()
        self.tally = OutcomeTally(self.config.worker_id, self.outcomes)
        self.timer = TimerThread("runledger-testing-heartbeat")

    def claim(self, job_ids: Optional[Sequence[UUID]] = None) -> Optional[JobRecord]:
        """Lease the next due job of a registered type (or of ``job_ids``), or None when none is due."""
        types = self.registry.registered_types()
        if not types:
            return None
        claimed = self.driver.claim_prestart_jobs_for_types(
            worker_id=self.config.worker_id, lease_ttl_seconds=self.config.lease_ttl_seconds, limit=1,
            job_types=types, event_log=self.config.event_log, job_ids=job_ids,
        )
        return claimed[0] if claimed else None

    def work(self, job: JobRecord) -> DrainedJob:
        """Run the claimed job's attempt to its written outcome.

        Raises:
            KeyboardInterrupt: the handler was interrupted (Ctrl-C reaches the calling
                thread, which a worker's pool threads never are); its attempt is written first.
        """
        process_claimed_job(self.driver, self.registry, job, self.config, None, timer=self.timer, tally=self.tally)
        interrupt, self.outcomes.interrupt = self.outcomes.interrupt, None
        if interrupt is not None:
            raise interrupt
        return DrainedJob(job.id, job.job_type, self.outcomes.ended.pop())

    def close(self) -> None:
        self.timer.close()


def drain(
    engine: Engine, registry: JobRegistry, *, include_scheduled: bool = False, max_jobs: Optional[int] = None,
) -> DrainResult:
    """Run every due job of the registry's types, and the jobs they enqueue, until none is due.

    Jobs run one at a time on the calling thread, through the worker's own claim
    and outcome writes (see the module docstring), so what a test sees after a
    drain is what a worker would have left: retries scheduled, dead letters with
    their hooks run, a workflow's next steps released and then run too. Flow
    control holds as it does for a worker: a job in a paused queue, behind a busy
    concurrency key or over a rate limit stays where it is. Jobs of types the
    registry has no handler for are left alone.

    Args:
        include_scheduled: also run jobs whose ``next_run_at`` is still ahead
            (retries waiting out their backoff, delayed jobs). Whenever nothing is
            due, the jobs due first are brought forward to now (their
            ``next_run_at`` is rewritten), so they run in the order time would
            have brought them. A job that fails retryably then runs until it
            succeeds or is dead-lettered. A job that enqueues itself again and
            again never lets the drain end: bound it with ``max_jobs``.
        max_jobs: stop after this many attempts (None: no bound).

    Returns:
        Each attempt run and how it ended; ``result.by_outcome`` counts them.

    Raises:
        InvalidArgument: ``max_jobs`` is not a positive int.

    Example:
        ``assert testing.drain(engine, registry).by_outcome == {"succeeded": 2}``
    """
    if max_jobs is not None:
        check.check_int("max_jobs", max_jobs, (1, 2**31 - 1))
    worker = _InProcessWorker(engine, registry)
    ran: list[DrainedJob] = []
    try:
        while max_jobs is None or len(ran) < max_jobs:
            job = worker.claim()
            if job is None:
                if include_scheduled and make_jobs_due(engine, job_types=registry.registered_types()):
                    continue
                break
            ran.append(worker.work(job))
    finally:
        worker.close()
    return DrainResult(tuple(ran))


def run_job(engine: Engine, registry: JobRegistry, job_type: str, payload: Any = None, **enqueue_options: Any) -> JobRecord:
    """Enqueue one job and work it now, on the calling thread; return its record once its attempt has ended.

    Only this job runs: others already due stay due, and the jobs its handler
    enqueues wait for :func:`drain`. It runs at once even when ``run_at`` or
    ``delay_seconds`` says later. One attempt: a retryable failure leaves the job
    PENDING with its retry scheduled (``last_error_code`` says why).

    Args:
        payload: the job's payload, as for :func:`runledger_sync.enqueue`.
        enqueue_options: passed to :func:`runledger_sync.enqueue` (``priority``,
            ``max_attempts``, ``queue``, ``concurrency_key``, ...).

    Raises:
        InvalidArgument: the registry has no handler for ``job_type``.
        InvalidStateTransition: the job cannot be claimed now (its queue is paused,
            its concurrency key busy, its queue's rate limit spent, or an
            idempotency key returned a job that already ran); the message says which.

    Example:
        ``assert testing.run_job(engine, registry, "email.send", {"to": "a@b.c"}).status is rl.JobStatus.SUCCEEDED``
    """
    if registry.get(job_type) is None:
        registered = ", ".join(registry.registered_types()) or "none"
        raise InvalidArgument("job_type", job_type, f"a type the registry has a handler for (registered: {registered})")
    job = enqueue(engine, job_type, payload, **enqueue_options)
    make_jobs_due(engine, job_ids=[job.id])
    worker = _InProcessWorker(engine, registry)
    try:
        claimed = worker.claim(job_ids=[job.id])
        if claimed is None:
            raise _not_runnable(engine, job)
        worker.work(claimed)
    finally:
        worker.close()
    return _read(engine, job.id)


def _read(engine: Engine, job_id: UUID) -> JobRecord:
    found = get_job(engine, job_id)
    if found is None:  # deleted meanwhile (retention, or the test itself)
        raise JobNotFound(f"job {job_id} was not found", job_id=str(job_id))
    return found


def _not_runnable(engine: Engine, job: JobRecord) -> InvalidStateTransition:
    wait = explain_wait(engine, job.id)
    status = _read(engine, job.id).status
    why = wait.message if wait is not None else f"it is {status.value}, not PENDING"
    return InvalidStateTransition(f"job {job.id} ({job.job_type}) cannot run now: {why}",
                                  job_id=str(job.id), status=status.value)
