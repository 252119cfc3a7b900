"""Devices' clock skew: how far a device's clock was from the server's at its last heartbeat.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("devices") as batch:  # SQLite alters a table by copying it
        batch.add_column(sa.Column("clock_skew_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        batch.drop_column("clock_skew_seconds")
