"""Workflows: runs, steps and their dependencies; job_queue.workflow_step_id and the linkage trigger.

- workflow_runs, workflow_steps, workflow_step_dependencies (spec section 11).
- job_queue.workflow_step_id (unique when set) and workflow_steps.job_id point at
  each other; a deferred constraint trigger on each side checks, at commit, that
  a link is returned. The triggers fire only for rows that carry a link (their
  WHEN clause), so plain jobs pay nothing at enqueue and no hot-path UPDATE
  names the column.

Adding a nullable column without a default does not rewrite job_queue.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from runledger_sync.db.engine import schema_of
from runledger_sync.db.schema_workflows import (
    WORKFLOW_LINK_FUNCTION,
    WORKFLOW_LINK_FUNCTION_BODY,
    WORKFLOW_LINK_TRIGGERS,
)

# revision identifiers, used by Alembic.
revision: str = '0004'
down_revision: Union[str, Sequence[str], None] = '0003'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

_TIMESTAMPS = (
    ('created_at', sa.DateTime(timezone=True), sa.text('now()')),
    ('updated_at', sa.DateTime(timezone=True), sa.text('now()')),
)


def _timestamps() -> list[sa.Column]:
    return [sa.Column(name, type_, server_default=default, nullable=False) for name, type_, default in _TIMESTAMPS]


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table('workflow_runs',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('organization_id', sa.Text(), nullable=True),
    sa.Column('status', sa.Text(), server_default=sa.text("'RUNNING'"), nullable=False),
    sa.Column('idempotency_key', sa.Text(), nullable=True),
    sa.Column('enqueue_request', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('status_reason', sa.Text(), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    *_timestamps(),
    sa.CheckConstraint("status IN ('RUNNING', 'WAITING_FOR_EXTERNAL', 'SUCCEEDED', 'COMPLETED_WITH_ERRORS', 'CANCELED')",
                       name='ck_workflow_runs_status'),
    sa.CheckConstraint("btrim(name) <> ''", name='ck_workflow_runs_name_not_blank'),
    sa.CheckConstraint('idempotency_key IS NULL OR enqueue_request IS NOT NULL',
                       name='ck_workflow_runs_idempotency_enqueue_request'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_workflow_runs'))
    )
    op.create_index('idx_workflow_runs_created', 'workflow_runs',
                    [sa.literal_column('created_at DESC'), sa.literal_column('id DESC')], unique=False)
    op.create_index('idx_workflow_runs_status_created', 'workflow_runs',
                    ['status', sa.literal_column('created_at DESC'), sa.literal_column('id DESC')], unique=False)
    op.create_index('idx_workflow_runs_org_created', 'workflow_runs',
                    ['organization_id', sa.literal_column('created_at DESC'), sa.literal_column('id DESC')],
                    unique=False, postgresql_where=sa.text('organization_id IS NOT NULL'))
    op.create_index('uq_workflow_runs_name_idempotency_org', 'workflow_runs',
                    ['name', 'organization_id', 'idempotency_key'], unique=True,
                    postgresql_where=sa.text('organization_id IS NOT NULL AND idempotency_key IS NOT NULL'))
    op.create_index('uq_workflow_runs_name_idempotency_global', 'workflow_runs', ['name', 'idempotency_key'],
                    unique=True, postgresql_where=sa.text('organization_id IS NULL AND idempotency_key IS NOT NULL'))
    op.create_table('workflow_steps',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('run_id', sa.UUID(), nullable=False),
    sa.Column('step_key', sa.Text(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('status', sa.Text(), server_default=sa.text("'BLOCKED'"), nullable=False),
    sa.Column('job_type', sa.Text(), nullable=True),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('priority', sa.Integer(), nullable=True),
    sa.Column('max_attempts', sa.Integer(), nullable=True),
    sa.Column('timeout_seconds', sa.Integer(), nullable=True),
    sa.Column('job_id', sa.UUID(), nullable=True),
    sa.Column('dependencies_total', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('dependencies_pending', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('dependencies_unsatisfied', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('output', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('error_code', sa.Text(), nullable=True),
    sa.Column('error_message', sa.Text(), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    *_timestamps(),
    sa.CheckConstraint("kind IN ('JOB', 'EXTERNAL')", name='ck_workflow_steps_kind'),
    sa.CheckConstraint("status IN ('BLOCKED', 'WAITING_FOR_EXTERNAL', 'ENQUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED', "
                       "'CANCELED')", name='ck_workflow_steps_status'),
    sa.CheckConstraint("(kind = 'JOB') = (job_type IS NOT NULL)", name='ck_workflow_steps_job_type'),
    sa.CheckConstraint('dependencies_pending >= 0 AND dependencies_unsatisfied >= 0 '
                       'AND dependencies_pending <= dependencies_total '
                       'AND dependencies_unsatisfied <= dependencies_total',
                       name='ck_workflow_steps_dependency_counts'),
    sa.ForeignKeyConstraint(['run_id'], ['workflow_runs.id'], name='fk_workflow_steps_run_id', ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['job_id'], ['job_queue.id'], name='fk_workflow_steps_job_id', ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_workflow_steps')),
    sa.UniqueConstraint('run_id', 'step_key', name='uq_workflow_steps_run_id_step_key')
    )
    op.create_index('uq_workflow_steps_job_id', 'workflow_steps', ['job_id'], unique=True,
                    postgresql_where=sa.text('job_id IS NOT NULL'))
    op.create_table('workflow_step_dependencies',
    sa.Column('step_id', sa.UUID(), nullable=False),
    sa.Column('prerequisite_step_id', sa.UUID(), nullable=False),
    sa.Column('release_mode', sa.Text(), server_default=sa.text("'ON_TERMINAL'"), nullable=False),
    sa.CheckConstraint("release_mode IN ('ON_TERMINAL', 'ON_SUCCESS')",
                       name='ck_workflow_step_dependencies_release_mode'),
    sa.CheckConstraint('step_id <> prerequisite_step_id', name='ck_workflow_step_dependencies_not_self'),
    sa.ForeignKeyConstraint(['step_id'], ['workflow_steps.id'], name='fk_workflow_step_dependencies_step_id',
                            ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['prerequisite_step_id'], ['workflow_steps.id'],
                            name='fk_workflow_step_dependencies_prerequisite_step_id', ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('step_id', 'prerequisite_step_id', name=op.f('pk_workflow_step_dependencies'))
    )
    op.create_index('idx_workflow_step_dependencies_prerequisite', 'workflow_step_dependencies',
                    ['prerequisite_step_id'], unique=False)
    # ALTER TABLE is not rewritten by schema_translate_map: name the schema.
    schema = schema_of(op.get_bind())
    op.add_column('job_queue', sa.Column('workflow_step_id', sa.UUID(), nullable=True), schema=schema)
    op.create_foreign_key('fk_job_queue_workflow_step_id', 'job_queue', 'workflow_steps',
                          ['workflow_step_id'], ['id'], ondelete='SET NULL', source_schema=schema,
                          referent_schema=schema)
    op.create_index('uq_job_queue_workflow_step_id', 'job_queue', ['workflow_step_id'], unique=True,
                    postgresql_where=sa.text('workflow_step_id IS NOT NULL'))
    _create_link_triggers()


def downgrade() -> None:
    """Downgrade schema."""
    _drop_link_triggers()
    op.drop_index('uq_job_queue_workflow_step_id', table_name='job_queue',
                  postgresql_where=sa.text('workflow_step_id IS NOT NULL'))
    schema = schema_of(op.get_bind())
    op.drop_constraint('fk_job_queue_workflow_step_id', 'job_queue', type_='foreignkey', schema=schema)
    op.drop_column('job_queue', 'workflow_step_id', schema=schema)
    op.drop_index('idx_workflow_step_dependencies_prerequisite', table_name='workflow_step_dependencies')
    op.drop_table('workflow_step_dependencies')
    op.drop_index('uq_workflow_steps_job_id', table_name='workflow_steps',
                  postgresql_where=sa.text('job_id IS NOT NULL'))
    op.drop_table('workflow_steps')
    op.drop_index('uq_workflow_runs_name_idempotency_global', table_name='workflow_runs',
                  postgresql_where=sa.text('organization_id IS NULL AND idempotency_key IS NOT NULL'))
    op.drop_index('uq_workflow_runs_name_idempotency_org', table_name='workflow_runs',
                  postgresql_where=sa.text('organization_id IS NOT NULL AND idempotency_key IS NOT NULL'))
    op.drop_index('idx_workflow_runs_org_created', table_name='workflow_runs',
                  postgresql_where=sa.text('organization_id IS NOT NULL'))
    op.drop_index('idx_workflow_runs_status_created', table_name='workflow_runs')
    op.drop_index('idx_workflow_runs_created', table_name='workflow_runs')
    op.drop_table('workflow_runs')


def _create_link_triggers() -> None:
    function = _qualified(WORKFLOW_LINK_FUNCTION)
    op.execute(f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $${WORKFLOW_LINK_FUNCTION_BODY}$$")
    for table, trigger, column in WORKFLOW_LINK_TRIGGERS:
        # Deferred to commit: a step and its job are written by separate statements
        # of one transaction, each naming the other.
        op.execute(
            f"CREATE CONSTRAINT TRIGGER {trigger} AFTER INSERT OR UPDATE OF {column} ON {_qualified(table)} "
            f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.{column} IS NOT NULL) "
            f"EXECUTE FUNCTION {function}()"
        )


def _drop_link_triggers() -> None:
    for table, trigger, _ in WORKFLOW_LINK_TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {_qualified(table)}")
    op.execute(f"DROP FUNCTION IF EXISTS {_qualified(WORKFLOW_LINK_FUNCTION)}()")


def _qualified(name: str) -> str:
    # The schema comes from the engine's configuration, never from user input.
    bind = op.get_bind()
    quote = bind.dialect.identifier_preparer.quote
    schema = schema_of(bind)
    return f"{quote(schema)}.{quote(name)}" if schema else quote(name)
