"""An index for the key-prefix search that any collation can walk.

list_jobs(search=) finds jobs whose idempotency key starts with the text
searched. Under a collation other than C (C.UTF-8 and en_US.UTF-8, the defaults
of most servers) a LIKE prefix cannot use a btree in the column's own order, and
the search read all of job_queue. This index keeps the keys in byte order
(text_pattern_ops); only keyed jobs have an entry. It is built with a plain
CREATE INDEX, which holds off writes to job_queue while it reads the keyed rows.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

from runledger_sync.db.engine import schema_of

# revision identifiers, used by Alembic.
revision: str = '0011'
down_revision: Union[str, Sequence[str], None] = '0010'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

_INDEX = 'idx_job_queue_idempotency_key_prefix'


def upgrade() -> None:
    """Upgrade schema."""
    op.create_index(_INDEX, 'job_queue', ['idempotency_key'], schema=schema_of(op.get_bind()),
                    postgresql_ops={'idempotency_key': 'text_pattern_ops'},
                    postgresql_where=sa.text('idempotency_key IS NOT NULL'))


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(_INDEX, table_name='job_queue', schema=schema_of(op.get_bind()))
