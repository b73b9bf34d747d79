"""Operator actions on many jobs: the job_operations audit table, and a GIN index over job_queue.meta.

- job_operations: one row per bulk cancel, retry, delete or update (who, why,
  the filter, counts, where its batches stand; runledger_sync.db.schema_operations).
- idx_job_queue_meta: GIN (meta jsonb_path_ops), so a metadata filter
  (containment, meta @> '{"tenant": "acme"}') reads the matching jobs only.

Building the index reads job_queue once and blocks writes to it meanwhile
(CREATE INDEX, not CONCURRENTLY, which cannot run in a migration's
transaction): on a table of many millions of rows, run this revision at a quiet
time, or create the index CONCURRENTLY by hand first under the same name and
definition (this revision then finds it and leaves it):

    CREATE INDEX CONCURRENTLY idx_job_queue_meta ON job_queue USING gin (meta jsonb_path_ops);

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from runledger_sync.db.engine import schema_of

# revision identifiers, used by Alembic.
revision: str = '0015'
down_revision: Union[str, Sequence[str], None] = "0014"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# The rules as this revision wrote them (the schema modules may move on later, with a revision).
_ACTIONS = "action IN ('cancel', 'retry', 'delete', 'update')"
_STATUSES = "status IN ('RUNNING', 'SUCCEEDED', 'FAILED')"


def upgrade() -> None:
    """Upgrade schema."""
    schema = schema_of(op.get_bind())
    op.create_table(
        'job_operations',
        sa.Column('id', sa.UUID(), nullable=False),
        sa.Column('action', sa.Text(), nullable=False),
        sa.Column('actor', sa.Text(), nullable=False),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('filter', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column('changes', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"),
                  nullable=False),
        sa.Column('status', sa.Text(), server_default=sa.text("'RUNNING'"), nullable=False),
        sa.Column('matched', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
        sa.Column('changed', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
        sa.Column('skipped', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"),
                  nullable=False),
        sa.Column('cursor', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column('error_code', sa.Text(), nullable=True),
        sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(_ACTIONS, name='ck_job_operations_action'),
        sa.CheckConstraint(_STATUSES, name='ck_job_operations_status'),
        sa.CheckConstraint('matched >= 0 AND changed >= 0', name='ck_job_operations_counts'),
        sa.PrimaryKeyConstraint('id', name='pk_job_operations'),
        schema=schema,
    )
    op.create_index('idx_job_operations_started', 'job_operations', [sa.text('started_at DESC'), sa.text('id DESC')],
                    schema=schema)
    op.create_index('idx_job_queue_meta', 'job_queue', ['meta'], schema=schema, postgresql_using='gin',
                    postgresql_ops={'meta': 'jsonb_path_ops'}, if_not_exists=True)


def downgrade() -> None:
    """Downgrade schema."""
    schema = schema_of(op.get_bind())
    op.drop_index('idx_job_queue_meta', table_name='job_queue', schema=schema)
    op.drop_index('idx_job_operations_started', table_name='job_operations', schema=schema)
    op.drop_table('job_operations', schema=schema)
