"""The workflow tables (revision 0004): runs, their steps and the steps' dependency edges; the appends (0012).

They are built on :data:`runledger_sync.db.schema.metadata`, with its helpers, and
join it when this module loads: code that reads the whole schema from
``metadata`` imports this module too. job_queue's ``workflow_step_id`` column
stays with job_queue.
"""

from __future__ import annotations

from sqlalchemy import Boolean, CheckConstraint, Column, DateTime, ForeignKey, Index, Integer, Table, Text, UniqueConstraint, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

from runledger_sync.core.workflow import WorkflowReleaseMode, WorkflowRunStatus, WorkflowStepKind, WorkflowStepStatus
from runledger_sync.db.schema import EMPTY_JSON, META_IS_OBJECT, NOW, metadata, one_of, timestamp_columns

workflow_runs = Table(
    "workflow_runs",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("name", Text, nullable=False),
    Column("organization_id", Text),
    Column("status", Text, nullable=False, server_default=text("'RUNNING'")),
    Column("idempotency_key", Text),
    Column("enqueue_request", JSONB),
    Column("status_reason", Text),
    Column("finished_at", DateTime(timezone=True)),
    *timestamp_columns(stamped_by_statements=True),
    # Revision 0010: metadata every step's job is enqueued with (runledger_sync.core.meta).
    Column("meta", JSONB, nullable=False, server_default=EMPTY_JSON),
    # Revision 0017: the batch the run is one member of (runledger_sync.db.schema_batches counts it);
    # pruning the finished batch leaves the run, to its own retention.
    Column("batch_id", UUID(as_uuid=True),
           ForeignKey("job_batches.id", name="fk_workflow_runs_batch_id", ondelete="SET NULL")),
    CheckConstraint(one_of("status", WorkflowRunStatus), name="ck_workflow_runs_status"),
    CheckConstraint("btrim(name) <> ''", name="ck_workflow_runs_name_not_blank"),
    CheckConstraint(
        "idempotency_key IS NULL OR enqueue_request IS NOT NULL", name="ck_workflow_runs_idempotency_enqueue_request"
    ),
    CheckConstraint(META_IS_OBJECT, name="ck_workflow_runs_meta_object"),
)
# Listing reads these newest first and pages on (created_at, id).
Index("idx_workflow_runs_created", workflow_runs.c.created_at.desc(), workflow_runs.c.id.desc())
Index(
    "idx_workflow_runs_status_created",
    workflow_runs.c.status,
    workflow_runs.c.created_at.desc(),
    workflow_runs.c.id.desc(),
)
# A batch's member runs (the batch page, cancel_batch, the foreign key's check when a
# batch row is deleted). Only members have entries.
Index("idx_workflow_runs_batch", workflow_runs.c.batch_id, workflow_runs.c.created_at, workflow_runs.c.id,
      postgresql_where=text("batch_id IS NOT NULL"))
# Retention (revision 0007): finished runs by age, the prune's walk.
FINISHED_RUNS = "status IN ('SUCCEEDED', 'COMPLETED_WITH_ERRORS', 'CANCELED')"
Index("idx_workflow_runs_finished", workflow_runs.c.finished_at, workflow_runs.c.id,
      postgresql_where=text(FINISHED_RUNS))
Index(
    "idx_workflow_runs_org_created",
    workflow_runs.c.organization_id,
    workflow_runs.c.created_at.desc(),
    workflow_runs.c.id.desc(),
    postgresql_where=text("organization_id IS NOT NULL"),
)
Index(
    "uq_workflow_runs_name_idempotency_org",
    workflow_runs.c.name,
    workflow_runs.c.organization_id,
    workflow_runs.c.idempotency_key,
    unique=True,
    postgresql_where=text("organization_id IS NOT NULL AND idempotency_key IS NOT NULL"),
)
Index(
    "uq_workflow_runs_name_idempotency_global",
    workflow_runs.c.name,
    workflow_runs.c.idempotency_key,
    unique=True,
    postgresql_where=text("organization_id IS NULL AND idempotency_key IS NOT NULL"),
)

workflow_steps = Table(
    "workflow_steps",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column(
        "run_id",
        UUID(as_uuid=True),
        ForeignKey("workflow_runs.id", ondelete="CASCADE", name="fk_workflow_steps_run_id"),
        nullable=False,
    ),
    Column("step_key", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("status", Text, nullable=False, server_default=text("'BLOCKED'")),
    # What a job step's job is made of when the step is released.
    Column("job_type", Text),
    Column("payload", JSONB),
    Column("priority", Integer),
    Column("max_attempts", Integer),
    Column("timeout_seconds", Integer),
    # Revision 0008: the step's job may continue (spec T14) while its dependents wait.
    Column("allow_continuation", Boolean, nullable=False, server_default=text("false")),
    Column("job_id", UUID(as_uuid=True), ForeignKey("job_queue.id", ondelete="SET NULL", name="fk_workflow_steps_job_id")),
    Column("dependencies_total", Integer, nullable=False, server_default=text("0")),
    Column("dependencies_pending", Integer, nullable=False, server_default=text("0")),
    Column("dependencies_unsatisfied", Integer, nullable=False, server_default=text("0")),
    # An external step's answer; a job step's output stays on its job row.
    Column("output", JSONB),
    Column("error_code", Text),
    Column("error_message", Text),
    Column("finished_at", DateTime(timezone=True)),
    *timestamp_columns(stamped_by_statements=True),
    UniqueConstraint("run_id", "step_key", name="uq_workflow_steps_run_id_step_key"),
    CheckConstraint(one_of("kind", WorkflowStepKind), name="ck_workflow_steps_kind"),
    CheckConstraint(one_of("status", WorkflowStepStatus), name="ck_workflow_steps_status"),
    CheckConstraint("(kind = 'JOB') = (job_type IS NOT NULL)", name="ck_workflow_steps_job_type"),
    CheckConstraint(
        "dependencies_pending >= 0 AND dependencies_unsatisfied >= 0 "
        "AND dependencies_pending <= dependencies_total AND dependencies_unsatisfied <= dependencies_total",
        name="ck_workflow_steps_dependency_counts",
    ),
)
Index("uq_workflow_steps_job_id", workflow_steps.c.job_id, unique=True, postgresql_where=text("job_id IS NOT NULL"))

workflow_step_dependencies = Table(
    "workflow_step_dependencies",
    metadata,
    Column(
        "step_id",
        UUID(as_uuid=True),
        ForeignKey("workflow_steps.id", ondelete="CASCADE", name="fk_workflow_step_dependencies_step_id"),
        primary_key=True,
    ),
    Column(
        "prerequisite_step_id",
        UUID(as_uuid=True),
        ForeignKey("workflow_steps.id", ondelete="CASCADE", name="fk_workflow_step_dependencies_prerequisite_step_id"),
        primary_key=True,
    ),
    Column("release_mode", Text, nullable=False, server_default=text("'ON_TERMINAL'")),
    CheckConstraint(one_of("release_mode", WorkflowReleaseMode), name="ck_workflow_step_dependencies_release_mode"),
    CheckConstraint("step_id <> prerequisite_step_id", name="ck_workflow_step_dependencies_not_self"),
)
# A step's end walks its outgoing edges.
Index("idx_workflow_step_dependencies_prerequisite", workflow_step_dependencies.c.prerequisite_step_id)

# Revision 0012: one row per append applied to a run (spec section 11), found again by its
# key when the append is retried. The request is kept as a digest: the steps it wrote are rows
# of workflow_steps already, and a retry needs only to know whether it asks for the same.
workflow_run_mutations = Table(
    "workflow_run_mutations",
    metadata,
    Column(
        "run_id",
        UUID(as_uuid=True),
        ForeignKey("workflow_runs.id", ondelete="CASCADE", name="fk_workflow_run_mutations_run_id"),
        primary_key=True,
    ),
    Column("mutation_key", Text, primary_key=True),
    Column("window_step_key", Text, nullable=False),
    Column("step_keys", ARRAY(Text), nullable=False),
    # sha256 of the append's steps as canonical JSON (runledger_sync.store.workflows.append).
    Column("request_digest", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    CheckConstraint("btrim(mutation_key) <> ''", name="ck_workflow_run_mutations_key_not_blank"),
)

#: The deferred trigger function keeping job_queue.workflow_step_id and workflow_steps.job_id
#: symmetric (spec section 11). It reads the other table in the schema of the table that fired
#: it, so one body serves any schema. Created by revision 0004.
WORKFLOW_LINK_FUNCTION = "runledger_check_workflow_link"
WORKFLOW_LINK_FUNCTION_BODY = """
DECLARE
  linked boolean;
BEGIN
  IF TG_TABLE_NAME = 'job_queue' THEN
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.workflow_steps WHERE id = $1 AND job_id = $2)', TG_TABLE_SCHEMA)
      INTO linked USING NEW.workflow_step_id, NEW.id;
  ELSIF TG_TABLE_NAME = 'workflow_steps' THEN
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.job_queue WHERE id = $1 AND workflow_step_id = $2)', TG_TABLE_SCHEMA)
      INTO linked USING NEW.job_id, NEW.id;
  ELSE
    RAISE EXCEPTION 'workflow.linkage_symmetry_trigger_table_invalid: fired on %', TG_TABLE_NAME
      USING ERRCODE = 'RLW02';
  END IF;
  IF NOT linked THEN
    RAISE EXCEPTION 'workflow.linkage_symmetry_violation: % row % is linked one way only', TG_TABLE_NAME, NEW.id
      USING ERRCODE = 'RLW01';
  END IF;
  RETURN NULL;
END
"""
#: (table, trigger, linking column): the rows each trigger checks, only those with a link.
WORKFLOW_LINK_TRIGGERS = (
    ("job_queue", "trg_job_queue_workflow_link", "workflow_step_id"),
    ("workflow_steps", "trg_workflow_steps_job_link", "job_id"),
)
