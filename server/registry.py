"""The schedule registry: signed schedules by id, and which schedule each device downloaded last."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.orm import Session

from schedules.schedule import Schedule
from server.db.engine import Database
from server.db.models import DeviceSchedule, StoredSchedule

DOCUMENT_CACHE_BYTES = 32 * 1024 * 1024  # schedule documents kept in memory, most recently used first


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
    """The signed schedule file's bytes, or ``None`` when no schedule has that id.

    A stored schedule never changes (its id names its payload), so documents
    are kept in memory once read: every device's periodic check asks for one.
    """
    cache = _caches.get(db)
    if cache is None:
        cache = _caches.setdefault(db, _DocumentCache(DOCUMENT_CACHE_BYTES))
    cached = cache.get(schedule_id)
    if cached is not None:
        return cached
    with db.read() as session:
        document = session.scalar(select(StoredSchedule.document).where(StoredSchedule.schedule_id == schedule_id))
    if document is not None:
        cache.put(schedule_id, document)
    return document


def record_download(db: Database, device_id: int, schedule_id: str, now: float) -> None:
    """Remember that the device uses ``schedule_id`` (downloaded, or found unchanged with ``If-None-Match``),
    and since when: the time is its first download or check of this schedule, so most checks of the fleet
    only read."""
    with db.lookups.connect() as connection:  # Core statements: every schedule check of the fleet comes here
        if connection.scalar(_DEVICE_SCHEDULE_NOW, {"device": device_id}) == schedule_id:
            return
    with db.write() as session:
        connection = session.connection()
        updated = connection.execute(_DEVICE_SCHEDULE, {"device": device_id, "schedule_id": schedule_id,
                                                        "downloaded_at": now})
        if updated.rowcount == 0:
            connection.execute(_DEVICE_SCHEDULE_NEW, {"device_id": device_id, "schedule_id": schedule_id,
                                                      "downloaded_at": now})


# Built once (building a statement costs more than SQLite running it); the columns come from the parameters' keys.
_DEVICE_SCHEDULE_NOW = select(DeviceSchedule.schedule_id).where(DeviceSchedule.device_id == bindparam("device"))
_DEVICE_SCHEDULE = update(DeviceSchedule).where(DeviceSchedule.device_id == bindparam("device"))
_DEVICE_SCHEDULE_NEW = insert(DeviceSchedule)


class _DocumentCache:
    """The most recently used schedule documents, at most ``max_bytes`` of them (thread-safe)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        with self._lock:
            document = self._items.get(key)
            if document is not None:
                self._items.move_to_end(key)
            return document

    def put(self, key: str, document: bytes) -> None:
        if len(document) > self.max_bytes:
            return
        with self._lock:
            if key in self._items:
                return
            self._items[key] = document
            self._bytes += len(document)
            while self._bytes > self.max_bytes:
                _, evicted = self._items.popitem(last=False)
                self._bytes -= len(evicted)


_caches: weakref.WeakKeyDictionary[Database, _DocumentCache] = weakref.WeakKeyDictionary()  # one per database
