"""The schedules' table (revision 0002): one row per cron schedule, read by the scheduler's tick."""

from __future__ import annotations

from sqlalchemy import Boolean, CheckConstraint, Column, DateTime, ForeignKey, Index, Integer, Table, Text, UniqueConstraint, text
from sqlalchemy.dialects.postgresql import JSONB, UUID

from runledger_sync.db.schema import EMPTY_JSON, metadata, timestamp_columns

#: Where a schedule was written: declared in code (upserted by sync_definitions,
#: so one removed from code can be told apart) or through the API and the CLI.
SCHEDULE_SOURCES = ("code", "api")

job_schedules = Table(
    "job_schedules",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("name", Text, nullable=False),
    Column(
        "job_type",
        Text,
        ForeignKey("job_definitions.job_type", name="fk_job_schedules_job_type"),
        nullable=False,
    ),
    Column("organization_id", Text),
    Column("payload_template", JSONB, nullable=False, server_default=EMPTY_JSON),
    Column("cron_expr", Text, nullable=False),
    # Any IANA zone name, checked in Python (the spec's UTC-only CHECK, extended).
    Column("timezone", Text, nullable=False, server_default=text("'UTC'")),
    Column("is_active", Boolean, nullable=False, server_default=text("true")),
    Column("next_fire_at", DateTime(timezone=True), nullable=False),
    Column("last_fired_at", DateTime(timezone=True)),
    Column("max_jitter_seconds", Integer, nullable=False, server_default=text("0")),
    Column("created_by_user_id", Text),
    Column("source", Text, nullable=False, server_default=text("'api'")),
    Column("last_error_code", Text),
    Column("last_error_message", Text),
    Column("last_error_at", DateTime(timezone=True)),
    *timestamp_columns(),
    UniqueConstraint("name", name="uq_job_schedules_name"),
    CheckConstraint("btrim(name) <> ''", name="ck_job_schedules_name_not_blank"),
    CheckConstraint("btrim(timezone) <> ''", name="ck_job_schedules_timezone_not_blank"),
    CheckConstraint("max_jitter_seconds >= 0", name="ck_job_schedules_max_jitter_non_negative"),
    CheckConstraint("source IN ('code', 'api')", name="ck_job_schedules_source"),
)
# The tick reads the head of this index only: due schedules, oldest first.
Index("idx_job_schedules_due", job_schedules.c.next_fire_at, postgresql_where=text("is_active"))

