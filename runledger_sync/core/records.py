"""Read-only snapshots of rows, as the store returns them."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal, Mapping, Optional, Sequence, Union
from uuid import UUID

from runledger_sync.core import validation as check
from runledger_sync.core.continuation import DEFAULT_MAX_CONTINUATIONS
from runledger_sync.core.coordination import Debounce, Unique
from runledger_sync.core.cron import check_timezone, parse_cron
from runledger_sync.core.errors import LeaseOwnerMismatch
from runledger_sync.core.states import JobStage, JobStatus


@dataclass(frozen=True)
class JobDefinition:
    """A job type's defaults and switch (table ``job_definitions``)."""

    job_type: str
    version: int = 1
    max_attempts: int = 8
    default_timeout_seconds: int = 900
    default_priority: int = 100
    is_enabled: bool = True
    #: The queue its jobs join unless their enqueue names another.
    queue: str = "default"
    #: How many times one job of the type may continue (``JobCompletion(continue_after=...)``, ``Snooze``).
    max_continuations: int = DEFAULT_MAX_CONTINUATIONS


@dataclass(frozen=True)
class JobSpec:
    """One job to enqueue with :func:`enqueue_many`; unset fields take the definition's defaults."""

    job_type: str
    payload: Any = field(default_factory=dict)
    priority: Optional[int] = None
    max_attempts: Optional[int] = None
    timeout_seconds: Optional[int] = None
    run_at: Optional[datetime] = None
    delay_seconds: Optional[float] = None
    organization_id: Optional[str] = None
    idempotency_key: Optional[str] = None
    stage: JobStage = JobStage.QUEUED
    #: The queue, when not the job type's own.
    queue: Optional[str] = None
    #: Jobs of one key run at most ``key_limit`` at a time (their queue's), head first.
    concurrency_key: Optional[str] = None
    #: Text keys to text values stored with the job, read as ``ctx.meta`` (:mod:`runledger_sync.core.meta`).
    meta: Optional[Mapping[str, str]] = None
    #: At most one live job per key: a duplicate returns the live one (:mod:`runledger_sync.core.coordination`);
    #: False: not unique, whatever the type's default.
    unique: Union[Unique, Literal[False], None] = None
    #: One waiting job per key, which later enqueues replace; not with ``unique``, ``run_at`` or ``delay_seconds``.
    debounce: Optional[Debounce] = None
    #: The OPEN batch to join (a :class:`runledger_sync.BatchRecord`'s id), counted in its progress.
    batch: Optional[UUID | str] = None


@dataclass(frozen=True)
class JobRecord:
    """One row of ``job_queue``."""

    id: UUID
    job_type: str
    organization_id: Optional[str]
    payload: Any
    status: JobStatus
    priority: int
    run_number: int
    attempt: int
    max_attempts: int
    timeout_seconds: int
    next_run_at: datetime
    lease_expires_at: Optional[datetime]
    last_heartbeat_at: Optional[datetime]
    worker_id: Optional[str]
    started_at: Optional[datetime]
    finished_at: Optional[datetime]
    stage: JobStage
    progress_done: Optional[int]
    progress_total: Optional[int]
    progress_pct: Optional[Decimal]
    checkpoint: Any
    output: Any
    idempotency_key: Optional[str]
    enqueue_request: Any
    status_reason: Optional[str]
    last_error_code: Optional[str]
    last_error_message: Optional[str]
    created_at: datetime
    updated_at: datetime
    #: The workflow step this job runs, or None for a plain job.
    workflow_step_id: Optional[UUID] = None
    queue: str = "default"
    #: The key given at enqueue: jobs of one key run at most ``key_limit`` at a time (their queue's).
    #: Stored in column ``execution_resource_key``, the spec's name.
    concurrency_key: Optional[str] = None
    #: How many times the job continued (spec T14) since it was enqueued or requeued.
    continuations: int = 0
    #: The metadata it was enqueued with (text keys to text values; empty when none).
    meta: Mapping[str, str] = field(default_factory=dict)
    #: A unique or debounced job's key (with its period's bucket, ``key@2026-12-06T12:00:00Z``), else None.
    unique_key: Optional[str] = None
    #: The statuses in which it blocks another job of its key; None once it no longer can.
    unique_states: Optional[Sequence[str]] = None
    #: How many later enqueues replaced a debounced job's payload and meta.
    debounce_count: int = 0
    #: The latest a debounced job starts: its first enqueue plus ``max_delay``.
    debounce_until: Optional[datetime] = None
    #: The batch the job is a member of (``rl.open_batch``), else None.
    batch_id: Optional[UUID] = None
    #: What the enqueue that returned this record did: ``created``, ``existing`` (a unique
    #: duplicate or an idempotent repeat returned the live job) or ``replaced`` (debounced).
    #: None on a record read any other way. Not a column, and not compared.
    disposition: Optional[str] = field(default=None, compare=False)

    @property
    def stage_shown(self) -> JobStage:
        """The stage to show: ``completed`` once the job is finished, whatever its status, else :attr:`stage`.

        The column keeps the stage the job stopped at (spec section 1): a job
        dead-lettered or canceled while running keeps ``running``, one canceled
        before it ran keeps ``queued``. Shown as it is, that reads as a job still
        at work; ``jobs show``, ``jobs list`` and the job page show this instead.
        """
        return JobStage.COMPLETED if self.status.is_terminal else self.stage


@dataclass(frozen=True)
class JobAttemptRecord:
    """One row of ``job_attempts``: one claim of a job."""

    id: UUID
    job_id: UUID
    run_number: int
    attempt: int
    worker_id: Optional[str]
    leased_at: datetime
    started_at: datetime
    finished_at: Optional[datetime]
    outcome: Optional[str]
    error_code: Optional[str]
    error_message: Optional[str]
    retry_delay_ms: Optional[int]
    claim_origin: str
    execution_started_persisted_at: Optional[datetime]
    created_at: datetime
    #: The failing exception's qualified type name (``KeyError``, ``myapp.errors.Declined``);
    #: None for a success, and for a failure no exception caused (a timeout, a lost lease).
    error_type: Optional[str] = None
    #: Its traceback, without local values, cut in the middle to 8192 characters.
    traceback: Optional[str] = None


@dataclass(frozen=True)
class JobEventRecord:
    """One row of the append-only ``job_events`` log."""

    id: int
    job_id: UUID
    run_number: int
    attempt: Optional[int]
    event_type: str
    stage: Optional[str]
    progress_done: Optional[int]
    progress_total: Optional[int]
    payload: Any
    occurred_at: datetime


@dataclass(frozen=True)
class DeadLetterRecord:
    """One row of ``job_dead_letters``, with the evidence of the attempt it failed on."""

    job_id: UUID
    job_type: str
    organization_id: Optional[str]
    run_number: int
    attempt: int
    error_code: Optional[str]
    error_message: Optional[str]
    payload_snapshot: Any
    checkpoint_snapshot: Any
    failed_at: datetime
    created_at: datetime
    #: The failing exception's type and traceback, read from its attempt's row
    #: (see :class:`JobAttemptRecord`); None when no exception caused the failure.
    error_type: Optional[str] = None
    traceback: Optional[str] = None


@dataclass(frozen=True)
class ReapedDeadLetter:
    """A job the reaper dead-lettered, so its handler's hook can be told."""

    job_id: UUID
    job_type: str
    organization_id: Optional[str]
    run_number: int
    attempt: int
    payload: Any
    meta: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ReapResult:
    """What one reaper batch did."""

    processed: int
    released_unstarted: int
    retried: int
    dead_lettered: tuple[ReapedDeadLetter, ...]
    failed_rows: int


@dataclass(frozen=True)
class LeaseIdentity:
    """The four values that fence every worker write to a claimed job."""

    job_id: UUID
    run_number: int
    attempt: int
    worker_id: str

    @classmethod
    def of(cls, job: JobRecord) -> "LeaseIdentity":
        if job.worker_id is None:
            raise LeaseOwnerMismatch(f"job {job.id} is not leased")
        return cls(job.id, job.run_number, job.attempt, job.worker_id)

    def params(self) -> dict[str, Any]:
        """The identity as the bound values of a single fenced write.

        Bind names differ from column names: SQLAlchemy would turn a parameter
        named like a column into an extra SET clause of an UPDATE.
        """
        return {
            "lease_job_id": self.job_id,
            "lease_run_number": self.run_number,
            "lease_attempt": self.attempt,
            "lease_worker_id": self.worker_id,
        }

    def keywords(self) -> dict[str, Any]:
        """The identity as the keyword arguments of the store's lifecycle functions."""
        return {"job_id": self.job_id, "run_number": self.run_number, "attempt": self.attempt, "worker_id": self.worker_id}


@dataclass(frozen=True)
class ScheduleRecord:
    """A cron schedule (table ``job_schedules``): what it enqueues, and when next."""

    id: UUID
    name: str
    job_type: str
    organization_id: Optional[str]
    payload_template: Any
    cron_expr: str
    timezone: str
    is_active: bool
    next_fire_at: datetime
    last_fired_at: Optional[datetime]
    max_jitter_seconds: int
    created_by_user_id: Optional[str]
    #: ``code`` when declared with ``registry.schedule`` and written by sync_definitions, else ``api``.
    source: str
    last_error_code: Optional[str]
    last_error_message: Optional[str]
    last_error_at: Optional[datetime]
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class ScheduleFailure:
    """A due schedule that could not fire in a tick; it is tried again 30 s later."""

    name: str
    code: str
    message: str


@dataclass(frozen=True)
class ScheduleTick:
    """What one scheduler tick did."""

    fired: int
    failed: tuple[ScheduleFailure, ...]
    #: True when the tick took as many due schedules as its limit: more may be due.
    full: bool
    #: Seconds until the soonest active schedule is due (<= 0: due now); None with none active.
    next_due_in_seconds: Optional[float]
    #: Schedules that fired their last instant (their cron names no later one) and were made inactive.
    finished: tuple[str, ...] = ()


#: Longest schedule name, and widest jitter a schedule may ask for.
SCHEDULE_NAME_MAX_LENGTH = 255
MAX_JITTER_SECONDS = 86_400


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule as written by :func:`upsert_schedule` (or declared with ``registry.schedule``)."""

    name: str
    cron_expr: str
    job_type: str
    payload_template: Any = None
    organization_id: Optional[str] = None
    max_jitter_seconds: int = 0
    timezone: str = "UTC"

    def checked(self) -> "ScheduleSpec":
        """This spec, every value checked; raises the coded error of the first bad one."""
        check.check_text("name", self.name, max_length=SCHEDULE_NAME_MAX_LENGTH)
        parse_cron(self.cron_expr, check_timezone(self.timezone))
        check.check_job_type(self.job_type)
        check.check_optional_text("organization_id", self.organization_id, max_length=check.ORGANIZATION_ID_MAX_LENGTH)
        check.check_int("max_jitter_seconds", self.max_jitter_seconds, (0, MAX_JITTER_SECONDS))
        check.serialize_json("payload_template", self.template)
        return self

    @property
    def template(self) -> Any:
        return {} if self.payload_template is None else self.payload_template
