"""runledger-sync: durable background jobs stored in PostgreSQL, run by a thread-pool worker.

Example:
    >>> import runledger_sync as rl                                   # doctest: +SKIP
    >>> engine = rl.create_engine("postgresql://app@localhost/app")   # doctest: +SKIP
    >>> rl.migrate(engine)                                            # doctest: +SKIP
    >>> registry = rl.JobRegistry()                                   # doctest: +SKIP

The names here are what an application needs: the API, the records, the
configuration and the errors it commonly catches. Every error class, the rare
leaves too, is in :mod:`runledger_sync.errors` (``rl.errors.WorkflowEmpty``).
"""

from runledger_sync.config import JobsConfig
from runledger_sync.core.errors import (
    AlreadyEnqueued,
    ConfigError,
    ConflictError,
    DefinitionNotFoundOrDisabled,
    IdempotencyConflict,
    InvalidArgument,
    InvalidCron,
    InvalidMeta,
    InvalidPayload,
    InvalidStateTransition,
    JobCancelled,
    JobNotFound,
    JobStateError,
    JobWaitTimeout,
    LeaseOwnerMismatch,
    MissingExtra,
    OutputTooLarge,
    RegistrationError,
    RunledgerError,
    ScheduleNotFound,
    ValidationError,
)
from runledger_sync.core.batch import BatchCallback, BatchRecord, BatchStatus
from runledger_sync.core.batch_errors import BatchClosed, BatchFinished, BatchNotFound, InvalidBatchCallback
from runledger_sync.core.bulk import BulkResult, JobFilter, JobOperation
from runledger_sync.core.bulk_errors import EmptyJobFilter, InvalidJobFilter
from runledger_sync.core.coordination import Debounce, Unique
from runledger_sync.core.coordination_errors import InvalidCoordination, InvalidDebounce, InvalidUnique
from runledger_sync.core.records import (
    DeadLetterRecord,
    JobAttemptRecord,
    JobDefinition,
    JobEventRecord,
    JobRecord,
    JobSpec,
    ScheduleRecord,
    ScheduleSpec,
)
from runledger_sync.core.replays import JobReplay
from runledger_sync.core.store_errors import (
    CommitOutcomeUnknown,
    ConnectionFailed,
    MigrationFailed,
    SchemaMismatch,
    StoreError,
)
from runledger_sync.core.types import (
    EventLog,
    JobCompletion,
    JobContext,
    JobDeadLetterInfo,
    JobDeadLetterReason,
    JobEventType,
    JobFailure,
    JobFailureKind,
    RuntimeLoopExit,
    Snooze,
)
from runledger_sync.core.states import JobStage, JobStatus
from runledger_sync.core.workflow import (
    Workflow,
    WorkflowAppend,
    WorkflowContext,
    WorkflowMutationRecord,
    WorkflowReleaseMode,
    WorkflowRunRecord,
    WorkflowRunStatus,
    WorkflowStep,
    WorkflowStepKind,
    WorkflowStepRecord,
    WorkflowStepStatus,
)
from runledger_sync.core.workflow_errors import InvalidWorkflow, WorkflowRunNotFound
from runledger_sync.core.flow import JobWait, QueueLoad, QueueRecord, RateLimit, WaitReason
from runledger_sync.core.queue_errors import InvalidQueueSetting, QueueNotFound
from runledger_sync.core.encryption import Encryption, configure_encryption
from runledger_sync.core.retention import PruneResult, Retention
from runledger_sync.core.retry_summary import RetrySummary, retry_summary
from runledger_sync.db.embedded import EmbeddedPostgres
from runledger_sync.db.engine import create_engine, mask_url, mask_urls_in, with_schema
from runledger_sync.db.migrate import check_schema, current_revision, downgrade, head_revision, migrate, migration_sql
from runledger_sync.db.pool_mode import PoolMode
from runledger_sync import errors  # noqa: F401 - rl.errors: every error class, the rare leaves too
from runledger_sync.handlers import JobHandler
from runledger_sync.logging import configure_logging, configure_logging_unless_configured
from runledger_sync.loading import load_registry
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.health import LoopHealth, SupervisorHealth
from runledger_sync.runtime.job_wait import wait_for_job
from runledger_sync.runtime.supervisor.supervisor import Supervisor
from runledger_sync.runtime.worker.loop import run_worker_loop
from runledger_sync.store.admin.actions import cancel_job, requeue_job
from runledger_sync.store.admin.replays import list_replays, replay_job
from runledger_sync.store.admin.bulk import (
    cancel_jobs,
    delete_jobs,
    list_operations,
    resume_operation,
    retry_jobs,
    update_jobs,
)
from runledger_sync.store.admin.dead_letters import count_dead_letters, list_dead_letters, replay_dead_letters
from runledger_sync.store.admin.gauges import QueueGauges, queue_gauges
from runledger_sync.store.admin.jobs import count_jobs, get_dead_letter, get_job, list_attempts, list_events, list_jobs
from runledger_sync.store.admin.stats import QueueStats, queue_stats
from runledger_sync.store.batches.batches import (
    cancel_batch,
    close_batch,
    get_batch,
    list_batch_members,
    list_batch_runs,
    list_batches,
    open_batch,
)
from runledger_sync.store.definitions import set_job_definition_enabled
from runledger_sync.store.enqueue.enqueue import enqueue, enqueue_many, enqueue_many_ids
from runledger_sync.store.maintenance.retention import prune
from runledger_sync.store.rotation import rotate_encryption
from runledger_sync.store.queues import (
    configure_queue,
    explain_wait,
    get_queue,
    list_queues,
    pause_queue,
    queue_loads,
    resume_queue,
)
from runledger_sync.store.schedules import (
    delete_schedule,
    get_schedule,
    list_schedules,
    pause_schedule,
    resume_schedule,
    trigger_schedule,
    upsert_schedule,
)
from runledger_sync.store.workflows.actions import cancel_workflow_run, complete_external_step
from runledger_sync.store.workflows.append import append_workflow_steps
from runledger_sync.store.workflows.enqueue import enqueue_workflow
from runledger_sync.store.workflows.runs import get_workflow_run, list_workflow_runs

__all__ = [
    "AlreadyEnqueued",
    "BatchCallback",
    "BatchClosed",
    "BatchFinished",
    "BatchNotFound",
    "BatchRecord",
    "BatchStatus",
    "BulkResult",
    "CommitOutcomeUnknown",
    "ConfigError",
    "ConflictError",
    "ConnectionFailed",
    "DeadLetterRecord",
    "Debounce",
    "DefinitionNotFoundOrDisabled",
    "EmbeddedPostgres",
    "EmptyJobFilter",
    "Encryption",
    "EventLog",
    "IdempotencyConflict",
    "InvalidArgument",
    "InvalidBatchCallback",
    "InvalidCoordination",
    "InvalidCron",
    "InvalidDebounce",
    "InvalidJobFilter",
    "InvalidMeta",
    "InvalidPayload",
    "InvalidQueueSetting",
    "InvalidStateTransition",
    "InvalidUnique",
    "InvalidWorkflow",
    "JobAttemptRecord",
    "JobCancelled",
    "JobCompletion",
    "JobContext",
    "JobDeadLetterInfo",
    "JobDeadLetterReason",
    "JobDefinition",
    "JobEventRecord",
    "JobEventType",
    "JobFailure",
    "JobFailureKind",
    "JobFilter",
    "JobHandler",
    "JobNotFound",
    "JobOperation",
    "JobRecord",
    "JobRegistry",
    "JobReplay",
    "JobSpec",
    "JobStage",
    "JobStateError",
    "JobStatus",
    "JobWait",
    "JobWaitTimeout",
    "JobsConfig",
    "LeaseOwnerMismatch",
    "LoopHealth",
    "MigrationFailed",
    "MissingExtra",
    "OutputTooLarge",
    "PoolMode",
    "PruneResult",
    "QueueGauges",
    "QueueLoad",
    "QueueNotFound",
    "QueueRecord",
    "QueueStats",
    "RateLimit",
    "RegistrationError",
    "Retention",
    "RetrySummary",
    "RunledgerError",
    "RuntimeLoopExit",
    "ScheduleNotFound",
    "ScheduleRecord",
    "ScheduleSpec",
    "SchemaMismatch",
    "Snooze",
    "StoreError",
    "Supervisor",
    "SupervisorHealth",
    "Unique",
    "ValidationError",
    "WaitReason",
    "Workflow",
    "WorkflowAppend",
    "WorkflowContext",
    "WorkflowMutationRecord",
    "WorkflowReleaseMode",
    "WorkflowRunNotFound",
    "WorkflowRunRecord",
    "WorkflowRunStatus",
    "WorkflowStep",
    "WorkflowStepKind",
    "WorkflowStepRecord",
    "WorkflowStepStatus",
    "append_workflow_steps",
    "cancel_batch",
    "cancel_job",
    "cancel_jobs",
    "cancel_workflow_run",
    "check_schema",
    "close_batch",
    "complete_external_step",
    "configure_encryption",
    "configure_logging",
    "configure_logging_unless_configured",
    "configure_queue",
    "count_dead_letters",
    "count_jobs",
    "create_engine",
    "current_revision",
    "delete_jobs",
    "delete_schedule",
    "downgrade",
    "enqueue",
    "enqueue_many",
    "enqueue_many_ids",
    "enqueue_workflow",
    "explain_wait",
    "get_batch",
    "get_dead_letter",
    "get_job",
    "get_queue",
    "get_schedule",
    "get_workflow_run",
    "head_revision",
    "list_attempts",
    "list_batch_members",
    "list_batch_runs",
    "list_batches",
    "list_dead_letters",
    "list_events",
    "list_jobs",
    "list_operations",
    "list_queues",
    "list_replays",
    "list_schedules",
    "list_workflow_runs",
    "load_registry",
    "mask_url",
    "mask_urls_in",
    "migrate",
    "migration_sql",
    "open_batch",
    "pause_queue",
    "pause_schedule",
    "prune",
    "queue_gauges",
    "queue_loads",
    "queue_stats",
    "replay_dead_letters",
    "replay_job",
    "requeue_job",
    "resume_operation",
    "resume_queue",
    "resume_schedule",
    "retry_jobs",
    "retry_summary",
    "rotate_encryption",
    "run_worker_loop",
    "set_job_definition_enabled",
    "trigger_schedule",
    "update_jobs",
    "upsert_schedule",
    "wait_for_job",
    "with_schema",
]
