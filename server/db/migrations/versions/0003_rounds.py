"""Federated rounds: one row per device per round and phase.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rounds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(length=20), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("node_id", sa.String(length=20), nullable=False),
        sa.Column("device_name", sa.String(length=64), nullable=False),
        sa.Column("schedule_id", sa.String(length=16), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("recorded_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_rounds"),
    )
    op.create_index("ix_rounds_run_id_round", "rounds", ["run_id", "round"])
    op.create_index("ix_rounds_node_id", "rounds", ["node_id"])


def downgrade() -> None:
    op.drop_table("rounds")
