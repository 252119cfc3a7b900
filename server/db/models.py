"""The server's tables, as SQLAlchemy 2 declarative models.

Times are Unix seconds (floats), the same clock the agent's status uses; byte
counts are 64-bit.  The schema is created and changed only by the Alembic
migrations in ``server/db/migrations`` (a test checks the two agree).

::

    devices             one row per enrolled device: its token's hash, last heartbeat and the figures the
                        fleet view aggregates (state, steps, energy)
    enrolment_tokens    single-use tokens an operator hands out; hashed, with expiry and who used them
    heartbeats          each device's recent heartbeats (bounded per device)
    solve_requests      one per distinct (graph fingerprint, device profile, budgets): status, inputs, result
    schedules           signed schedules, by schedule id
    device_schedules    which schedule each device downloaded last
    operators           dashboard accounts: a username and an argon2 password hash
    operator_sessions   signed-in dashboard sessions: the SHA-256 of the session cookie, the CSRF token, expiry
    rounds              one row per device per federated round and phase (train, evaluate, personalize)
    model_versions      the global model after each federated round: its weights file's hash, provenance,
                        metrics and the server's signature
    audit_log           security-relevant events: enrolments, revocations, sign-ins, refusals, operator actions
    fleet_samples       the fleet once a minute: devices by status and state, steps and energy since the last
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, LargeBinary, MetaData, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Constraint names fixed by convention, so migrations (and SQLite's batch mode) can name what they change.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

DEVICE_NAME_LENGTH = 64
OPERATOR_NAME_LENGTH = 64
SOLVE_STATUSES = ("queued", "solving", "done", "failed", "timed_out", "cancelled")
DEVICE_STATES = ("waiting", "preparing", "training", "backing off", "stopped")  # what an agent's heartbeat reports


class Base(DeclarativeBase):
    """Declarative base with the naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Device(Base):
    """An enrolled device.  ``token_hash`` is the SHA-256 of its device token (:mod:`server.tokens`)."""

    __tablename__ = "devices"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(DEVICE_NAME_LENGTH), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    enrolled_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float)
    last_seen: Mapped[float | None] = mapped_column(Float, index=True)
    """When the server last received a heartbeat from it (server clock)."""
    last_sent_at: Mapped[float | None] = mapped_column(Float)
    """``sent_at`` of the newest heartbeat in the last request received (device clock: shown, never ordered by)."""
    clock_skew_seconds: Mapped[float | None] = mapped_column(Float)
    """The device's clock minus the server's at its last heartbeat (positive: the device runs ahead)."""
    last_heartbeat: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    state: Mapped[str | None] = mapped_column(String(16), index=True)
    steps_done: Mapped[int | None] = mapped_column(BigInteger)
    energy_j: Mapped[float | None] = mapped_column(Float)
    software_version: Mapped[str | None] = mapped_column(String(64))

    # The fleet table's filters, counts and sort keys, read from the index rather than the rows (whose
    # last_heartbeat makes them large): a page of 50 out of 10,000 devices touches 50 rows.
    __table_args__ = (Index("ix_devices_fleet_view", "revoked_at", "last_seen", "state", "steps_done", "energy_j",
                            "name"),)


class EnrolmentToken(Base):
    """A single-use enrolment token; ``used_by`` names the device that enrolled with it."""

    __tablename__ = "enrolment_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
    used_at: Mapped[float | None] = mapped_column(Float)
    used_by: Mapped[str | None] = mapped_column(String(DEVICE_NAME_LENGTH))
    revoked_at: Mapped[float | None] = mapped_column(Float)


class Heartbeat(Base):
    """One heartbeat as received: the validated status object (``payload``), its device and both clocks."""

    __tablename__ = "heartbeats"
    __table_args__ = (Index("ix_heartbeats_device_id_id", "device_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    received_at: Mapped[float] = mapped_column(Float)
    sent_at: Mapped[float] = mapped_column(Float)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)


class StoredSchedule(Base):
    """A signed schedule file (``document``: its canonical JSON bytes) and what it predicts."""

    __tablename__ = "schedules"

    schedule_id: Mapped[str] = mapped_column(String(16), primary_key=True)
    document: Mapped[bytes] = mapped_column(LargeBinary)
    graph_fingerprint: Mapped[str] = mapped_column(String(80), index=True)
    model: Mapped[str] = mapped_column(String(200))
    device: Mapped[str] = mapped_column(String(200))
    memory_budget: Mapped[int | None] = mapped_column(BigInteger)
    runtime_budget_ms: Mapped[float | None] = mapped_column(Float)
    predicted_peak_bytes: Mapped[int] = mapped_column(BigInteger)
    predicted_runtime_ms: Mapped[float] = mapped_column(Float)
    predicted_energy_j: Mapped[float] = mapped_column(Float)
    solver_status: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[float] = mapped_column(Float)


class SolveRequest(Base):
    """One distinct schedule request, shared by every identical one (``dedupe_key``, :mod:`server.solves`).

    The inputs are kept (``graph``: canonical JSON bytes, ``device_profile``: the profile's JSON object), so a
    request queued when the server stopped is solved after it starts again.
    """

    __tablename__ = "solve_requests"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    dedupe_key: Mapped[str] = mapped_column(String(64), unique=True)
    graph_fingerprint: Mapped[str] = mapped_column(String(80), index=True)
    model: Mapped[str] = mapped_column(String(200))
    device_profile_name: Mapped[str] = mapped_column(String(200))
    graph: Mapped[bytes] = mapped_column(LargeBinary)
    device_profile: Mapped[dict[str, Any]] = mapped_column(JSON)
    memory_budget: Mapped[int] = mapped_column(BigInteger)
    runtime_budget: Mapped[float | None] = mapped_column(Float)
    training: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # the whole step's training; null: activations
    status: Mapped[str] = mapped_column(String(16), index=True)
    error: Mapped[str | None] = mapped_column(Text)
    time_limit: Mapped[float] = mapped_column(Float)
    solve_seconds: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float, index=True)
    started_at: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    schedule_id: Mapped[str | None] = mapped_column(ForeignKey("schedules.schedule_id"))
    requested_by: Mapped[int | None] = mapped_column(ForeignKey("devices.id", ondelete="SET NULL"))

    # a device's waiting requests (its cap) and its rows when it is removed, read without a scan
    __table_args__ = (Index("ix_solve_requests_requested_by_status", "requested_by", "status"),)


class DeviceSchedule(Base):
    """The schedule a device downloaded last (or revalidated with ``If-None-Match``)."""

    __tablename__ = "device_schedules"

    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"), primary_key=True)
    schedule_id: Mapped[str] = mapped_column(ForeignKey("schedules.schedule_id"), index=True)
    downloaded_at: Mapped[float] = mapped_column(Float)


class Operator(Base):
    """A dashboard account.  ``password_hash`` is an argon2 hash in PHC string form (:mod:`server.dashboard.operators`)."""

    __tablename__ = "operators"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    username: Mapped[str] = mapped_column(String(OPERATOR_NAME_LENGTH), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[float] = mapped_column(Float)
    role: Mapped[str] = mapped_column(String(8), default="admin", server_default="admin")
    """``admin`` (everything) or ``viewer`` (reads every page, changes nothing)."""


class OperatorSession(Base):
    """A signed-in dashboard session.  ``token_hash`` is the SHA-256 of the session cookie (:mod:`server.tokens`);
    ``csrf_token`` is what every form of the session must send back."""

    __tablename__ = "operator_sessions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    operator_id: Mapped[int] = mapped_column(ForeignKey("operators.id", ondelete="CASCADE"), index=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float, index=True)
    last_used: Mapped[float] = mapped_column(Float)


class FederatedRound(Base):
    """One device's reply in one federated round (:mod:`server.federated.rounds`, written by :mod:`server.federated.serverapp`).

    Flower's run and node ids are unsigned 64-bit, beyond a signed BIGINT: they are kept as decimal text.
    ``metrics`` is the reply's ``MetricRecord`` as sent (every device sends the same keys).
    """

    __tablename__ = "rounds"
    __table_args__ = (Index("ix_rounds_run_id_round", "run_id", "round"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(String(20))
    round: Mapped[int] = mapped_column(Integer)
    phase: Mapped[str] = mapped_column(String(16))
    node_id: Mapped[str] = mapped_column(String(20), index=True)
    device_name: Mapped[str] = mapped_column(String(DEVICE_NAME_LENGTH))
    schedule_id: Mapped[str | None] = mapped_column(String(16))
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    recorded_at: Mapped[float] = mapped_column(Float)


class ModelVersion(Base):
    """The global model after one federated round (:mod:`server.model_versions`).

    The weights live in the data directory's ``models/<sha256>.npz``; the row holds their hash, where they
    came from (the Flower run and round, the version they were aggregated from) and the server's signature
    over all of that.  A version never changes once stored.
    """

    __tablename__ = "model_versions"
    __table_args__ = (Index("ix_model_versions_run_id_round", "run_id", "round"),)

    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(String(20))
    round: Mapped[int] = mapped_column(Integer)
    parent: Mapped[int | None] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(200))
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    signature: Mapped[dict[str, str]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float)


class AuditEntry(Base):
    """One security-relevant event: who did what to what, when and from where (:mod:`server.audit`)."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    actor: Mapped[str] = mapped_column(String(100))
    """``operator:alice``, ``device:pi-17``, ``cli:root`` (a server command, with the system user), ``anonymous``."""
    action: Mapped[str] = mapped_column(String(40))
    target: Mapped[str] = mapped_column(String(200))
    detail: Mapped[str] = mapped_column(String(500))
    address: Mapped[str | None] = mapped_column(String(64))


class FleetSample(Base):
    """The fleet at one minute (:mod:`server.fleet_history`): devices online in each state, offline and revoked,
    and the training steps and energy the devices reported since the sample before."""

    __tablename__ = "fleet_samples"

    minute: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    """Unix minutes (seconds // 60): one sample per minute whichever server process takes it."""
    sampled_at: Mapped[float] = mapped_column(Float)
    counts: Mapped[dict[str, int]] = mapped_column(JSON)
    """``online``, ``offline``, ``revoked`` and each state (online devices only)."""
    steps: Mapped[int | None] = mapped_column(BigInteger)
    """Steps reported since the previous sample, summed over devices; ``None`` for a process's first sample."""
    energy_j: Mapped[float | None] = mapped_column(Float)
