"""Merge runledger-sync's 0010 (job metadata) into the app's history.

Revision ID: app_0007
Revises: app_0006, 0010
Create Date: 2026-12-05

Written by ``alembic merge heads -m "runledger-sync 0010"`` after upgrading
runledger-sync, as app_0006 was for its 0009.
"""
from typing import Sequence, Union

# revision identifiers, used by Alembic.
revision: str = "app_0007"
down_revision: Union[str, Sequence[str], None] = ("app_0006", "0010")
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    pass


def downgrade() -> None:
    """Downgrade schema."""
    pass
