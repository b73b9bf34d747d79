"""Create the app's orders table, which points at the job fulfilling each order.

Revision ID: app_0001
Revises: 0001
Create Date: 2026-12-02

This revision builds on runledger's head (down_revision "0001"), so the
combined history has one head and ``alembic upgrade head`` runs runledger's
0001 before it (app_orders has a foreign key into job_queue); a downgrade runs
this one first. When a later runledger-sync adds a revision, ``alembic heads``
shows two heads; ``alembic merge heads -m "runledger-sync <version>"`` joins
them again, and ``runledger-sync check-schema`` fails until it is applied.
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision: str = "app_0001"
down_revision: Union[str, Sequence[str], None] = "0001"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "app_orders",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), primary_key=True),
        sa.Column("reference", sa.Text(), nullable=False, unique=True),
        sa.Column("fulfilment_job_id", sa.UUID(), sa.ForeignKey("job_queue.id", ondelete="SET NULL"), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table("app_orders")
