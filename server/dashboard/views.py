"""What each dashboard page shows, read from the database and written out for display (:mod:`.display`).

The fleet table's rows are plain dictionaries of strings, so the page's
first render (Jinja) and its live refresh (``/dashboard/fleet.json``, drawn by
the page's script with ``textContent``) show exactly the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from common.keep_best import kept_name
from server import devices
from server.dashboard import display
from server.db.engine import Database
from server.db.models import DEVICE_STATES, Device, DeviceSchedule, FederatedRound, Heartbeat, SolveRequest, StoredSchedule
from server.model_versions import list_versions
from server.federated.rounds import PERSONALIZED, RoundRow, round_rows, run_ids

STATES = DEVICE_STATES
# The fleet table's columns: (key in a row's cells, heading).
COLUMNS = (
    ("online", "Online"), ("state", "State"), ("reason", "Reason"), ("power", "Charging / battery"),
    ("temperature", "Temp."), ("memory", "Memory peak / budget"), ("steps", "Steps"), ("loss", "Loss"),
    ("accuracy", "Held-out acc."), ("energy", "Energy"), ("error", "Last error"),
)
HISTORY = 500  # heartbeats drawn on a device's charts


def newest_devices(db: Database, now: float, online_seconds: float, limit: int = 50) -> list[dict[str, Any]]:
    """The fleet rows of the devices enrolled last, newest first (the fleet page finds any other)."""
    with db.read() as session:
        devices = session.scalars(select(Device).order_by(Device.enrolled_at.desc(), Device.id.desc())
                                  .limit(limit)).all()
    return [fleet_row(device, now, online_seconds) for device in devices]


def fleet_row(device: Device, now: float, online_seconds: float) -> dict[str, Any]:
    """The fleet table's row for one device."""
    beat = device.last_heartbeat or {}
    revoked = device.revoked_at is not None
    online = not revoked and device.last_seen is not None and now - device.last_seen <= online_seconds
    status = "revoked" if revoked else "online" if online else "offline"
    cells = {
        "online": f"{status}, {display.age(device.last_seen, now)}" if device.last_seen else status,
        "state": _state_cell(device.state, status),
        "reason": beat.get("reason") or display.DASH,
        "power": display.power(beat),
        "temperature": display.temperature(beat.get("temperature_c")),
        "memory": display.memory(beat.get("memory_budget_bytes"), beat.get("peak_bytes")),
        "steps": display.count(device.steps_done),
        "loss": display.number(beat.get("loss")),
        "accuracy": display.percent(beat.get("holdout_accuracy")),
        "energy": display.joules(device.energy_j),
        "error": beat.get("last_error") or display.DASH,
    }
    return {"name": device.name, "url": f"/devices/{device.name}", "state": "revoked" if revoked else device.state or "",
            "status": status, "last_seen": display.clock(device.last_seen), "last_seen_at": device.last_seen,
            "cells": cells}


def _state_cell(state: str | None, status: str) -> str:
    """The state a device reported; for a device not heard from lately, said to be its last report."""
    if not state:
        return display.DASH
    return state if status == "online" else f"{state} (last heard)"


@dataclass(frozen=True)
class DeviceView:
    """A device's page: its row, its latest heartbeat's fields, its history and its schedule."""

    device: Device
    row: dict[str, Any]
    fields: list[tuple[str, str]]
    history: list[Heartbeat]
    schedule: StoredSchedule | None
    schedule_downloaded_at: float | None
    personalized: dict[str, str] | None = None  # its latest personalization: global version, accuracies


def device_view(db: Database, name: str, now: float, online_seconds: float) -> DeviceView | None:
    """The device page's data, or ``None`` when no device has that name."""
    with db.read() as session:
        device = session.scalar(select(Device).where(Device.name == name))
        if device is None:
            return None
        history = list(reversed(session.scalars(select(Heartbeat).where(Heartbeat.device_id == device.id)
                                                .order_by(Heartbeat.id.desc()).limit(HISTORY)).all()))
        used = session.get(DeviceSchedule, device.id)
        schedule = _schedule_summary(session, used.schedule_id) if used is not None else None
        personalized = session.scalars(select(FederatedRound).where(FederatedRound.device_name == name,
                                                                    FederatedRound.phase.in_(PERSONALIZED))
                                       .order_by(FederatedRound.id.desc()).limit(1)).first()
    fields = [(key, display.clock(value) if key in CLOCK_FIELDS else _field_text(value))
              for key, value in sorted((device.last_heartbeat or {}).items()) if key != "eligibility"]
    return DeviceView(device, fleet_row(device, now, online_seconds), fields, history, schedule,
                      used.downloaded_at if used is not None else None,
                      _personalization(personalized) if personalized is not None else None)


def _personalization(row: FederatedRound) -> dict[str, str]:
    m = row.metrics
    version = m.get("global-version")
    return {"version": f"v{int(version)}" if isinstance(version, (int, float)) and version >= 0 else display.DASH,
            "run": row.run_id, "round": str(row.round), "when": display.clock(row.recorded_at),
            "error": str(m["error"]) if "error" in m else "",
            "accuracy": f"{display.percent(m.get('global-accuracy'))} → {display.percent(m.get('personal-accuracy'))}"
                        + _kept(m)}


def _kept(m: dict[str, Any]) -> str:
    """Which model the device kept and its held-out accuracy, where it says (:mod:`common.keep_best`)."""
    name = kept_name(m.get("kept"))
    if name is None:
        return ""
    alone = f", alone {display.percent(m.get('local-accuracy'))}" if "local-accuracy" in m else ""
    fleet = " (the fleet's choice)" if m.get("kept-by-fleet") == 1 else ""
    return f"{alone}; kept {name} {display.percent(m.get('kept-accuracy'))}{fleet}"


CLOCK_FIELDS = {"sent_at", "since"}  # Unix times a heartbeat carries (device clock)


def _field_text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value) if display.present(value) else display.DASH


def _schedule_summary(session: Any, schedule_id: str) -> StoredSchedule | None:
    return session.scalar(select(StoredSchedule).where(StoredSchedule.schedule_id == schedule_id))


@dataclass(frozen=True)
class ScheduleRow:
    """A stored schedule with the solve that made it and how many devices use it."""

    schedule: StoredSchedule
    solve_status: str
    solve_seconds: float | None
    devices: int


def schedule_rows(db: Database) -> list[ScheduleRow]:
    """Every stored schedule, newest first."""
    with db.read() as session:
        users = (select(DeviceSchedule.schedule_id, func.count().label("devices"))
                 .group_by(DeviceSchedule.schedule_id).subquery())
        rows = session.execute(select(StoredSchedule, func.coalesce(users.c.devices, 0))
                               .outerjoin(users, users.c.schedule_id == StoredSchedule.schedule_id)
                               .order_by(StoredSchedule.created_at.desc())).all()
        solves: dict[str, tuple[str, float | None]] = {}
        for schedule_id, status, solve_seconds in session.execute(
                select(SolveRequest.schedule_id, SolveRequest.status, SolveRequest.solve_seconds)
                .where(SolveRequest.schedule_id.is_not(None)).order_by(SolveRequest.created_at)):
            solves.setdefault(schedule_id, (status, solve_seconds))
    return [ScheduleRow(schedule, *solves.get(schedule.schedule_id, ("stored", None)), devices)
            for schedule, devices in rows]


def open_solve_requests(db: Database, limit: int = 100) -> list[tuple[SolveRequest, str | None]]:
    """Schedule requests without a schedule (queued, solving, failed, timed out, cancelled), newest first, each
    with the name of the device that asked (``None``: asked outside the device API, or the device is gone)."""
    with db.read() as session:
        return [(request, name) for request, name in session.execute(
            select(SolveRequest, Device.name).outerjoin(Device, Device.id == SolveRequest.requested_by)
            .where(SolveRequest.schedule_id.is_(None)).order_by(SolveRequest.created_at.desc()).limit(limit))]


def graph_for(db: Database, schedule_id: str) -> tuple[bytes, bytes] | None:
    """A stored schedule's document and the training graph it was planned for (canonical JSON), or ``None``."""
    with db.read() as session:
        document = session.scalar(select(StoredSchedule.document).where(StoredSchedule.schedule_id == schedule_id))
        graph = session.scalar(select(SolveRequest.graph).where(SolveRequest.schedule_id == schedule_id).limit(1))
    return (document, graph) if document is not None and graph is not None else None


@dataclass(frozen=True)
class TokenRow:
    """An enrolment token as listed: never the token itself."""

    id: int
    created_at: float
    expires_at: float
    status: str
    used_by: str | None
    used_at: float | None


def token_rows(db: Database, now: float, limit: int = 200) -> list[TokenRow]:
    """The newest enrolment tokens, with whether each is valid, used, revoked or expired."""
    return [TokenRow(t.id, t.created_at, t.expires_at, devices.token_status(t, now), t.used_by, t.used_at)
            for t in devices.list_enrolment_tokens(db, limit)]


# The rounds table's columns: (metric key, heading, display function).
ROUND_COLUMNS = (
    ("accuracy", "Held-out acc.", display.percent), ("eval-loss", "Held-out loss", display.number),
    ("train-loss", "Train loss", display.number), ("steps", "Steps", display.count),
    ("num-examples", "Examples", display.count), ("energy-j", "Energy", display.joules),
    ("seconds", "Time", display.seconds),
)


@dataclass(frozen=True)
class RoundsView:
    """The rounds page: the runs stored, the one shown, and its rows (a dict of strings per device per round);
    the newest global model versions."""

    runs: list[int]
    run_id: int | None
    rows: list[dict[str, Any]]
    versions: list[dict[str, str]]


VERSIONS_SHOWN = 50


def rounds_view(db: Database, run_id: int | None = None) -> RoundsView:
    """The rows of run ``run_id`` (the newest run when ``None``), newest round first; the newest versions."""
    runs = run_ids(db)
    shown = run_id if run_id in runs else (runs[0] if runs else None)
    rows = round_rows(db, shown) if shown is not None else []
    versions = [{"version": f"v{v.version}", "run": v.run_id, "round": str(v.round),
                 "parent": f"v{v.parent}" if v.parent is not None else display.DASH,
                 "accuracy": display.percent(v.metrics.get("evaluate.accuracy")),
                 "loss": display.number(v.metrics.get("evaluate.eval-loss")),
                 "train_loss": display.number(v.metrics.get("train.train-loss")),
                 "model": v.model, "sha256": v.sha256[:16], "when": display.clock(v.created_at)}
                for v in list_versions(db, limit=VERSIONS_SHOWN)]
    return RoundsView(runs, shown, [_round_cells(r) for r in rows], versions)


def _round_cells(row: RoundRow) -> dict[str, Any]:
    m = {k: (None if isinstance(v, (int, float)) and v == -1 else v) for k, v in row.metrics.items()}
    cells = {key: show(m.get(key)) for key, _, show in ROUND_COLUMNS}
    cells["memory"] = display.memory(m.get("budget-bytes"), m.get("peak-bytes"))
    if "personal-accuracy" in m:
        cells["accuracy"] = (f"{display.percent(m.get('global-accuracy'))} → "
                             f"{display.percent(m['personal-accuracy'])}{_kept(m)}")
    return {"round": row.round, "phase": row.phase, "device": row.device_name, "node_id": str(row.node_id),
            "schedule_id": row.schedule_id, "cells": cells,
            "error": m.get("error") or (f"absent: {m['absent']}" if m.get("absent") else None)}
