"""Merge runledger-sync's 0011 (the key-prefix search's index) into the app's history.

Revision ID: app_0008
Revises: app_0007, 0011
Create Date: 2026-12-06

Written by ``alembic merge heads -m "runledger-sync 0011"`` after upgrading
runledger-sync, as app_0007 was for its 0010.
"""
from typing import Sequence, Union

# revision identifiers, used by Alembic.
revision: str = "app_0008"
down_revision: Union[str, Sequence[str], None] = ("app_0007", "0011")
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    pass


def downgrade() -> None:
    """Downgrade schema."""
    pass
