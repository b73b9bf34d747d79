"""Merge runledger-sync's 0005 (flow control), 0006 (failure evidence) and 0007 (retention indexes) into the app's history.

Revision ID: app_0005
Revises: app_0004, 0007
Create Date: 2026-12-05

Written by ``alembic merge heads -m "runledger-sync 0007"`` after upgrading
runledger-sync: each release that adds revisions leaves a second head until
the app merges it, and ``runledger-sync check-schema`` fails until it is applied.
"""
from typing import Sequence, Union

# revision identifiers, used by Alembic.
revision: str = "app_0005"
down_revision: Union[str, Sequence[str], None] = ("app_0004", "0007")
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    pass


def downgrade() -> None:
    """Downgrade schema."""
    pass
