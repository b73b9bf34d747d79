"""Create the queue tables: definitions, queue, attempts, events, dead letters.

Revision ID: 0001
Revises:
Create Date: 2026-12-02

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from runledger_sync.db.engine import schema_of

# revision identifiers, used by Alembic.
revision: str = '0001'
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table('job_definitions',
    sa.Column('job_type', sa.Text(), nullable=False),
    sa.Column('version', sa.Integer(), server_default=sa.text('1'), nullable=False),
    sa.Column('max_attempts', sa.Integer(), server_default=sa.text('8'), nullable=False),
    sa.Column('default_timeout_seconds', sa.Integer(), server_default=sa.text('900'), nullable=False),
    sa.Column('default_priority', sa.Integer(), server_default=sa.text('100'), nullable=False),
    sa.Column('is_enabled', sa.Boolean(), server_default=sa.text('true'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("btrim(job_type) <> ''", name='ck_job_definitions_job_type_not_blank'),
    sa.CheckConstraint('default_timeout_seconds > 0', name='ck_job_definitions_timeout_positive'),
    sa.CheckConstraint('max_attempts > 0', name='ck_job_definitions_max_attempts_positive'),
    sa.CheckConstraint('version > 0', name='ck_job_definitions_version_positive'),
    sa.PrimaryKeyConstraint('job_type', name=op.f('pk_job_definitions'))
    )
    op.create_table('job_queue',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('job_type', sa.Text(), nullable=False),
    sa.Column('organization_id', sa.Text(), nullable=True),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
    sa.Column('status', sa.Text(), server_default=sa.text("'PENDING'"), nullable=False),
    sa.Column('priority', sa.Integer(), server_default=sa.text('100'), nullable=False),
    sa.Column('run_number', sa.Integer(), server_default=sa.text('1'), nullable=False),
    sa.Column('attempt', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('timeout_seconds', sa.Integer(), server_default=sa.text('900'), nullable=False),
    sa.Column('next_run_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('worker_id', sa.Text(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('stage', sa.Text(), server_default=sa.text("'queued'"), nullable=False),
    sa.Column('progress_done', sa.BigInteger(), nullable=True),
    sa.Column('progress_total', sa.BigInteger(), nullable=True),
    sa.Column('progress_pct', sa.Numeric(), sa.Computed('CASE WHEN progress_total > 0 THEN round((progress_done::numeric * 100) / progress_total, 2) END', persisted=True), nullable=True),
    sa.Column('checkpoint', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('output', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('idempotency_key', sa.Text(), nullable=True),
    sa.Column('enqueue_request', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('status_reason', sa.Text(), nullable=True),
    sa.Column('last_error_code', sa.Text(), nullable=True),
    sa.Column('last_error_message', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("idempotency_key IS NULL OR btrim(idempotency_key) <> ''", name='ck_job_queue_idempotency_key_not_blank'),
    sa.CheckConstraint("stage IN ('queued', 'scheduled', 'running', 'completed')", name='ck_job_queue_stage'),
    sa.CheckConstraint("status IN ('PENDING', 'LEASED', 'SUCCEEDED', 'DEAD_LETTERED', 'CANCELED')", name='ck_job_queue_status'),
    sa.CheckConstraint('(progress_done IS NULL OR progress_done >= 0) AND (progress_total IS NULL OR progress_total >= 0) AND (progress_done IS NULL OR progress_total IS NULL OR progress_done <= progress_total)', name='ck_job_queue_progress'),
    sa.CheckConstraint('attempt >= 0', name='ck_job_queue_attempt_non_negative'),
    sa.CheckConstraint('idempotency_key IS NULL OR enqueue_request IS NOT NULL', name='ck_job_queue_idempotency_enqueue_request'),
    sa.CheckConstraint('max_attempts > 0', name='ck_job_queue_max_attempts_positive'),
    sa.CheckConstraint('run_number > 0', name='ck_job_queue_run_number_positive'),
    sa.CheckConstraint('timeout_seconds > 0', name='ck_job_queue_timeout_positive'),
    sa.ForeignKeyConstraint(['job_type'], ['job_definitions.job_type'], name='fk_job_queue_job_type'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_job_queue'))
    )
    op.create_index('idx_job_queue_claim', 'job_queue', ['status', sa.literal_column('priority DESC'), 'next_run_at', 'created_at', 'id'], unique=False, postgresql_where=sa.text("status = 'PENDING'"))
    op.create_index('idx_job_queue_leased_expiry', 'job_queue', ['lease_expires_at'], unique=False, postgresql_where=sa.text("status = 'LEASED'"))
    op.create_index('idx_job_queue_org_status_created', 'job_queue', ['organization_id', 'status', sa.literal_column('created_at DESC')], unique=False)
    op.create_index('idx_job_queue_type_status_created', 'job_queue', ['job_type', 'status', sa.literal_column('created_at DESC')], unique=False)
    op.create_index('uq_job_queue_type_idempotency_global', 'job_queue', ['job_type', 'idempotency_key'], unique=True, postgresql_where=sa.text('organization_id IS NULL AND idempotency_key IS NOT NULL'))
    op.create_index('uq_job_queue_type_idempotency_org', 'job_queue', ['job_type', 'organization_id', 'idempotency_key'], unique=True, postgresql_where=sa.text('organization_id IS NOT NULL AND idempotency_key IS NOT NULL'))
    op.create_table('job_attempts',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('job_id', sa.UUID(), nullable=False),
    sa.Column('run_number', sa.Integer(), server_default=sa.text('1'), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('worker_id', sa.Text(), nullable=True),
    sa.Column('leased_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('outcome', sa.Text(), nullable=True),
    sa.Column('error_code', sa.Text(), nullable=True),
    sa.Column('error_message', sa.Text(), nullable=True),
    sa.Column('retry_delay_ms', sa.BigInteger(), nullable=True),
    sa.Column('claim_origin', sa.Text(), server_default=sa.text("'DIRECT'"), nullable=False),
    sa.Column('execution_started_persisted_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("claim_origin IN ('DIRECT', 'WORKER_PRESTART')", name='ck_job_attempts_claim_origin'),
    sa.CheckConstraint("outcome IS NULL OR outcome IN ('RETRYABLE', 'TIMEOUT', 'LEASE_EXPIRED', 'TERMINAL', 'PANICKED')", name='ck_job_attempts_outcome'),
    sa.CheckConstraint('attempt > 0', name='ck_job_attempts_attempt_positive'),
    sa.CheckConstraint('retry_delay_ms IS NULL OR retry_delay_ms >= 0', name='ck_job_attempts_retry_delay'),
    sa.ForeignKeyConstraint(['job_id'], ['job_queue.id'], name='fk_job_attempts_job_id', ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_job_attempts')),
    sa.UniqueConstraint('job_id', 'run_number', 'attempt', name='uq_job_attempts_job_run_attempt')
    )
    op.create_index('idx_job_attempts_job_run_created', 'job_attempts', ['job_id', 'run_number', sa.literal_column('created_at DESC')], unique=False)
    op.create_table('job_dead_letters',
    sa.Column('job_id', sa.UUID(), nullable=False),
    sa.Column('job_type', sa.Text(), nullable=False),
    sa.Column('organization_id', sa.Text(), nullable=True),
    sa.Column('run_number', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('error_code', sa.Text(), nullable=True),
    sa.Column('error_message', sa.Text(), nullable=True),
    sa.Column('payload_snapshot', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('checkpoint_snapshot', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('failed_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('attempt > 0', name='ck_job_dead_letters_attempt_positive'),
    sa.ForeignKeyConstraint(['job_id'], ['job_queue.id'], name='fk_job_dead_letters_job_id', ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id', name=op.f('pk_job_dead_letters'))
    )
    op.create_index('idx_job_dead_letters_failed_at', 'job_dead_letters', [sa.literal_column('failed_at DESC')], unique=False)
    op.create_table('job_events',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('job_id', sa.UUID(), nullable=False),
    sa.Column('run_number', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=True),
    sa.Column('event_type', sa.Text(), nullable=False),
    sa.Column('stage', sa.Text(), nullable=True),
    sa.Column('progress_done', sa.BigInteger(), nullable=True),
    sa.Column('progress_total', sa.BigInteger(), nullable=True),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
    sa.Column('occurred_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("event_type IN ('ENQUEUED', 'LEASED', 'HEARTBEAT', 'STAGE_CHANGED', 'PROGRESS', 'RETRY_SCHEDULED', 'SUCCEEDED', 'FAILED', 'DEAD_LETTERED', 'CANCELED', 'REQUEUED')", name='ck_job_events_event_type'),
    sa.CheckConstraint('attempt IS NULL OR attempt > 0', name='ck_job_events_attempt_positive'),
    sa.ForeignKeyConstraint(['job_id'], ['job_queue.id'], name='fk_job_events_job_id', ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_job_events'))
    )
    op.create_index('idx_job_events_job_run_id', 'job_events', ['job_id', 'run_number', 'id'], unique=False)
    op.create_index('idx_job_events_type_occurred', 'job_events', ['event_type', sa.literal_column('occurred_at DESC')], unique=False)
    _create_updated_at_triggers()


def downgrade() -> None:
    """Downgrade schema."""
    _drop_updated_at_triggers()
    op.drop_index('idx_job_events_type_occurred', table_name='job_events')
    op.drop_index('idx_job_events_job_run_id', table_name='job_events')
    op.drop_table('job_events')
    op.drop_index('idx_job_dead_letters_failed_at', table_name='job_dead_letters')
    op.drop_table('job_dead_letters')
    op.drop_index('idx_job_attempts_job_run_created', table_name='job_attempts')
    op.drop_table('job_attempts')
    op.drop_index('uq_job_queue_type_idempotency_org', table_name='job_queue', postgresql_where=sa.text('organization_id IS NOT NULL AND idempotency_key IS NOT NULL'))
    op.drop_index('uq_job_queue_type_idempotency_global', table_name='job_queue', postgresql_where=sa.text('organization_id IS NULL AND idempotency_key IS NOT NULL'))
    op.drop_index('idx_job_queue_type_status_created', table_name='job_queue')
    op.drop_index('idx_job_queue_org_status_created', table_name='job_queue')
    op.drop_index('idx_job_queue_leased_expiry', table_name='job_queue', postgresql_where=sa.text("status = 'LEASED'"))
    op.drop_index('idx_job_queue_claim', table_name='job_queue', postgresql_where=sa.text("status = 'PENDING'"))
    op.drop_table('job_queue')
    op.drop_table('job_definitions')


UPDATED_AT_TABLES = ("job_definitions", "job_queue")


def _qualified(name: str) -> str:
    # Raw DDL is not rewritten by schema_translate_map, so qualify it by hand;
    # the schema comes from the engine's configuration, never from user input.
    bind = op.get_bind()
    quote = bind.dialect.identifier_preparer.quote
    schema = schema_of(bind)
    return f"{quote(schema)}.{quote(name)}" if schema else quote(name)


def _create_updated_at_triggers() -> None:
    function = _qualified("runledger_set_updated_at")
    op.execute(
        f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN NEW.updated_at := now(); RETURN NEW; END $$"
    )
    for table in UPDATED_AT_TABLES:
        op.execute(
            f"CREATE TRIGGER trg_{table}_updated_at BEFORE UPDATE ON {_qualified(table)} "
            f"FOR EACH ROW EXECUTE FUNCTION {function}()"
        )


def _drop_updated_at_triggers() -> None:
    for table in UPDATED_AT_TABLES:
        op.execute(f"DROP TRIGGER IF EXISTS trg_{table}_updated_at ON {_qualified(table)}")
    op.execute(f"DROP FUNCTION IF EXISTS {_qualified('runledger_set_updated_at')}()")
