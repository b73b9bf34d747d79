"""Cheaper job rows: no updated_at triggers on the hot tables, listing indexes without leased rows, fillfactor 70.

- job_queue and job_definitions lose their updated_at triggers: the store's
  statements set updated_at = now() themselves (db.schema: ``onupdate``), which
  spares a plpgsql call on each of a job's three updates. job_schedules keeps its
  trigger, and so the trigger function stays. An UPDATE written by hand no longer
  moves updated_at unless it sets it.
- idx_job_queue_org_status_created and idx_job_queue_type_status_created are
  replaced by three indexes whose predicate leaves LEASED rows out (see
  db/schema.py): a job's claim adds no entry to them, and `jobs list`, stats and
  keyset pagination on (created_at, id) stay indexed for every status.
- job_queue gets fillfactor 70, so a job's running write finds room on its page.

Building the indexes locks job_queue against writes while they are built: on a
large table, run this revision at a quiet time.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-10

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

from runledger_sync.db.engine import schema_of

# revision identifiers, used by Alembic.
revision: str = '0003'
down_revision: Union[str, Sequence[str], None] = '0002'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

_STAMPED_TABLES = ("job_definitions", "job_queue")
_RESTING = "status <> 'LEASED'"


def upgrade() -> None:
    """Upgrade schema."""
    for table in _STAMPED_TABLES:
        op.execute(f"DROP TRIGGER IF EXISTS trg_{table}_updated_at ON {_qualified(table)}")
    op.drop_index('idx_job_queue_type_status_created', table_name='job_queue')
    op.drop_index('idx_job_queue_org_status_created', table_name='job_queue')
    op.create_index('idx_job_queue_resting_status', 'job_queue',
                    ['status', sa.literal_column('created_at DESC'), sa.literal_column('id DESC')],
                    unique=False, postgresql_where=sa.text(_RESTING))
    op.create_index('idx_job_queue_resting_type', 'job_queue',
                    ['job_type', 'status', sa.literal_column('created_at DESC'), sa.literal_column('id DESC')],
                    unique=False, postgresql_where=sa.text(_RESTING))
    op.create_index('idx_job_queue_resting_org', 'job_queue',
                    ['organization_id', 'status', sa.literal_column('created_at DESC'), sa.literal_column('id DESC')],
                    unique=False, postgresql_where=sa.text(f"organization_id IS NOT NULL AND {_RESTING}"))
    # Applies to pages written from now on; existing pages fill up as before.
    op.execute(f"ALTER TABLE {_qualified('job_queue')} SET (fillfactor = 70)")


def downgrade() -> None:
    """Downgrade schema."""
    op.execute(f"ALTER TABLE {_qualified('job_queue')} RESET (fillfactor)")
    op.drop_index('idx_job_queue_resting_org', table_name='job_queue')
    op.drop_index('idx_job_queue_resting_type', table_name='job_queue')
    op.drop_index('idx_job_queue_resting_status', table_name='job_queue')
    op.create_index('idx_job_queue_org_status_created', 'job_queue',
                    ['organization_id', 'status', sa.literal_column('created_at DESC')], unique=False)
    op.create_index('idx_job_queue_type_status_created', 'job_queue',
                    ['job_type', 'status', sa.literal_column('created_at DESC')], unique=False)
    function = _qualified("runledger_set_updated_at")
    for table in _STAMPED_TABLES:
        op.execute(
            f"CREATE TRIGGER trg_{table}_updated_at BEFORE UPDATE ON {_qualified(table)} "
            f"FOR EACH ROW EXECUTE FUNCTION {function}()"
        )


def _qualified(name: str) -> str:
    # The schema comes from the engine's configuration, never from user input.
    bind = op.get_bind()
    quote = bind.dialect.identifier_preparer.quote
    schema = schema_of(bind)
    return f"{quote(schema)}.{quote(name)}" if schema else quote(name)
