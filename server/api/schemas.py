"""Request and response bodies of the device API (pydantic), and so of ``/openapi.json``.

Types are strict (a string is not a number, ``1`` is not ``true``), numbers
finite, strings bounded and free of NUL characters (PostgreSQL's text cannot
hold them: without the rule a NUL would be a 500 there and fine on SQLite).  Heartbeat fields the server does not know are
ignored (an older server keeps working with a newer agent); the known ones are
the agent's status object (:data:`agent.daemon.status.FIELDS`) and the fleet's
device figures.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Strict, StrictBool, StrictInt, Tag, WithJsonSchema

from server.api.documents import DEVICE_SCHEMA, GRAPH_SCHEMA
from server.db.models import DEVICE_STATES
from server.devices import DEVICE_NAME_PATTERN

STATES = DEVICE_STATES
MAX_HEARTBEATS = 500  # heartbeats in one request (an agent's queue flushed at once)

Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
NonNegative = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
# Ranges a device can produce: wider than any real value, narrow enough that no stored value breaks a page
# (a clock in nanoseconds, a loss of 1e308).
MAX_UNIX_TIME = 4_102_444_800.0  # 2100-01-01: seconds, not milli- or nanoseconds
UnixTime = Annotated[float, Strict(), Field(ge=0, le=MAX_UNIX_TIME, allow_inf_nan=False)]
Loss = Annotated[float, Strict(), Field(ge=-1e9, le=1e9, allow_inf_nan=False)]
Seconds = Annotated[float, Strict(), Field(ge=0, le=1e8, allow_inf_nan=False)]  # three years
Joules = Annotated[float, Strict(), Field(ge=0, le=1e12, allow_inf_nan=False)]  # a kilowatt for 30 years
Count = Annotated[StrictInt, Field(ge=0, le=2**63 - 1)]
Bytes = Annotated[StrictInt, Field(ge=0, le=2**63 - 1)]
NO_NUL = r"^[^\x00]*$"
Line = Annotated[str, Field(max_length=200, pattern=NO_NUL)]
Text = Annotated[str, Field(max_length=2000, pattern=NO_NUL)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Problem(BaseModel):
    """One validation problem: where (``loc``) and what."""

    loc: list[str | int]
    msg: str
    type: str


class ErrorBody(BaseModel):
    """Every error response: ``detail`` in one line; validation errors also list each ``problem``."""

    detail: str
    problems: list[Problem] | None = None


# -- server key and enrolment ----------------------------------------------------------
class ServerKeyBody(BaseModel):
    """The server's schedule-signing public key: what agents pin."""

    public_key: str = Field(description="PEM (SubjectPublicKeyInfo) Ed25519 public key")
    key_id: str = Field(description="first 16 hex digits of the key's SHA-256, as schedule signatures carry it")
    algorithm: Literal["ed25519"] = "ed25519"


class EnrolRequest(_Body):
    """A device's one-time exchange of an enrolment token for its own token."""

    enrolment_token: Annotated[str, Field(min_length=1, max_length=256)]
    device_name: Annotated[str, Field(pattern=DEVICE_NAME_PATTERN, description="1-64 characters: A-Z a-z 0-9 . _ -, not starting with a dot")]


class EnrolResponse(BaseModel):
    """The device's token (shown once: the server keeps only its hash) and the key to pin."""

    device_name: str
    device_token: str
    server_public_key: str
    key_id: str


# -- heartbeats ---------------------------------------------------------------------------
class Verdict(BaseModel):
    """One eligibility monitor's verdict."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    name: Line
    eligible: StrictBool
    reason: Text = ""


class Heartbeat(BaseModel):
    """The agent's status object, plus ``software_version`` and ``sent_at`` (when the agent made it: queued
    heartbeats arrive late)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    sent_at: UnixTime = Field(description="Unix time the agent made this heartbeat")
    software_version: Annotated[str, Field(max_length=64, pattern=NO_NUL)] | None = None
    state: Literal[STATES]  # type: ignore[valid-type]
    reason: Text | None = None
    steps_done: Count = 0
    steps_saved: Count | None = None
    since: UnixTime | None = None
    device: Line | None = None
    pid: Count | None = None
    updated: UnixTime | None = None
    eligible: StrictBool | None = None
    eligibility: Annotated[list[Verdict], Field(max_length=32)] = []
    loss: Loss | None = None
    holdout_loss: Loss | None = None
    holdout_accuracy: Annotated[float, Strict(), Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    kept_model: Literal["global", "personal", "local"] | None = None
    kept_accuracy: Annotated[float, Strict(), Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    kept_margin_global: Annotated[float, Strict(), Field(ge=-1, le=1, allow_inf_nan=False)] | None = None
    kept_margin_local: Annotated[float, Strict(), Field(ge=-1, le=1, allow_inf_nan=False)] | None = None
    schedule_id: Annotated[str, Field(max_length=64, pattern=NO_NUL)] | None = None
    schedule_from: Line | None = None
    memory_budget_bytes: Bytes | None = None
    peak_bytes: Bytes | None = None
    bound_bytes: Bytes | None = None
    energy_j: Joules | None = None
    energy_source: Line | None = None
    data: Text | None = None
    samples_skipped: Count | None = None
    last_error: Text | None = None
    step_seconds: Seconds | None = None
    last_checkpoint_seconds: Seconds | None = None
    last_stop_after_step_seconds: Seconds | None = None
    # the fleet's device figures (docs/api.md)
    power_source: Line | None = Field(None, description="e.g. mains, battery, usb")
    charging: StrictBool | None = None
    battery_percent: Annotated[float, Strict(), Field(ge=0, le=100, allow_inf_nan=False)] | None = None
    temperature_c: Annotated[float, Strict(), Field(ge=-100, le=200, allow_inf_nan=False)] | None = None
    cpu_load: Annotated[float, Strict(), Field(ge=0, le=1e4, allow_inf_nan=False)] | None = None
    under_voltage: StrictBool | None = None
    memory_available_bytes: Bytes | None = None
    storage_free_bytes: Bytes | None = None


def _one_or_many(value: Any) -> str:
    return "many" if isinstance(value, list) else "one"


HeartbeatBody = Annotated[
    Annotated[Heartbeat, Tag("one")] | Annotated[list[Heartbeat], Tag("many"), Field(min_length=1,
                                                                                   max_length=MAX_HEARTBEATS)],
    Discriminator(_one_or_many),
]


# -- schedules -------------------------------------------------------------------------------
class ScheduleRequestBody(_Body):
    """A schedule asked for: the device's training graph and profile, and the budgets."""

    graph: Annotated[dict[str, Any], WithJsonSchema(GRAPH_SCHEMA)] = Field(
        description="a training graph (poet-edge/training-graph) or a POET reference graph")
    device: Annotated[dict[str, Any], WithJsonSchema(DEVICE_SCHEMA)] = Field(
        description="a device profile (poet-edge/device-profile)")
    memory_budget: Annotated[StrictInt, Field(gt=0, le=2**53)] = Field(
        description="bytes: the step's whole memory beyond the loaded model with `training`, activations alone "
                    "without it; planned for its class (rounded down, at most 1.6 % less)")
    runtime_budget: Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)] | None = Field(
        None, description="a multiple of one plain step's compute time; null for no limit")
    training: dict[str, Any] | None = Field(
        None, description="the device's training (optimizer, state_tensors, update_temporaries, accumulation, clip, "
                          "chunk_bytes, state_paging): plan the step's whole memory for it; null: activations only")


class ScheduleRequestAccepted(BaseModel):
    """The request's id, to ask for its status, and its schedule's id once solved."""

    request_id: str
    status: Literal["queued", "solving", "done", "failed", "timed_out", "cancelled"]
    schedule_id: str | None


class ScheduleRequestStatus(ScheduleRequestAccepted):
    """Where a schedule request stands."""

    error: str | None
    solve_seconds: float | None
