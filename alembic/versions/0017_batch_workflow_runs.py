"""Batches take workflow runs: workflow_runs.batch_id, and the run's member triggers.

A run is ONE member of its batch, pending until it reaches a terminal status:
its step jobs are released one by one, often after the batch closed, so they are
not members themselves. The run's triggers call the jobs' member-counting
function, which this revision replaces with one that knows a run's statuses
too (runledger_sync.db.schema_batches).

workflow_runs.batch_id is a nullable column with no default, added without a
rewrite; its partial index holds no entry for an existing run. Deleting a batch
sets its runs' batch_id to NULL (the runs have their own retention). The
downgrade drops the triggers, the index and the column; the function stays as
this revision wrote it, which counts jobs as before.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06

"""
from typing import Sequence, Union

from alembic import context, op
import sqlalchemy as sa

from runledger_sync.db.engine import schema_of
from runledger_sync.db.schema_batches import drop_run_member_trigger_ddl, member_function_ddl, run_member_trigger_ddl

# revision identifiers, used by Alembic.
revision: str = '0017'
down_revision: Union[str, Sequence[str], None] = "0016"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    schema = schema_of(op.get_bind())
    op.add_column('workflow_runs', sa.Column('batch_id', sa.UUID(), nullable=True), schema=schema)
    op.create_foreign_key('fk_workflow_runs_batch_id', 'workflow_runs', 'job_batches', ['batch_id'], ['id'],
                          source_schema=schema, referent_schema=schema, ondelete='SET NULL')
    op.create_index('idx_workflow_runs_batch', 'workflow_runs', ['batch_id', 'created_at', 'id'], schema=schema,
                    postgresql_where=sa.text('batch_id IS NOT NULL'))
    op.execute(member_function_ddl(_qualified))
    for statement in run_member_trigger_ddl(_qualified):
        op.execute(statement)


def downgrade() -> None:
    """Downgrade schema."""
    schema = schema_of(op.get_bind())
    for statement in drop_run_member_trigger_ddl(_qualified):
        op.execute(statement)
    op.drop_index('idx_workflow_runs_batch', table_name='workflow_runs', schema=schema)
    op.drop_constraint('fk_workflow_runs_batch_id', 'workflow_runs', type_='foreignkey', schema=schema)
    op.drop_column('workflow_runs', 'batch_id', schema=schema)


def _qualified(name: str) -> str:
    # As revision 0014 names the objects: the schema comes from the engine's configuration,
    # never from user input, and the function names the tables it writes.
    bind = op.get_bind()
    quote = bind.dialect.identifier_preparer.quote
    schema = schema_of(bind) or context.config.attributes.get("schema")
    return f"{quote(schema)}.{quote(name)}" if schema else quote(name)
