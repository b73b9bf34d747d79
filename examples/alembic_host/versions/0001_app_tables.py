"""Create the app's orders table, which points at the job fulfilling each order.

Revision ID: app_0001
Revises:
Create Date: 2026-12-02

The app's history is its own branch ("app"). It depends on runledger's first
revision, because app_orders has a foreign key into job_queue: Alembic runs
runledger's 0001 before this one on upgrade, and this one first on downgrade.
Name a revision id here (or the branch label "runledger", which means its
head); "runledger@head" is not accepted in depends_on.
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision: str = "app_0001"
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = ("app",)
depends_on: Union[str, Sequence[str], None] = ("0001",)


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
