"""Global model versions: the model after every federated round, signed.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_versions",
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(20), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("parent", sa.Integer(), nullable=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("signature", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("version", name="pk_model_versions"),
    )
    op.create_index("ix_model_versions_run_id_round", "model_versions", ["run_id", "round"])


def downgrade() -> None:
    op.drop_index("ix_model_versions_run_id_round", table_name="model_versions")
    op.drop_table("model_versions")
