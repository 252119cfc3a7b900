"""The audit log, operators' roles and revocable enrolment tokens.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(100), nullable=False),
        sa.Column("action", sa.String(40), nullable=False),
        sa.Column("target", sa.String(200), nullable=False),
        sa.Column("detail", sa.String(500), nullable=False),
        sa.Column("address", sa.String(64), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_audit_log"),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    with op.batch_alter_table("operators") as batch:  # every operator before roles could do everything
        batch.add_column(sa.Column("role", sa.String(8), nullable=False, server_default="admin"))
    with op.batch_alter_table("enrolment_tokens") as batch:
        batch.add_column(sa.Column("revoked_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("enrolment_tokens") as batch:
        batch.drop_column("revoked_at")
    with op.batch_alter_table("operators") as batch:
        batch.drop_column("role")
    op.drop_index("ix_audit_log_at", table_name="audit_log")
    op.drop_table("audit_log")
