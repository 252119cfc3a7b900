"""The fleet sampled once a minute, for the fleet charts.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fleet_samples",
        sa.Column("minute", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("sampled_at", sa.Float(), nullable=False),
        sa.Column("counts", sa.JSON(), nullable=False),
        sa.Column("steps", sa.BigInteger(), nullable=True),
        sa.Column("energy_j", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("minute", name="pk_fleet_samples"),
    )


def downgrade() -> None:
    op.drop_table("fleet_samples")
