"""The tables of the queue as SQLAlchemy Core: the single source of truth.

Tables carry no schema name. The schema they live in (default ``public``) is
chosen per engine with ``schema_translate_map={None: name}``, which
:func:`runledger_sync.db.engine.create_engine` sets, so a host application can
keep them in a schema of its own.

Statuses, kinds and event types are text columns with CHECK constraints rather
than PostgreSQL enum types: operators query them as text, and a new value is a
one-line migration instead of an ``ALTER TYPE`` that cannot run in a transaction.

The workflow tables (revision 0004) are defined on the same :data:`metadata` in
:mod:`runledger_sync.db.schema_workflows`, which builds on this module and is
imported from there. They join :data:`metadata` when that module loads, so code
that reads the whole schema from it (the drift check, Alembic's ``env.py``)
imports both.
"""

from __future__ import annotations

from enum import Enum

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Computed,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    Numeric,
    Table,
    Text,
    UniqueConstraint,
    event,
    func,
    text,
)
from sqlalchemy.schema import DDL
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

from runledger_sync.core.continuation import CONTINUED_OUTCOME, DEFAULT_MAX_CONTINUATIONS
from runledger_sync.core.evidence import MAX_ERROR_TYPE_CHARS, MAX_TRACEBACK_CHARS
from runledger_sync.core.types import ClaimOrigin, JobEventType, JobFailureKind
from runledger_sync.core.states import JobStage, JobStatus

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s",
        "pk": "pk_%(table_name)s",
    }
)

NOW = text("now()")
#: A stored exception type name and traceback stay within the caps they are cut to.
ERROR_TYPE_CHECK = f"error_type IS NULL OR char_length(error_type) <= {MAX_ERROR_TYPE_CHARS}"
TRACEBACK_CHECK = f"traceback IS NULL OR char_length(traceback) <= {MAX_TRACEBACK_CHARS}"
EMPTY_JSON = text("'{}'::jsonb")
#: Metadata is a JSON object (its keys and values are checked in Python: runledger_sync.core.meta).
META_IS_OBJECT = "jsonb_typeof(meta) = 'object'"


def one_of(column: str, enum_cls: type[Enum]) -> str:
    """A CHECK expression: ``column`` holds one of the enum's values."""
    values = ", ".join(f"'{member.value}'" for member in enum_cls)
    return f"{column} IN ({values})"


#: An attempt row's outcome once finished: NULL (succeeded), a failure kind, or CONTINUED.
ATTEMPT_OUTCOMES = (*(kind.value for kind in JobFailureKind), CONTINUED_OUTCOME)
ATTEMPT_OUTCOME_CHECK = "outcome IS NULL OR outcome IN ({})".format(", ".join(f"'{value}'" for value in ATTEMPT_OUTCOMES))


def timestamp_columns(*, stamped_by_statements: bool = False) -> list[Column]:
    """created_at and updated_at; ``stamped_by_statements``: every Core UPDATE sets updated_at = now().

    job_queue and job_definitions have no updated_at trigger (revision 0003): a
    plpgsql trigger call on each of a job's three updates cost 2-3% of
    PostgreSQL's time per job. ``onupdate`` makes SQLAlchemy write the SET
    clause into every UPDATE built from these tables, CTEs included. An
    ``ON CONFLICT DO UPDATE`` is not covered and sets the column itself, and so
    must any UPDATE written as text.
    """
    return [
        Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
        Column(
            "updated_at", DateTime(timezone=True), nullable=False, server_default=NOW,
            onupdate=func.now() if stamped_by_statements else None,
        ),
    ]


# A queue's settings, one row per queue (revision 0005): every worker reads them at
# each claim, so a pause or a new limit holds at once across workers. None is no limit.
job_queues = Table(
    "job_queues",
    metadata,
    Column("name", Text, primary_key=True),
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    Column("paused_at", DateTime(timezone=True)),
    Column("global_limit", Integer),
    Column("key_limit", Integer, server_default=text("1")),
    Column("rate_limit_count", Integer),
    Column("rate_limit_seconds", Float),
    Column("rate_limit_per_key", Boolean, nullable=False, server_default=text("false")),
    *timestamp_columns(stamped_by_statements=True),
    CheckConstraint("btrim(name) <> ''", name="ck_job_queues_name_not_blank"),
    CheckConstraint("global_limit IS NULL OR global_limit > 0", name="ck_job_queues_global_limit_positive"),
    CheckConstraint("key_limit IS NULL OR key_limit > 0", name="ck_job_queues_key_limit_positive"),
    CheckConstraint(
        "(rate_limit_count IS NULL) = (rate_limit_seconds IS NULL) "
        "AND (rate_limit_count IS NULL OR (rate_limit_count > 0 AND rate_limit_seconds > 0))",
        name="ck_job_queues_rate_limit",
    ),
)

job_definitions = Table(
    "job_definitions",
    metadata,
    Column("job_type", Text, primary_key=True),
    Column("version", Integer, nullable=False, server_default=text("1")),
    Column("max_attempts", Integer, nullable=False, server_default=text("8")),
    Column("default_timeout_seconds", Integer, nullable=False, server_default=text("900")),
    Column("default_priority", Integer, nullable=False, server_default=text("100")),
    Column("is_enabled", Boolean, nullable=False, server_default=text("true")),
    *timestamp_columns(stamped_by_statements=True),
    Column(
        "queue", Text, ForeignKey("job_queues.name", name="fk_job_definitions_queue"),
        nullable=False, server_default=text("'default'"),
    ),
    # Revision 0008: the cap on one job's continuations (runledger_sync.core.continuation).
    Column("max_continuations", Integer, nullable=False, server_default=text(str(DEFAULT_MAX_CONTINUATIONS))),
    CheckConstraint("btrim(job_type) <> ''", name="ck_job_definitions_job_type_not_blank"),
    CheckConstraint("version > 0", name="ck_job_definitions_version_positive"),
    CheckConstraint("max_attempts > 0", name="ck_job_definitions_max_attempts_positive"),
    CheckConstraint("default_timeout_seconds > 0", name="ck_job_definitions_timeout_positive"),
    CheckConstraint("max_continuations > 0", name="ck_job_definitions_max_continuations_positive"),
)

job_queue = Table(
    "job_queue",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column(
        "job_type",
        Text,
        ForeignKey("job_definitions.job_type", name="fk_job_queue_job_type"),
        nullable=False,
    ),
    Column("organization_id", Text),
    Column("payload", JSONB, nullable=False, server_default=EMPTY_JSON),
    Column("status", Text, nullable=False, server_default=text("'PENDING'")),
    Column("priority", Integer, nullable=False, server_default=text("100")),
    Column("run_number", Integer, nullable=False, server_default=text("1")),
    Column("attempt", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=False),
    Column("timeout_seconds", Integer, nullable=False, server_default=text("900")),
    Column("next_run_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("lease_expires_at", DateTime(timezone=True)),
    Column("last_heartbeat_at", DateTime(timezone=True)),
    Column("worker_id", Text),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("stage", Text, nullable=False, server_default=text("'queued'")),
    Column("progress_done", BigInteger),
    Column("progress_total", BigInteger),
    Column(
        "progress_pct",
        Numeric,
        Computed(
            "CASE WHEN progress_total > 0 "
            "THEN round((progress_done::numeric * 100) / progress_total, 2) END",
            persisted=True,
        ),
    ),
    Column("checkpoint", JSONB),
    Column("output", JSONB),
    Column("idempotency_key", Text),
    Column("enqueue_request", JSONB),
    Column("status_reason", Text),
    Column("last_error_code", Text),
    Column("last_error_message", Text),
    *timestamp_columns(stamped_by_statements=True),
    # use_alter: workflow_steps.job_id points back here, so one of the two keys is added after both tables.
    Column(
        "workflow_step_id",
        UUID(as_uuid=True),
        ForeignKey("workflow_steps.id", ondelete="SET NULL", name="fk_job_queue_workflow_step_id", use_alter=True),
    ),
    # Flow control (revision 0005, runledger_sync.db.schema_queues): the job's queue,
    # its concurrency key (the spec's execution resource key), and whether the key's
    # limit holds it back. The key trigger alone writes blocked_by_key.
    Column("queue", Text, ForeignKey("job_queues.name", name="fk_job_queue_queue"), nullable=False,
           server_default=text("'default'")),
    Column("execution_resource_key", Text),
    Column("blocked_by_key", Boolean, nullable=False, server_default=text("false")),
    # Revision 0008: the job's continuations since it was enqueued or requeued (spec T14).
    Column("continuations", Integer, nullable=False, server_default=text("0")),
    # Revision 0010: the job's metadata (runledger_sync.core.meta), kept by retries, continuations and requeues.
    Column("meta", JSONB, nullable=False, server_default=EMPTY_JSON),
    # Revision 0013: unique and debounced jobs (runledger_sync.core.coordination): the key,
    # the statuses in which the row blocks another of its key, and a debounce's count and cap.
    Column("unique_key", Text),
    Column("unique_states", ARRAY(Text)),
    Column("debounce_count", Integer, nullable=False, server_default=text("0")),
    Column("debounce_until", DateTime(timezone=True)),
    # Revision 0014: the batch the job is a member of (runledger_sync.db.schema_batches keeps its counts).
    Column("batch_id", UUID(as_uuid=True), ForeignKey("job_batches.id", name="fk_job_queue_batch_id")),
    CheckConstraint(one_of("status", JobStatus), name="ck_job_queue_status"),
    CheckConstraint(one_of("stage", JobStage), name="ck_job_queue_stage"),
    CheckConstraint("run_number > 0", name="ck_job_queue_run_number_positive"),
    CheckConstraint("attempt >= 0", name="ck_job_queue_attempt_non_negative"),
    CheckConstraint("max_attempts > 0", name="ck_job_queue_max_attempts_positive"),
    CheckConstraint("timeout_seconds > 0", name="ck_job_queue_timeout_positive"),
    CheckConstraint(
        "(progress_done IS NULL OR progress_done >= 0) "
        "AND (progress_total IS NULL OR progress_total >= 0) "
        "AND (progress_done IS NULL OR progress_total IS NULL OR progress_done <= progress_total)",
        name="ck_job_queue_progress",
    ),
    CheckConstraint(
        "idempotency_key IS NULL OR btrim(idempotency_key) <> ''",
        name="ck_job_queue_idempotency_key_not_blank",
    ),
    CheckConstraint(
        "idempotency_key IS NULL OR enqueue_request IS NOT NULL",
        name="ck_job_queue_idempotency_enqueue_request",
    ),
    CheckConstraint(
        "execution_resource_key IS NULL OR (btrim(execution_resource_key) <> '' "
        "AND octet_length(execution_resource_key) <= 512)",
        name="ck_job_queue_execution_resource_key",
    ),
    CheckConstraint("continuations >= 0", name="ck_job_queue_continuations_non_negative"),
    CheckConstraint(META_IS_OBJECT, name="ck_job_queue_meta_object"),
    CheckConstraint("debounce_count >= 0", name="ck_job_queue_debounce_count_non_negative"),
)

# job_queue's indexes. Each says which of the product's reads it serves; the reads
# are explained on a table of 1,000,000 jobs by
# tests/db/store/test_reads_at_a_million_jobs.py, which fails on a sequential scan
# of job_queue and on an index no read uses (every index costs every write).
#
# The claim (store/claim/statement.py) reads the head of each queue it serves in
# claim order, and the rollup's sample (store/admin/rollup.py) counts each queue's due
# claimable jobs. The index covers exactly the rows a claim can pick, so the claim
# reads only the head of each queue however many finished rows exist, and jobs held
# back by a busy concurrency key are not in it.
CLAIMABLE = "status = 'PENDING' AND NOT blocked_by_key"
Index(
    "idx_job_queue_claim",
    job_queue.c.queue,
    job_queue.c.priority.desc(),
    job_queue.c.next_run_at,
    job_queue.c.created_at,
    job_queue.c.id,
    postgresql_where=text(CLAIMABLE),
)
# A key's PENDING and LEASED jobs, the live ones apart from the held-back ones, each
# in claim order: the key trigger (db/schema_queues.py, its guess at enqueue and its
# settle at commit) counts the live ones without reading the held-back ones (a busy
# key may hold back thousands) and finds the next one to let go; explain_wait finds
# the job holding a busy key's turn. Only keyed rows have entries.
Index(
    "idx_job_queue_key_live",
    job_queue.c.queue,
    job_queue.c.execution_resource_key,
    job_queue.c.blocked_by_key,
    job_queue.c.priority.desc(),
    job_queue.c.next_run_at,
    job_queue.c.created_at,
    job_queue.c.id,
    postgresql_where=text("execution_resource_key IS NOT NULL AND status IN ('PENDING', 'LEASED')"),
)
# The LEASED rows, which the listing indexes leave out, by lease expiry: the
# reaper's expired leases, oldest first (store/maintenance/reaper.py); and every read of the
# LEASED part: list_jobs and count_jobs, the stats, gauges and queue loads, the
# overview's workers, the claim's and explain_wait's count of a limited queue's leases.
Index(
    "idx_job_queue_leased_expiry",
    job_queue.c.lease_expires_at,
    postgresql_where=text("status = 'LEASED'"),
)
# The listing indexes hold only the rows at rest: every status but LEASED. The
# claim moves a row into LEASED and its success moves it out; neither update can be
# HOT (the claim index's predicate reads status), so each adds an entry to every
# index whose predicate the new row version meets. Leaving LEASED rows out spares
# these indexes the claim's entry, and the running write's when its page is full.
# Leased rows are few (the workers' slots, plus expired leases the reaper has yet
# to recover) and idx_job_queue_leased_expiry finds them; store/admin/jobs.py lists and
# counts the two parts apart, each status on its own, and merges them newest first.
RESTING = "status <> 'LEASED'"
# list_jobs by status or none, newest first and paged by (created_at, id) (jobs list,
# the dashboard's jobs page, its key-prefix search); count_jobs; the PENDING parts of
# queue_stats, queue_gauges and queue_loads (held-back jobs count there, and the
# claim index leaves them out).
Index(
    "idx_job_queue_resting_status",
    job_queue.c.status,
    job_queue.c.created_at.desc(),
    job_queue.c.id.desc(),
    postgresql_where=text(RESTING),
)
# list_jobs and count_jobs by job type, with a status or without (jobs list --type,
# the dashboard's type filter); make_jobs_due for some types.
Index(
    "idx_job_queue_resting_type",
    job_queue.c.job_type,
    job_queue.c.status,
    job_queue.c.created_at.desc(),
    job_queue.c.id.desc(),
    postgresql_where=text(RESTING),
)
# list_jobs and count_jobs in an organization (jobs list --org, a dashboard scoped to
# or filtered by one), and queue_stats of an organization. Global jobs (no
# organization) are never listed by organization: no entries for them.
Index(
    "idx_job_queue_resting_org",
    job_queue.c.organization_id,
    job_queue.c.status,
    job_queue.c.created_at.desc(),
    job_queue.c.id.desc(),
    postgresql_where=text(f"organization_id IS NOT NULL AND {RESTING}"),
)
# Retention (revision 0007): finished jobs outside workflows, by status and age, so
# a prune reads only the oldest of the rows it may delete. It also finds the
# dead-lettered jobs a replay may requeue (count_dead_letters, the dashboard's
# count). A success writes one entry here; the running write, which changes neither
# column, stays HOT.
FINISHED_STANDALONE = "status IN ('SUCCEEDED', 'CANCELED', 'DEAD_LETTERED') AND workflow_step_id IS NULL"
Index(
    "idx_job_queue_finished",
    job_queue.c.status,
    job_queue.c.finished_at,
    job_queue.c.id,
    postgresql_where=text(FINISHED_STANDALONE),
)
# An idempotency key is unique per job type in an organization, or among the jobs
# of none: each side has its index. An enqueue's insert conflicts on them, and the
# key's holder is then read back through the same one (store/enqueue/chunk.py).
Index(
    "uq_job_queue_type_idempotency_org",
    job_queue.c.job_type,
    job_queue.c.organization_id,
    job_queue.c.idempotency_key,
    unique=True,
    postgresql_where=text("organization_id IS NOT NULL AND idempotency_key IS NOT NULL"),
)
Index(
    "uq_job_queue_type_idempotency_global",
    job_queue.c.job_type,
    job_queue.c.idempotency_key,
    unique=True,
    postgresql_where=text("organization_id IS NULL AND idempotency_key IS NOT NULL"),
)
# Unique and debounced jobs (revision 0013): a key is held once per job type in an
# organization, or among the jobs of none, by the rows whose status is one of their
# unique_states. An enqueue's insert meets a live holder here, in its one statement,
# and does nothing (a unique duplicate) or updates the holder (a debounce); the
# holder is read back through the same index (store/enqueue/chunk.py). A row whose
# status leaves its states leaves the index, and stops blocking.
UNIQUE_LIVE = "unique_key IS NOT NULL AND status = ANY (unique_states)"
UNIQUE_IN_ORGANIZATION = f"organization_id IS NOT NULL AND {UNIQUE_LIVE}"
UNIQUE_GLOBAL = f"organization_id IS NULL AND {UNIQUE_LIVE}"
Index(
    "uq_job_queue_unique_org",
    job_queue.c.job_type,
    job_queue.c.organization_id,
    job_queue.c.unique_key,
    unique=True,
    postgresql_where=text(UNIQUE_IN_ORGANIZATION),
)
Index(
    "uq_job_queue_unique_global",
    job_queue.c.job_type,
    job_queue.c.unique_key,
    unique=True,
    postgresql_where=text(UNIQUE_GLOBAL),
)
# The key-prefix search (list_jobs(search=), jobs list --search, the dashboard's
# search box). Under a collation other than C (C.UTF-8, en_US.UTF-8: most servers)
# a LIKE prefix cannot walk a btree of the column's own order, so the keys have one
# in byte order (text_pattern_ops), which any collation's prefix search can walk.
Index(
    "idx_job_queue_idempotency_key_prefix",
    job_queue.c.idempotency_key,
    postgresql_ops={"idempotency_key": "text_pattern_ops"},
    postgresql_where=text("idempotency_key IS NOT NULL"),
)
# One job per workflow step. A prune of finished runs finds their jobs through it
# (and whether any is still live), and so does the foreign key that sets the column
# to NULL when a step is deleted.
Index(
    "uq_job_queue_workflow_step_id",
    job_queue.c.workflow_step_id,
    unique=True,
    postgresql_where=text("workflow_step_id IS NOT NULL"),
)

# A batch's members, oldest first (the batch page; cancel_batch's pending members), and
# whether a finished batch has any left (the prune, and the foreign key's check when
# a batch row is deleted). Only members have entries.
Index(
    "idx_job_queue_batch",
    job_queue.c.batch_id,
    job_queue.c.created_at,
    job_queue.c.id,
    postgresql_where=text("batch_id IS NOT NULL"),
)

#: Room left in each job_queue page for the next versions of its rows: the running
#: write then stays on the page (a HOT update, no index entries), and WAL per job
#: fell by 15% at batches of 64 (bench/README.md). Set by revision 0003.
JOB_QUEUE_FILLFACTOR = 70
# A DDL event rather than a Table option: SQLAlchemy 2.0 has no table storage
# parameters, and metadata.create_all() must build what the migrations build.
event.listen(
    job_queue, "after_create", DDL(f"ALTER TABLE %(fullname)s SET (fillfactor = {JOB_QUEUE_FILLFACTOR})")
)

job_attempts = Table(
    "job_attempts",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column(
        "job_id",
        UUID(as_uuid=True),
        ForeignKey("job_queue.id", ondelete="CASCADE", name="fk_job_attempts_job_id"),
        nullable=False,
    ),
    Column("run_number", Integer, nullable=False, server_default=text("1")),
    Column("attempt", Integer, nullable=False),
    Column("worker_id", Text),
    Column("leased_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("finished_at", DateTime(timezone=True)),
    Column("outcome", Text),
    Column("error_code", Text),
    Column("error_message", Text),
    Column("retry_delay_ms", BigInteger),
    Column("claim_origin", Text, nullable=False, server_default=text("'DIRECT'")),
    Column("execution_started_persisted_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    # Revision 0006: the failing exception's qualified type and bounded traceback (runledger_sync.core.evidence).
    Column("error_type", Text),
    Column("traceback", Text),
    UniqueConstraint("job_id", "run_number", "attempt", name="uq_job_attempts_job_run_attempt"),
    CheckConstraint("attempt > 0", name="ck_job_attempts_attempt_positive"),
    CheckConstraint("retry_delay_ms IS NULL OR retry_delay_ms >= 0", name="ck_job_attempts_retry_delay"),
    # NULL: succeeded; a failure kind; or the run ended in a continuation (revision 0008).
    CheckConstraint(ATTEMPT_OUTCOME_CHECK, name="ck_job_attempts_outcome"),
    CheckConstraint(one_of("claim_origin", ClaimOrigin), name="ck_job_attempts_claim_origin"),
    CheckConstraint(ERROR_TYPE_CHECK, name="ck_job_attempts_error_type"),
    CheckConstraint(TRACEBACK_CHECK, name="ck_job_attempts_traceback"),
)
Index(
    "idx_job_attempts_job_run_created",
    job_attempts.c.job_id,
    job_attempts.c.run_number,
    job_attempts.c.created_at.desc(),
)

job_events = Table(
    "job_events",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column(
        "job_id",
        UUID(as_uuid=True),
        ForeignKey("job_queue.id", ondelete="CASCADE", name="fk_job_events_job_id"),
        nullable=False,
    ),
    Column("run_number", Integer, nullable=False),
    Column("attempt", Integer),
    Column("event_type", Text, nullable=False),
    Column("stage", Text),
    Column("progress_done", BigInteger),
    Column("progress_total", BigInteger),
    Column("payload", JSONB, nullable=False, server_default=EMPTY_JSON),
    Column("occurred_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    CheckConstraint("attempt IS NULL OR attempt > 0", name="ck_job_events_attempt_positive"),
    CheckConstraint(one_of("event_type", JobEventType), name="ck_job_events_event_type"),
)
Index("idx_job_events_job_run_id", job_events.c.job_id, job_events.c.run_number, job_events.c.id)
Index("idx_job_events_type_occurred", job_events.c.event_type, job_events.c.occurred_at.desc())

job_dead_letters = Table(
    "job_dead_letters",
    metadata,
    Column(
        "job_id",
        UUID(as_uuid=True),
        ForeignKey("job_queue.id", ondelete="CASCADE", name="fk_job_dead_letters_job_id"),
        primary_key=True,
    ),
    Column("job_type", Text, nullable=False),
    Column("organization_id", Text),
    Column("run_number", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("error_code", Text),
    Column("error_message", Text),
    Column("payload_snapshot", JSONB, nullable=False),
    Column("checkpoint_snapshot", JSONB),
    Column("failed_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    CheckConstraint("attempt > 0", name="ck_job_dead_letters_attempt_positive"),
)
Index("idx_job_dead_letters_failed_at", job_dead_letters.c.failed_at.desc())
