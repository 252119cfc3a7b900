"""An index the fleet table's pages read instead of the devices' rows: filters, counts and sort keys.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_devices_fleet_view", "devices",
                    ["revoked_at", "last_seen", "state", "steps_done", "energy_j", "name"])


def downgrade() -> None:
    op.drop_index("ix_devices_fleet_view", table_name="devices")
