"""Batches: table job_batches, job_queue.batch_id, and the triggers that count members and finish a batch.

A batch's counts are kept on its row by two triggers on job_queue that fire
only for members (batch_id IS NOT NULL) and, on an update, only when the
status moves between the pending side and an ended status; plain jobs, claims
and retries do not call them (runledger_sync.db.schema_batches).

job_queue.batch_id is a nullable column with no default, which PostgreSQL adds
without rewriting job_queue; its partial index holds no entry for an existing
row. The downgrade drops the triggers, the functions, the index, the column
and the table.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06

"""
from typing import Sequence, Union

from alembic import context, op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from runledger_sync.db.engine import schema_of
from runledger_sync.db.schema_batches import batch_trigger_ddl, drop_batch_trigger_ddl

# revision identifiers, used by Alembic.
revision: str = '0014'
down_revision: Union[str, Sequence[str], None] = "0013"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

_FINISHED = "status IN ('SUCCEEDED', 'COMPLETED_WITH_ERRORS', 'CANCELED')"


def upgrade() -> None:
    """Upgrade schema."""
    # ALTER TABLE is not rewritten by schema_translate_map: name the schema.
    schema = schema_of(op.get_bind())
    op.create_table(
        'job_batches',
        sa.Column('id', sa.UUID(), nullable=False),
        sa.Column('status', sa.Text(), server_default=sa.text("'OPEN'"), nullable=False),
        sa.Column('total', sa.Integer(), server_default=sa.text('0'), nullable=False),
        sa.Column('pending', sa.Integer(), server_default=sa.text('0'), nullable=False),
        sa.Column('succeeded', sa.Integer(), server_default=sa.text('0'), nullable=False),
        sa.Column('failed', sa.Integer(), server_default=sa.text('0'), nullable=False),
        sa.Column('canceled', sa.Integer(), server_default=sa.text('0'), nullable=False),
        sa.Column('meta', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"),
                  nullable=False),
        sa.Column('on_success_type', sa.Text(), nullable=True),
        sa.Column('on_success_payload', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column('on_success_job_id', sa.UUID(), nullable=True),
        sa.Column('on_complete_type', sa.Text(), nullable=True),
        sa.Column('on_complete_payload', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column('on_complete_job_id', sa.UUID(), nullable=True),
        sa.Column('status_reason', sa.Text(), nullable=True),
        sa.Column('closed_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.CheckConstraint("status IN ('OPEN', 'CLOSED', 'SUCCEEDED', 'COMPLETED_WITH_ERRORS', 'CANCELED')",
                           name='ck_job_batches_status'),
        sa.CheckConstraint("pending >= 0 AND succeeded >= 0 AND failed >= 0 AND canceled >= 0 "
                           "AND total = pending + succeeded + failed + canceled", name='ck_job_batches_counts'),
        sa.CheckConstraint("jsonb_typeof(meta) = 'object'", name='ck_job_batches_meta_object'),
        sa.ForeignKeyConstraint(['on_success_type'], ['job_definitions.job_type'],
                                name='fk_job_batches_on_success_type'),
        sa.ForeignKeyConstraint(['on_complete_type'], ['job_definitions.job_type'],
                                name='fk_job_batches_on_complete_type'),
        sa.PrimaryKeyConstraint('id', name='pk_job_batches'),
        schema=schema,
    )
    op.create_index('idx_job_batches_created', 'job_batches', [sa.text('created_at DESC'), sa.text('id DESC')],
                    schema=schema)
    op.create_index('idx_job_batches_status_created', 'job_batches',
                    ['status', sa.text('created_at DESC'), sa.text('id DESC')], schema=schema)
    op.create_index('idx_job_batches_finished', 'job_batches', ['finished_at', 'id'], schema=schema,
                    postgresql_where=sa.text(_FINISHED))
    op.add_column('job_queue', sa.Column('batch_id', sa.UUID(), nullable=True), schema=schema)
    op.create_foreign_key('fk_job_queue_batch_id', 'job_queue', 'job_batches', ['batch_id'], ['id'],
                          source_schema=schema, referent_schema=schema)
    op.create_index('idx_job_queue_batch', 'job_queue', ['batch_id', 'created_at', 'id'], schema=schema,
                    postgresql_where=sa.text('batch_id IS NOT NULL'))
    for statement in batch_trigger_ddl(_qualified):
        op.execute(statement)


def downgrade() -> None:
    """Downgrade schema."""
    schema = schema_of(op.get_bind())
    for statement in drop_batch_trigger_ddl(_qualified):
        op.execute(statement)
    op.drop_index('idx_job_queue_batch', table_name='job_queue', schema=schema)
    op.drop_constraint('fk_job_queue_batch_id', 'job_queue', type_='foreignkey', schema=schema)
    op.drop_column('job_queue', 'batch_id', schema=schema)
    op.drop_table('job_batches', schema=schema)


def _qualified(name: str) -> str:
    # The schema comes from the engine's configuration, never from user input. The
    # functions name the tables they write, so a trigger fired under any search path
    # (and an offline script, which sets its own) writes the schema it was made for.
    bind = op.get_bind()
    quote = bind.dialect.identifier_preparer.quote
    schema = schema_of(bind) or context.config.attributes.get("schema")
    return f"{quote(schema)}.{quote(name)}" if schema else quote(name)
