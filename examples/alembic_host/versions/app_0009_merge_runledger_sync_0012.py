"""Merge runledger-sync's 0012 (appends to a running workflow) into the app's history.

Revision ID: app_0009
Revises: app_0008, 0012
Create Date: 2026-12-06

Written by ``alembic merge heads -m "runledger-sync 0012"`` after upgrading
runledger-sync, as app_0008 was for its 0011.
"""
from typing import Sequence, Union

# revision identifiers, used by Alembic.
revision: str = "app_0009"
down_revision: Union[str, Sequence[str], None] = ("app_0008", "0012")
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    pass


def downgrade() -> None:
    """Downgrade schema."""
    pass
