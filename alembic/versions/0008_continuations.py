"""Handler continuations (spec T14): a cap per job type, a count per job, the steps that may continue.

- job_definitions.max_continuations: how many times one job of the type may
  continue or snooze (default 100, positive).
- job_queue.continuations: how many times the job continued since it was
  enqueued or requeued (default 0).
- workflow_steps.allow_continuation: the step's job may continue (default false).
- ck_job_attempts_outcome admits CONTINUED: the outcome of an attempt whose run
  ended in a continuation.
- The concurrency-key settle function: a continued job (PENDING, attempt 0)
  keeps its key's turn, as a retry does.

The new columns are NOT NULL with a constant default, which PostgreSQL 11 and
later add without rewriting the tables. Replacing the attempts' outcome check
reads job_attempts once, under the lock the ALTER takes. The downgrade records
a CONTINUED attempt as finished without a failure (outcome NULL) and drops the
columns, and with them each job's count of continuations.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-26

"""
from typing import Sequence, Union

from alembic import context, op
import sqlalchemy as sa

from runledger_sync.db.engine import schema_of
from runledger_sync.db.schema_queues import KEY_UNDER_WAY_0005, key_settle_function_ddl

# revision identifiers, used by Alembic.
revision: str = '0008'
down_revision: Union[str, Sequence[str], None] = '0007'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# The rules as this revision wrote them (the schema modules may move on later, with a revision).
_OUTCOMES_0006 = "'RETRYABLE', 'TIMEOUT', 'LEASE_EXPIRED', 'TERMINAL', 'PANICKED'"
_OUTCOME_CHECK_BEFORE = f"outcome IS NULL OR outcome IN ({_OUTCOMES_0006})"
_OUTCOME_CHECK = f"outcome IS NULL OR outcome IN ({_OUTCOMES_0006}, 'CONTINUED')"
_KEY_UNDER_WAY = "(j.attempt > 0 OR j.continuations > 0)"


def upgrade() -> None:
    """Upgrade schema."""
    # ALTER TABLE is not rewritten by schema_translate_map: name the schema.
    schema = schema_of(op.get_bind())
    op.add_column('job_definitions', sa.Column('max_continuations', sa.Integer(), server_default=sa.text('100'),
                                               nullable=False), schema=schema)
    op.create_check_constraint('ck_job_definitions_max_continuations_positive', 'job_definitions',
                               'max_continuations > 0', schema=schema)
    op.add_column('job_queue', sa.Column('continuations', sa.Integer(), server_default=sa.text('0'),
                                         nullable=False), schema=schema)
    op.create_check_constraint('ck_job_queue_continuations_non_negative', 'job_queue', 'continuations >= 0',
                               schema=schema)
    op.add_column('workflow_steps', sa.Column('allow_continuation', sa.Boolean(), server_default=sa.text('false'),
                                              nullable=False), schema=schema)
    op.drop_constraint('ck_job_attempts_outcome', 'job_attempts', type_='check', schema=schema)
    op.create_check_constraint('ck_job_attempts_outcome', 'job_attempts', _OUTCOME_CHECK, schema=schema)
    op.execute(key_settle_function_ddl(_qualified, under_way=_KEY_UNDER_WAY))


def downgrade() -> None:
    """Downgrade schema."""
    schema = schema_of(op.get_bind())
    op.execute(key_settle_function_ddl(_qualified, under_way=KEY_UNDER_WAY_0005))
    op.drop_constraint('ck_job_attempts_outcome', 'job_attempts', type_='check', schema=schema)
    attempts = sa.table('job_attempts', sa.column('outcome'), schema=schema)
    op.execute(attempts.update().where(attempts.c.outcome == 'CONTINUED').values(outcome=None))
    op.create_check_constraint('ck_job_attempts_outcome', 'job_attempts', _OUTCOME_CHECK_BEFORE, schema=schema)
    op.drop_column('workflow_steps', 'allow_continuation', schema=schema)
    op.drop_constraint('ck_job_queue_continuations_non_negative', 'job_queue', type_='check', schema=schema)
    op.drop_column('job_queue', 'continuations', schema=schema)
    op.drop_constraint('ck_job_definitions_max_continuations_positive', 'job_definitions', type_='check',
                       schema=schema)
    op.drop_column('job_definitions', 'max_continuations', schema=schema)


def _qualified(name: str) -> str:
    # As revision 0005's: the schema comes from the engine's configuration, never from user input.
    bind = op.get_bind()
    quote = bind.dialect.identifier_preparer.quote
    schema = schema_of(bind) or context.config.attributes.get("schema")
    return f"{quote(schema)}.{quote(name)}" if schema else quote(name)
