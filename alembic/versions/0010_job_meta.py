"""Job metadata: job_queue.meta and workflow_runs.meta, a JSON object each (default empty).

A job's metadata (runledger_sync.core.meta) is written at enqueue and kept by
its retries, continuations and requeues; a workflow run's is given to the job
of each of its steps when the step is released.

Both columns are NOT NULL with a constant default, which PostgreSQL 11 and
later add without rewriting the tables; the CHECK that each holds an object
reads each table once, under the lock the ALTER takes. The downgrade drops
the columns, and the metadata with them.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from runledger_sync.db.engine import schema_of

# revision identifiers, used by Alembic.
revision: str = '0010'
down_revision: Union[str, Sequence[str], None] = '0009'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# The rule as this revision wrote it (the schema modules may move on later, with a revision).
_META_IS_OBJECT = "jsonb_typeof(meta) = 'object'"
_TABLES = ('job_queue', 'workflow_runs')


def upgrade() -> None:
    """Upgrade schema."""
    # ALTER TABLE is not rewritten by schema_translate_map: name the schema.
    schema = schema_of(op.get_bind())
    for table in _TABLES:
        op.add_column(table, sa.Column('meta', postgresql.JSONB(astext_type=sa.Text()),
                                       server_default=sa.text("'{}'::jsonb"), nullable=False), schema=schema)
        op.create_check_constraint(f'ck_{table}_meta_object', table, _META_IS_OBJECT, schema=schema)


def downgrade() -> None:
    """Downgrade schema."""
    schema = schema_of(op.get_bind())
    for table in reversed(_TABLES):
        op.drop_constraint(f'ck_{table}_meta_object', table, type_='check', schema=schema)
        op.drop_column(table, 'meta', schema=schema)
