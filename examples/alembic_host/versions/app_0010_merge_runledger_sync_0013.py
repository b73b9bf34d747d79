"""Merge runledger-sync's 0013 (unique and debounced jobs) into the app's history.

Revision ID: app_0010
Revises: app_0009, 0013
Create Date: 2026-12-06

Written by ``alembic merge heads -m "runledger-sync 0013"`` after upgrading
runledger-sync, as app_0009 was for its 0012.
"""
from typing import Sequence, Union

# revision identifiers, used by Alembic.
revision: str = "app_0010"
down_revision: Union[str, Sequence[str], None] = ("app_0009", "0013")
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    pass


def downgrade() -> None:
    """Downgrade schema."""
    pass
