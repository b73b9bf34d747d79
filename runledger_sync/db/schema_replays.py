"""Audited replays' table (revision 0016, spec ``job_replays``): one row per operator replay of a finished job.

A row is written in the transaction of the requeue it records, so a job never
runs again by a replay without its row, nor the row stands without the run. The
key is unique per job: the index is what a repeated request finds its replay by
(:mod:`runledger_sync.store.admin.replays`). A job's replays go with the job
(ON DELETE CASCADE), as its events and attempts do.
"""

from __future__ import annotations

from sqlalchemy import CheckConstraint, Column, DateTime, ForeignKey, Index, Integer, Table, Text, UniqueConstraint
from sqlalchemy.dialects.postgresql import UUID

from runledger_sync.core.states import JobStatus
from runledger_sync.db.schema import NOW, metadata, one_of

job_replays = Table(
    "job_replays",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column(
        "job_id",
        UUID(as_uuid=True),
        ForeignKey("job_queue.id", ondelete="CASCADE", name="fk_job_replays_job_id"),
        nullable=False,
    ),
    Column("replay_key", Text, nullable=False),
    Column("actor", Text),
    Column("reason", Text, nullable=False),
    Column("expected_status", Text),
    Column("expected_run_number", Integer),
    #: The run the replay started.
    Column("run_number", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=NOW),
    UniqueConstraint("job_id", "replay_key", name="uq_job_replays_job_id_replay_key"),
    CheckConstraint("btrim(replay_key) <> ''", name="ck_job_replays_replay_key_not_blank"),
    CheckConstraint("btrim(reason) <> ''", name="ck_job_replays_reason_not_blank"),
    CheckConstraint(f"expected_status IS NULL OR {one_of('expected_status', JobStatus)}",
                    name="ck_job_replays_expected_status"),
    CheckConstraint("run_number > 1", name="ck_job_replays_run_number"),
)
# Every replay, newest first (list_replays without a job); a job's own are found by the unique index.
Index("idx_job_replays_created_at", job_replays.c.created_at.desc())
