"""Create job_schedules: cron schedules that the scheduler loop turns into jobs.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-04

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from runledger_sync.db.engine import schema_of

# revision identifiers, used by Alembic.
revision: str = '0002'
down_revision: Union[str, Sequence[str], None] = '0001'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        'job_schedules',
        sa.Column('id', sa.UUID(), nullable=False),
        sa.Column('name', sa.Text(), nullable=False),
        sa.Column('job_type', sa.Text(), nullable=False),
        sa.Column('organization_id', sa.Text(), nullable=True),
        sa.Column('payload_template', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column('cron_expr', sa.Text(), nullable=False),
        sa.Column('timezone', sa.Text(), server_default=sa.text("'UTC'"), nullable=False),
        sa.Column('is_active', sa.Boolean(), server_default=sa.text('true'), nullable=False),
        sa.Column('next_fire_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('last_fired_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('max_jitter_seconds', sa.Integer(), server_default=sa.text('0'), nullable=False),
        sa.Column('created_by_user_id', sa.Text(), nullable=True),
        sa.Column('source', sa.Text(), server_default=sa.text("'api'"), nullable=False),
        sa.Column('last_error_code', sa.Text(), nullable=True),
        sa.Column('last_error_message', sa.Text(), nullable=True),
        sa.Column('last_error_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.CheckConstraint("btrim(name) <> ''", name='ck_job_schedules_name_not_blank'),
        sa.CheckConstraint("btrim(timezone) <> ''", name='ck_job_schedules_timezone_not_blank'),
        sa.CheckConstraint('max_jitter_seconds >= 0', name='ck_job_schedules_max_jitter_non_negative'),
        sa.CheckConstraint("source IN ('code', 'api')", name='ck_job_schedules_source'),
        sa.ForeignKeyConstraint(['job_type'], ['job_definitions.job_type'], name='fk_job_schedules_job_type'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_job_schedules')),
        sa.UniqueConstraint('name', name='uq_job_schedules_name'),
    )
    op.create_index('idx_job_schedules_due', 'job_schedules', ['next_fire_at'], unique=False,
                    postgresql_where=sa.text('is_active'))
    # 0001 made the function; raw DDL is not rewritten by schema_translate_map.
    op.execute(
        f"CREATE TRIGGER trg_job_schedules_updated_at BEFORE UPDATE ON {_qualified('job_schedules')} "
        f"FOR EACH ROW EXECUTE FUNCTION {_qualified('runledger_set_updated_at')}()"
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.execute(f"DROP TRIGGER IF EXISTS trg_job_schedules_updated_at ON {_qualified('job_schedules')}")
    op.drop_index('idx_job_schedules_due', table_name='job_schedules', postgresql_where=sa.text('is_active'))
    op.drop_table('job_schedules')


def _qualified(name: str) -> str:
    # The schema comes from the engine's configuration, never from user input.
    bind = op.get_bind()
    quote = bind.dialect.identifier_preparer.quote
    schema = schema_of(bind)
    return f"{quote(schema)}.{quote(name)}" if schema else quote(name)
