"""The schedule registry: signed schedules by id, and which schedule each device downloaded last."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from schedules.schedule import Schedule
from server.db.engine import Database
from server.db.models import DeviceSchedule, StoredSchedule


def store_schedule(session: Session, schedule: Schedule, now: float) -> StoredSchedule:
    """Store a signed schedule under its id (once: the same plan stored again is the same row)."""
    existing = session.get(StoredSchedule, schedule.schedule_id)
    if existing is not None:
        return existing
    row = StoredSchedule(
        schedule_id=schedule.schedule_id, document=schedule.to_json(), graph_fingerprint=schedule.graph_fingerprint,
        model=schedule.model[:200], device=schedule.device[:200], memory_budget=schedule.memory_budget,
        runtime_budget_ms=schedule.runtime_budget_ms, predicted_peak_bytes=schedule.predicted_peak_bytes,
        predicted_runtime_ms=schedule.predicted_runtime_ms, predicted_energy_j=schedule.predicted_energy_j,
        solver_status=schedule.solver.status[:32], created_at=now,
    )
    session.add(row)
    session.flush()
    return row


def schedule_document(db: Database, schedule_id: str) -> bytes | None:
    """The signed schedule file's bytes, or ``None`` when no schedule has that id."""
    with db.read() as session:
        return session.scalar(select(StoredSchedule.document).where(StoredSchedule.schedule_id == schedule_id))


def record_download(db: Database, device_id: int, schedule_id: str, now: float) -> None:
    """Remember that the device uses ``schedule_id`` (downloaded, or found unchanged with ``If-None-Match``)."""
    with db.write() as session:
        row = session.get(DeviceSchedule, device_id)
        if row is None:
            session.add(DeviceSchedule(device_id=device_id, schedule_id=schedule_id, downloaded_at=now))
        else:
            row.schedule_id, row.downloaded_at = schedule_id, now
