"""Appends to a running workflow run: workflow_run_mutations.

One row per append applied to a run (spec section 11), keyed by the run and the
append's mutation key, so a retried append finds it and changes nothing. It
keeps the window the steps were appended at, their keys, and a digest of the
request to compare a retry with. Rows go with their run (ON DELETE CASCADE).

A new table: nothing existing is rewritten or locked beyond workflow_runs'
brief share lock for the foreign key.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision: str = '0012'
down_revision: Union[str, Sequence[str], None] = '0011'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        'workflow_run_mutations',
        sa.Column('run_id', sa.UUID(), nullable=False),
        sa.Column('mutation_key', sa.Text(), nullable=False),
        sa.Column('window_step_key', sa.Text(), nullable=False),
        sa.Column('step_keys', postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column('request_digest', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.CheckConstraint("btrim(mutation_key) <> ''", name='ck_workflow_run_mutations_key_not_blank'),
        sa.ForeignKeyConstraint(['run_id'], ['workflow_runs.id'], name='fk_workflow_run_mutations_run_id',
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('run_id', 'mutation_key', name=op.f('pk_workflow_run_mutations')),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table('workflow_run_mutations')
