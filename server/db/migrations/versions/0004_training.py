"""Schedule requests for a step's whole memory: the training they are planned for.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("solve_requests") as batch:
        batch.add_column(sa.Column("training", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("solve_requests") as batch:
        batch.drop_column("training")
