"""Unique and debounced jobs: job_queue's unique_key, unique_states, debounce_count, debounce_until.

A unique job holds its key while its status is one of its unique_states; a
debounced one while it waits. Two partial unique indexes, one for the jobs of
an organization and one for those of none, hold each key once among the rows
that hold it, so an enqueue decides a duplicate in its one statement
(INSERT ... ON CONFLICT). A trigger lets a row that comes back into its states
(a started debounced job retried, a requeue) come back without them
(runledger_sync.db.schema_unique).

The columns are nullable or have a constant default, which PostgreSQL 11 and
later add without rewriting job_queue; the indexes read job_queue once under
the lock CREATE INDEX takes, and hold no entry for an existing row. The
downgrade drops the trigger, the indexes and the columns.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06

"""
from typing import Sequence, Union

from alembic import context, op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from runledger_sync.db.engine import schema_of
from runledger_sync.db.schema_unique import drop_unique_trigger_ddl, unique_trigger_ddl

# revision identifiers, used by Alembic.
revision: str = '0013'
down_revision: Union[str, Sequence[str], None] = '0012'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# The rules as this revision wrote them (the schema modules may move on later, with a revision).
_UNIQUE_LIVE = "unique_key IS NOT NULL AND status = ANY (unique_states)"
_INDEXES = (
    ('uq_job_queue_unique_org', ['job_type', 'organization_id', 'unique_key'],
     f"organization_id IS NOT NULL AND {_UNIQUE_LIVE}"),
    ('uq_job_queue_unique_global', ['job_type', 'unique_key'], f"organization_id IS NULL AND {_UNIQUE_LIVE}"),
)


def upgrade() -> None:
    """Upgrade schema."""
    # ALTER TABLE is not rewritten by schema_translate_map: name the schema.
    schema = schema_of(op.get_bind())
    op.add_column('job_queue', sa.Column('unique_key', sa.Text(), nullable=True), schema=schema)
    op.add_column('job_queue', sa.Column('unique_states', postgresql.ARRAY(sa.Text()), nullable=True), schema=schema)
    op.add_column('job_queue', sa.Column('debounce_count', sa.Integer(), server_default=sa.text('0'), nullable=False),
                  schema=schema)
    op.add_column('job_queue', sa.Column('debounce_until', sa.DateTime(timezone=True), nullable=True), schema=schema)
    op.create_check_constraint('ck_job_queue_debounce_count_non_negative', 'job_queue', 'debounce_count >= 0',
                               schema=schema)
    for name, columns, where in _INDEXES:
        op.create_index(name, 'job_queue', columns, unique=True, schema=schema, postgresql_where=sa.text(where))
    for statement in unique_trigger_ddl(_qualified):
        op.execute(statement)


def downgrade() -> None:
    """Downgrade schema."""
    schema = schema_of(op.get_bind())
    for statement in drop_unique_trigger_ddl(_qualified):
        op.execute(statement)
    for name, _, _ in reversed(_INDEXES):
        op.drop_index(name, table_name='job_queue', schema=schema)
    op.drop_constraint('ck_job_queue_debounce_count_non_negative', 'job_queue', type_='check', schema=schema)
    for column in ('debounce_until', 'debounce_count', 'unique_states', 'unique_key'):
        op.drop_column('job_queue', column, schema=schema)


def _qualified(name: str) -> str:
    # The schema comes from the engine's configuration, never from user input. The
    # trigger names its function, so an offline script (which addresses the search
    # path it sets) names the schema it was written for too.
    bind = op.get_bind()
    quote = bind.dialect.identifier_preparer.quote
    schema = schema_of(bind) or context.config.attributes.get("schema")
    return f"{quote(schema)}.{quote(name)}" if schema else quote(name)
