"""Merge runledger-sync's 0017 (batches, bulk actions, replays and what came with them) into the app's history.

Revision ID: app_0011
Revises: app_0010, 0017
Create Date: 2026-12-06

Written by ``alembic merge heads -m "runledger-sync 0017"`` after upgrading
runledger-sync, as app_0010 was for its 0013.
"""
from typing import Sequence, Union

# revision identifiers, used by Alembic.
revision: str = "app_0011"
down_revision: Union[str, Sequence[str], None] = ("app_0010", "0017")
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    pass


def downgrade() -> None:
    """Downgrade schema."""
    pass
