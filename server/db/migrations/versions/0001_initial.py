"""The first schema: devices, enrolment tokens, heartbeats, schedules, solve requests, schedule usage.

Revision ID: 0001
Revises:
Create Date: 2026-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "devices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("enrolled_at", sa.Float(), nullable=False),
        sa.Column("revoked_at", sa.Float(), nullable=True),
        sa.Column("last_seen", sa.Float(), nullable=True),
        sa.Column("last_sent_at", sa.Float(), nullable=True),
        sa.Column("last_heartbeat", sa.JSON(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=True),
        sa.Column("steps_done", sa.BigInteger(), nullable=True),
        sa.Column("energy_j", sa.Float(), nullable=True),
        sa.Column("software_version", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_devices"),
        sa.UniqueConstraint("name", name="uq_devices_name"),
        sa.UniqueConstraint("token_hash", name="uq_devices_token_hash"),
    )
    op.create_index("ix_devices_last_seen", "devices", ["last_seen"])
    op.create_index("ix_devices_state", "devices", ["state"])

    op.create_table(
        "enrolment_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("used_at", sa.Float(), nullable=True),
        sa.Column("used_by", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_enrolment_tokens"),
        sa.UniqueConstraint("token_hash", name="uq_enrolment_tokens_token_hash"),
    )

    op.create_table(
        "heartbeats",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("received_at", sa.Float(), nullable=False),
        sa.Column("sent_at", sa.Float(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"], name="fk_heartbeats_device_id_devices",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_heartbeats"),
    )
    op.create_index("ix_heartbeats_device_id_id", "heartbeats", ["device_id", "id"])

    op.create_table(
        "schedules",
        sa.Column("schedule_id", sa.String(length=16), nullable=False),
        sa.Column("document", sa.LargeBinary(), nullable=False),
        sa.Column("graph_fingerprint", sa.String(length=80), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("device", sa.String(length=200), nullable=False),
        sa.Column("memory_budget", sa.BigInteger(), nullable=True),
        sa.Column("runtime_budget_ms", sa.Float(), nullable=True),
        sa.Column("predicted_peak_bytes", sa.BigInteger(), nullable=False),
        sa.Column("predicted_runtime_ms", sa.Float(), nullable=False),
        sa.Column("predicted_energy_j", sa.Float(), nullable=False),
        sa.Column("solver_status", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("schedule_id", name="pk_schedules"),
    )
    op.create_index("ix_schedules_graph_fingerprint", "schedules", ["graph_fingerprint"])

    op.create_table(
        "solve_requests",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("dedupe_key", sa.String(length=64), nullable=False),
        sa.Column("graph_fingerprint", sa.String(length=80), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("device_profile_name", sa.String(length=200), nullable=False),
        sa.Column("graph", sa.LargeBinary(), nullable=False),
        sa.Column("device_profile", sa.JSON(), nullable=False),
        sa.Column("memory_budget", sa.BigInteger(), nullable=False),
        sa.Column("runtime_budget", sa.Float(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("time_limit", sa.Float(), nullable=False),
        sa.Column("solve_seconds", sa.Float(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("schedule_id", sa.String(length=16), nullable=True),
        sa.Column("requested_by", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["requested_by"], ["devices.id"], name="fk_solve_requests_requested_by_devices",
                                ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["schedule_id"], ["schedules.schedule_id"],
                                name="fk_solve_requests_schedule_id_schedules"),
        sa.PrimaryKeyConstraint("id", name="pk_solve_requests"),
        sa.UniqueConstraint("dedupe_key", name="uq_solve_requests_dedupe_key"),
    )
    op.create_index("ix_solve_requests_created_at", "solve_requests", ["created_at"])
    op.create_index("ix_solve_requests_graph_fingerprint", "solve_requests", ["graph_fingerprint"])
    op.create_index("ix_solve_requests_status", "solve_requests", ["status"])

    op.create_table(
        "device_schedules",
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("schedule_id", sa.String(length=16), nullable=False),
        sa.Column("downloaded_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"], name="fk_device_schedules_device_id_devices",
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["schedule_id"], ["schedules.schedule_id"],
                                name="fk_device_schedules_schedule_id_schedules"),
        sa.PrimaryKeyConstraint("device_id", name="pk_device_schedules"),
    )
    op.create_index("ix_device_schedules_schedule_id", "device_schedules", ["schedule_id"])


def downgrade() -> None:
    op.drop_table("device_schedules")
    op.drop_table("solve_requests")
    op.drop_table("schedules")
    op.drop_table("heartbeats")
    op.drop_table("enrolment_tokens")
    op.drop_table("devices")
