"""Dashboard rollup: job_rollup_minutes, one row per queue per closed minute.

The overview's charts read it instead of the finished jobs; the workers'
sampler writes it once a minute and the pruner deletes it by
Retention.dashboard_rollup. A new, empty table: the revision reads no other.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision: str = '0009'
down_revision: Union[str, Sequence[str], None] = '0008'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    zero = sa.text('0')
    op.create_table(
        'job_rollup_minutes',
        sa.Column('minute', sa.DateTime(timezone=True), nullable=False),
        sa.Column('queue', sa.Text(), nullable=False),
        sa.Column('succeeded', sa.Integer(), server_default=zero, nullable=False),
        sa.Column('retried', sa.Integer(), server_default=zero, nullable=False),
        sa.Column('dead_lettered', sa.Integer(), server_default=zero, nullable=False),
        sa.Column('canceled', sa.Integer(), server_default=zero, nullable=False),
        sa.Column('ready', sa.Integer(), server_default=zero, nullable=False),
        sa.Column('oldest_due_wait_seconds', sa.Float(), nullable=True),
        sa.Column('sampled_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.PrimaryKeyConstraint('minute', 'queue', name='pk_job_rollup_minutes'),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table('job_rollup_minutes')
