"""Operator actions on many jobs (revision 0015): their audit rows, and the index that finds jobs by metadata.

``job_operations`` holds one row per bulk action (cancel, retry, delete, update
by filter): who asked, why, the filter as given, how many jobs it matched and
changed, and where its walk over the matching jobs stands. The row is written
when the action starts and moved on by each batch, in the batch's own
transaction, so an action that was interrupted shows as RUNNING with the
cursor it had reached (:mod:`runledger_sync.store.admin.bulk`). A dry run
writes no row.

``idx_job_queue_meta`` is a GIN index over ``job_queue.meta`` with
``jsonb_path_ops``: it answers containment (``meta @> '{"tenant": "acme"}'``),
the only test a metadata filter makes, and is smaller and cheaper to keep than
the default operator class, which also answers key-existence tests nothing asks.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, CheckConstraint, Column, DateTime, Index, Table, Text, text
from sqlalchemy.dialects.postgresql import JSONB, UUID

from runledger_sync.db.schema import job_queue, metadata

#: The actions a job_operations row records.
OPERATION_ACTIONS = ("cancel", "retry", "delete", "update")
#: RUNNING while batches run (or when the process running it stopped); then SUCCEEDED or FAILED.
OPERATION_STATUSES = ("RUNNING", "SUCCEEDED", "FAILED")

job_operations = Table(
    "job_operations",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("action", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("reason", Text, nullable=False),
    #: The filter as the caller gave it (JobFilter.to_json()).
    Column("filter", JSONB, nullable=False),
    #: What an update sets ({"priority": ..., "run_at": ...}); {} for the other actions.
    Column("changes", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("status", Text, nullable=False, server_default=text("'RUNNING'")),
    Column("matched", BigInteger, nullable=False, server_default=text("0")),
    Column("changed", BigInteger, nullable=False, server_default=text("0")),
    #: Jobs matched but refused by a lifecycle rule, by the rule's code ({"job.workflow_requeue_not_supported": 3}).
    Column("skipped", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    #: Where the walk stands: the status part being walked and the last (created_at, id) done in it.
    Column("cursor", JSONB),
    #: Why a FAILED operation stopped: the error's code.
    Column("error_code", Text),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("finished_at", DateTime(timezone=True)),
    CheckConstraint(f"action IN ({', '.join(repr(a) for a in OPERATION_ACTIONS)})", name="ck_job_operations_action"),
    CheckConstraint(f"status IN ({', '.join(repr(s) for s in OPERATION_STATUSES)})", name="ck_job_operations_status"),
    CheckConstraint("matched >= 0 AND changed >= 0", name="ck_job_operations_counts"),
)
# list_operations, newest first (operations list, the dashboard's operations page).
Index("idx_job_operations_started", job_operations.c.started_at.desc(), job_operations.c.id.desc())

# list_jobs(meta=...) and JobFilter(meta=...): containment, served by jsonb_path_ops.
Index(
    "idx_job_queue_meta",
    job_queue.c.meta,
    postgresql_using="gin",
    postgresql_ops={"meta": "jsonb_path_ops"},
)
