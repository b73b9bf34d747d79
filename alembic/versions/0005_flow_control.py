"""Flow control: queues with pause and limits, concurrency keys, rate limits.

- job_queues: one row per queue with its settings (paused, global_limit,
  key_limit, rate limit); the row ``default`` is created here.
- job_definitions.queue and job_queue.queue (default ``default``, foreign keys to
  job_queues); job_queue.execution_resource_key (the spec's, non-blank, at most
  512 bytes) and job_queue.blocked_by_key.
- idx_job_queue_claim leads with the queue and leaves out jobs held back by their
  key; idx_job_queue_key_live holds keyed PENDING and LEASED jobs, the live ones
  apart from the held-back ones, in claim order.
- job_queue_rate_claims: the claims inside each rate window.
- job_workers: which queues and types each live worker serves.
- The key triggers (see runledger_sync/db/schema_queues.py): fire for keyed rows only.

Adding NOT NULL columns with constant defaults does not rewrite job_queue; the
foreign key is checked against existing rows, and the claim index is rebuilt,
which locks job_queue against writes while it is built: on a large table, run
this revision at a quiet time. The downgrade keeps every job and drops the queue
settings (pauses and limits), the jobs' and types' queue assignments, the
concurrency keys, the rate log and the worker rows: a job held back by its key
becomes a plain PENDING job, and an upgrade after it puts every job in
``default`` without a key.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05

"""
from typing import Sequence, Union

from alembic import context, op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from runledger_sync.db.engine import schema_of
from runledger_sync.db.schema_queues import KEY_UNDER_WAY_0005, drop_key_trigger_ddl, key_trigger_ddl

# revision identifiers, used by Alembic.
revision: str = '0005'
down_revision: Union[str, Sequence[str], None] = '0004'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

_CLAIMABLE = "status = 'PENDING' AND NOT blocked_by_key"
_KEY_LIVE = "execution_resource_key IS NOT NULL AND status IN ('PENDING', 'LEASED')"
_CLAIM_ORDER = [sa.literal_column('priority DESC'), 'next_run_at', 'created_at', 'id']


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table('job_queues',
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('paused', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('paused_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('global_limit', sa.Integer(), nullable=True),
    sa.Column('key_limit', sa.Integer(), server_default=sa.text('1'), nullable=True),
    sa.Column('rate_limit_count', sa.Integer(), nullable=True),
    sa.Column('rate_limit_seconds', sa.Float(), nullable=True),
    sa.Column('rate_limit_per_key', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("btrim(name) <> ''", name='ck_job_queues_name_not_blank'),
    sa.CheckConstraint('global_limit IS NULL OR global_limit > 0', name='ck_job_queues_global_limit_positive'),
    sa.CheckConstraint('key_limit IS NULL OR key_limit > 0', name='ck_job_queues_key_limit_positive'),
    sa.CheckConstraint('(rate_limit_count IS NULL) = (rate_limit_seconds IS NULL) '
                       'AND (rate_limit_count IS NULL OR (rate_limit_count > 0 AND rate_limit_seconds > 0))',
                       name='ck_job_queues_rate_limit'),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_job_queues'))
    )
    # A lightweight table is not rewritten by schema_translate_map either: name the schema.
    queues = sa.table('job_queues', sa.column('name', sa.Text()), schema=schema_of(op.get_bind()))
    op.bulk_insert(queues, [{'name': 'default'}])
    op.create_table('job_queue_rate_claims',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('queue', sa.Text(), nullable=False),
    sa.Column('concurrency_key', sa.Text(), nullable=True),
    sa.Column('claimed_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_job_queue_rate_claims'))
    )
    op.create_index('idx_job_queue_rate_claims_window', 'job_queue_rate_claims', ['queue', 'claimed_at'], unique=False)
    op.create_index('idx_job_queue_rate_claims_key_window', 'job_queue_rate_claims',
                    ['queue', 'concurrency_key', 'claimed_at'], unique=False,
                    postgresql_where=sa.text('concurrency_key IS NOT NULL'))
    op.create_table('job_workers',
    sa.Column('worker_id', sa.Text(), nullable=False),
    sa.Column('hostname', sa.Text(), nullable=True),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('queues', postgresql.ARRAY(sa.Text()), nullable=True),
    sa.Column('job_types', postgresql.ARRAY(sa.Text()), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('last_seen_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('worker_id', name=op.f('pk_job_workers'))
    )
    # ALTER TABLE is not rewritten by schema_translate_map: name the schema.
    schema = schema_of(op.get_bind())
    op.add_column('job_definitions', sa.Column('queue', sa.Text(), server_default=sa.text("'default'"),
                                               nullable=False), schema=schema)
    op.create_foreign_key('fk_job_definitions_queue', 'job_definitions', 'job_queues', ['queue'], ['name'],
                          source_schema=schema, referent_schema=schema)
    op.add_column('job_queue', sa.Column('queue', sa.Text(), server_default=sa.text("'default'"), nullable=False),
                  schema=schema)
    op.add_column('job_queue', sa.Column('execution_resource_key', sa.Text(), nullable=True), schema=schema)
    op.add_column('job_queue', sa.Column('blocked_by_key', sa.Boolean(), server_default=sa.text('false'),
                                         nullable=False), schema=schema)
    op.create_foreign_key('fk_job_queue_queue', 'job_queue', 'job_queues', ['queue'], ['name'],
                          source_schema=schema, referent_schema=schema)
    op.create_check_constraint('ck_job_queue_execution_resource_key', 'job_queue',
                               "execution_resource_key IS NULL OR (btrim(execution_resource_key) <> '' "
                               "AND octet_length(execution_resource_key) <= 512)", schema=schema)
    op.drop_index('idx_job_queue_claim', table_name='job_queue', postgresql_where=sa.text("status = 'PENDING'"))
    op.create_index('idx_job_queue_claim', 'job_queue', ['queue', *_CLAIM_ORDER], unique=False,
                    postgresql_where=sa.text(_CLAIMABLE))
    op.create_index('idx_job_queue_key_live', 'job_queue', ['queue', 'execution_resource_key', 'blocked_by_key', *_CLAIM_ORDER],
                    unique=False, postgresql_where=sa.text(_KEY_LIVE))
    for statement in key_trigger_ddl(_qualified, under_way=KEY_UNDER_WAY_0005):
        op.execute(statement)


def downgrade() -> None:
    """Downgrade schema."""
    for statement in drop_key_trigger_ddl(_qualified):
        op.execute(statement)
    op.drop_index('idx_job_queue_key_live', table_name='job_queue', postgresql_where=sa.text(_KEY_LIVE))
    op.drop_index('idx_job_queue_claim', table_name='job_queue', postgresql_where=sa.text(_CLAIMABLE))
    op.create_index('idx_job_queue_claim', 'job_queue', ['status', *_CLAIM_ORDER], unique=False,
                    postgresql_where=sa.text("status = 'PENDING'"))
    schema = schema_of(op.get_bind())
    op.drop_constraint('ck_job_queue_execution_resource_key', 'job_queue', type_='check', schema=schema)
    op.drop_constraint('fk_job_queue_queue', 'job_queue', type_='foreignkey', schema=schema)
    op.drop_column('job_queue', 'blocked_by_key', schema=schema)
    op.drop_column('job_queue', 'execution_resource_key', schema=schema)
    op.drop_column('job_queue', 'queue', schema=schema)
    op.drop_constraint('fk_job_definitions_queue', 'job_definitions', type_='foreignkey', schema=schema)
    op.drop_column('job_definitions', 'queue', schema=schema)
    op.drop_index('idx_job_queue_rate_claims_key_window', table_name='job_queue_rate_claims',
                  postgresql_where=sa.text('concurrency_key IS NOT NULL'))
    op.drop_index('idx_job_queue_rate_claims_window', table_name='job_queue_rate_claims')
    op.drop_table('job_queue_rate_claims')
    op.drop_table('job_workers')
    op.drop_table('job_queues')


def _qualified(name: str) -> str:
    # The schema comes from the engine's configuration, never from user input. The
    # key functions' statements name their tables, so an offline script (which
    # addresses the search path it sets) names the schema it was written for too.
    bind = op.get_bind()
    quote = bind.dialect.identifier_preparer.quote
    schema = schema_of(bind) or context.config.attributes.get("schema")
    return f"{quote(schema)}.{quote(name)}" if schema else quote(name)
