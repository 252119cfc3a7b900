"""Federated rounds in the server's store: a row per device per round and phase, written and read back.

:mod:`server.federated.serverapp` turns each device's reply into a :class:`RoundRow` and
:func:`record_rounds` writes them; the dashboard's rounds page and
``poet-edge simulate`` read them with :func:`round_rows`.  No Flower here:
rows are plain data.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from server.db.engine import Database
from server.db.migrate import upgrade
from server.db.models import DEVICE_NAME_LENGTH, FederatedRound
from server.errors import DatabaseError

PHASES = ("train", "evaluate", "personalize", "keep")
PERSONALIZED = ("personalize", "keep")  # the phases whose rows say what a device kept (keep: the fleet's choice)


@dataclass(frozen=True)
class RoundRow:
    """One device's reply in one round: who sent it and its metrics (a ``MetricRecord`` as a dict)."""

    run_id: int
    round: int
    phase: str
    node_id: int
    device_name: str
    metrics: dict[str, Any]
    schedule_id: str | None = None
    recorded_at: float = field(default_factory=time.time)


def personalized(rows: Iterable[RoundRow]) -> list[RoundRow]:
    """Per device, the row that says what it kept after personalization: its ``keep`` row (the fleet's choice,
    with the personalize row's figures) where it has one, else its ``personalize`` row; in the rows' order."""
    final: dict[str, RoundRow] = {}
    for row in rows:
        if row.phase == "keep" or (row.phase == "personalize" and row.device_name not in final):
            final[row.device_name] = row
    return list(final.values())


def open_store(url: str) -> Database:
    """The server's database at ``url``, migrated to the newest schema (the rounds table included)."""
    database = Database(url)
    upgrade(database)
    return database


def record_rounds(database: Database, rows: Iterable[RoundRow]) -> int:
    """Write ``rows``; returns how many.  Database errors become :class:`DatabaseError`."""
    records = [FederatedRound(run_id=str(r.run_id), round=r.round, phase=r.phase, node_id=str(r.node_id),
                              device_name=r.device_name[:DEVICE_NAME_LENGTH], schedule_id=r.schedule_id,
                              metrics=dict(r.metrics), recorded_at=r.recorded_at) for r in rows]
    try:
        with database.write() as session:
            session.add_all(records)
    except SQLAlchemyError as exc:
        raise DatabaseError(f"cannot record federated rounds: {getattr(exc, 'orig', None) or exc}") from exc
    return len(records)


def run_ids(database: Database, limit: int = 50) -> list[int]:
    """The runs that have rows, newest first."""
    query = (select(FederatedRound.run_id).group_by(FederatedRound.run_id)
             .order_by(func.max(FederatedRound.recorded_at).desc()).limit(limit))
    with database.read() as session:
        return [int(r) for r in session.scalars(query)]


def round_rows(database: Database, run_id: int | None = None, limit: int = 2000) -> list[RoundRow]:
    """Stored rows, newest round first, then by device name; only run ``run_id`` when given."""
    query = select(FederatedRound).order_by(FederatedRound.run_id.desc(), FederatedRound.round.desc(),
                                            FederatedRound.phase, FederatedRound.device_name).limit(limit)
    if run_id is not None:
        query = query.where(FederatedRound.run_id == str(run_id))
    with database.read() as session:
        found = session.scalars(query).all()
    return [RoundRow(int(r.run_id), r.round, r.phase, int(r.node_id), r.device_name, dict(r.metrics), r.schedule_id,
                     r.recorded_at) for r in found]
