"""An index on the device that asked for each schedule request: a device's cap on waiting requests counts
its own rows, and removing a device clears ``requested_by`` in its rows, without reading every request.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_solve_requests_requested_by_status", "solve_requests", ["requested_by", "status"])


def downgrade() -> None:
    op.drop_index("ix_solve_requests_requested_by_status", table_name="solve_requests")
