"""Merge runledger-sync's 0009 (the dashboard's rollup table) into the app's history.

Revision ID: app_0006
Revises: app_0005, 0009
Create Date: 2026-12-05

Written by ``alembic merge heads -m "runledger-sync 0009"`` after upgrading
runledger-sync, as app_0005 was for its 0005 to 0008.
"""
from typing import Sequence, Union

# revision identifiers, used by Alembic.
revision: str = "app_0006"
down_revision: Union[str, Sequence[str], None] = ("app_0005", "0009")
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    pass


def downgrade() -> None:
    """Downgrade schema."""
    pass
