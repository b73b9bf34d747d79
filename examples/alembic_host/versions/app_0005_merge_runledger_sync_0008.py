"""Merge runledger-sync's 0005 (flow control) to 0008 (continuations) into the app's history.

Revision ID: app_0005
Revises: app_0004, 0008
Create Date: 2026-12-05

Written by ``alembic merge heads -m "runledger-sync 0008"`` after upgrading
runledger-sync: each release that adds revisions leaves a second head until
the app merges it, and ``runledger-sync check-schema`` fails until it is applied.
"""
from typing import Sequence, Union

# revision identifiers, used by Alembic.
revision: str = "app_0005"
down_revision: Union[str, Sequence[str], None] = ("app_0004", "0008")
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    pass


def downgrade() -> None:
    """Downgrade schema."""
    pass
