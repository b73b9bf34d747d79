"""Retention: indexes that let a prune read only the oldest finished rows.

- idx_job_queue_finished: (status, finished_at, id) of finished jobs outside
  workflows (SUCCEEDED, CANCELED, DEAD_LETTERED, no workflow step), the walk of
  rl.prune's job batches, oldest first.
- idx_workflow_runs_finished: (finished_at, id) of finished runs, the walk of
  its run batches.

Building the job index reads job_queue once and blocks writes to it meanwhile
(CREATE INDEX, not CONCURRENTLY, which cannot run in a migration's
transaction): on a table of many millions of rows, run this revision at a quiet
time, or create the index CONCURRENTLY by hand first under the same name and
definition (this revision then finds it and leaves it).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-19

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision: str = '0007'
down_revision: Union[str, Sequence[str], None] = '0006'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# The predicates as this revision wrote them (the schema modules may move on later, with a revision).
_FINISHED_STANDALONE = "status IN ('SUCCEEDED', 'CANCELED', 'DEAD_LETTERED') AND workflow_step_id IS NULL"
_FINISHED_RUNS = "status IN ('SUCCEEDED', 'COMPLETED_WITH_ERRORS', 'CANCELED')"


def upgrade() -> None:
    """Upgrade schema."""
    op.create_index('idx_job_queue_finished', 'job_queue', ['status', 'finished_at', 'id'], unique=False,
                    postgresql_where=sa.text(_FINISHED_STANDALONE), if_not_exists=True)
    op.create_index('idx_workflow_runs_finished', 'workflow_runs', ['finished_at', 'id'], unique=False,
                    postgresql_where=sa.text(_FINISHED_RUNS), if_not_exists=True)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index('idx_workflow_runs_finished', table_name='workflow_runs')
    op.drop_index('idx_job_queue_finished', table_name='job_queue')
