"""Audited replays: job_replays, one row per operator replay of a finished job (spec job_replays).

A new, empty table beside job_queue (runledger_sync.db.schema_replays): the
revision reads no other and locks job_queue only for the foreign key's
creation. The downgrade drops the table and the replays recorded in it.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision: str = '0016'
down_revision: Union[str, Sequence[str], None] = "0015"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# The rules as this revision wrote them (the schema module may move on later, with a revision).
_EXPECTED_STATUS = ("expected_status IS NULL OR expected_status IN "
                    "('PENDING', 'LEASED', 'SUCCEEDED', 'DEAD_LETTERED', 'CANCELED')")


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        'job_replays',
        sa.Column('id', postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column('job_id', postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column('replay_key', sa.Text(), nullable=False),
        sa.Column('actor', sa.Text(), nullable=True),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('expected_status', sa.Text(), nullable=True),
        sa.Column('expected_run_number', sa.Integer(), nullable=True),
        sa.Column('run_number', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.CheckConstraint("btrim(replay_key) <> ''", name='ck_job_replays_replay_key_not_blank'),
        sa.CheckConstraint("btrim(reason) <> ''", name='ck_job_replays_reason_not_blank'),
        sa.CheckConstraint(_EXPECTED_STATUS, name='ck_job_replays_expected_status'),
        sa.CheckConstraint('run_number > 1', name='ck_job_replays_run_number'),
        sa.ForeignKeyConstraint(['job_id'], ['job_queue.id'], name='fk_job_replays_job_id', ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name='pk_job_replays'),
        sa.UniqueConstraint('job_id', 'replay_key', name='uq_job_replays_job_id_replay_key'),
    )
    op.create_index('idx_job_replays_created_at', 'job_replays', [sa.literal_column('created_at DESC')], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index('idx_job_replays_created_at', table_name='job_replays')
    op.drop_table('job_replays')
