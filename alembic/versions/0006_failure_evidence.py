"""Failures keep their evidence: the failing exception's type and a bounded traceback per attempt.

- job_attempts.error_type: the exception's qualified class name, at most 255
  characters.
- job_attempts.traceback: its traceback without local values, cut in the
  middle to at most 8192 characters (runledger_sync/core/evidence.py).

Both are nullable and without a default, so adding them rewrites nothing.
Adding their size checks reads job_attempts once, under the lock the ALTER
takes (writes to the table wait for it: on a table of many millions of
attempts, run this revision at a quiet time). They are not added NOT VALID,
which would skip that read: SQLAlchemy 2.1 warns whenever it reflects a
constraint left unvalidated, and the schema check (``check-schema``) reflects
the table. The
downgrade drops both columns, and the evidence with them.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-12

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

from runledger_sync.db.engine import schema_of

# revision identifiers, used by Alembic.
revision: str = '0006'
down_revision: Union[str, Sequence[str], None] = '0005'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# The caps as this revision set them (core.evidence may change its own later, with a revision).
_ERROR_TYPE_CHECK = "error_type IS NULL OR char_length(error_type) <= 255"
_TRACEBACK_CHECK = "traceback IS NULL OR char_length(traceback) <= 8192"


def upgrade() -> None:
    """Upgrade schema."""
    # ALTER TABLE is not rewritten by schema_translate_map: name the schema.
    schema = schema_of(op.get_bind())
    op.add_column('job_attempts', sa.Column('error_type', sa.Text(), nullable=True), schema=schema)
    op.add_column('job_attempts', sa.Column('traceback', sa.Text(), nullable=True), schema=schema)
    op.create_check_constraint('ck_job_attempts_error_type', 'job_attempts', _ERROR_TYPE_CHECK, schema=schema)
    op.create_check_constraint('ck_job_attempts_traceback', 'job_attempts', _TRACEBACK_CHECK, schema=schema)


def downgrade() -> None:
    """Downgrade schema."""
    schema = schema_of(op.get_bind())
    op.drop_constraint('ck_job_attempts_traceback', 'job_attempts', type_='check', schema=schema)
    op.drop_constraint('ck_job_attempts_error_type', 'job_attempts', type_='check', schema=schema)
    op.drop_column('job_attempts', 'traceback', schema=schema)
    op.drop_column('job_attempts', 'error_type', schema=schema)

