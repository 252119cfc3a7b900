"""The fleet over time, for the dashboard's fleet charts: one sample a minute.

Each sample counts the devices online in each state, offline and revoked,
and adds up the training steps and energy every device reported since the
sample before.  A device's totals count from its agent's start, so a total
lower than the one before means the agent restarted and the whole new total
is new work (:func:`increase`).  Every server process samples; the minute
is the table's key, so with two processes on one database each minute is
stored once, by whichever came first.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from sqlalchemy import case, delete, func, select
from sqlalchemy.exc import IntegrityError

from server.db.engine import Database
from server.db.models import DEVICE_STATES, Device, FleetSample

SAMPLE_SECONDS = 60.0
KEEP_SECONDS = 8 * 86400.0  # a week of charts, and the day before it
_log = logging.getLogger(__name__)


def increase(before: float, after: float) -> float:
    """Work added to a running total between two readings: the difference, or the whole new total when the
    total fell (the agent restarted and counts from zero)."""
    return after - before if after >= before else after


@dataclass(frozen=True)
class Sample:
    """One minute of the fleet, as stored."""

    at: float
    counts: dict[str, int]
    steps: int | None
    energy_j: float | None


class FleetSampler:
    """Takes a sample every ``interval`` seconds on a thread of its own; :meth:`sample` takes one now."""

    def __init__(self, db: Database, online_seconds: float, interval: float = SAMPLE_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        self.db, self.online_seconds, self.interval, self.clock = db, online_seconds, interval, clock
        self._totals: dict[int, tuple[int, float]] | None = None  # each device's totals at the last sample
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self, now: float | None = None) -> Sample:
        """Read the fleet, store this minute's sample (unless another process stored it), drop old ones."""
        now = self.clock() if now is None else now
        with self.db.read() as session:
            counts = fleet_counts(session, now - self.online_seconds)
            totals = {device_id: (steps or 0, energy or 0.0) for device_id, steps, energy in
                      session.execute(select(Device.id, Device.steps_done, Device.energy_j))}
        steps, energy = (None, None) if self._totals is None else _added(self._totals, totals)
        self._totals = totals
        sample = Sample(now, counts, steps, energy)
        try:
            with self.db.write() as session:
                session.add(FleetSample(minute=int(now // 60), sampled_at=now, counts=counts, steps=steps,
                                        energy_j=energy))
        except IntegrityError:
            pass  # this minute is stored already (another process, or a restart within the minute)
        with self.db.write() as session:
            session.execute(delete(FleetSample).where(FleetSample.sampled_at < now - KEEP_SECONDS))
        return sample

    def start(self) -> None:
        """Sample now and then every ``interval`` seconds until :meth:`stop`."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="fleet-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling; returns when the thread has ended."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:  # a database hiccup loses one sample, never the server
                _log.exception("fleet sample failed; the next is in %g s", self.interval)
            self._stop.wait(self.interval)


STATUSES = ("online", "offline", "revoked")


def fleet_counts(session, online_since: float) -> dict[str, int]:
    """Devices by status (online, offline, revoked), and the online ones by the state they last reported."""
    status = case((Device.revoked_at.is_not(None), "revoked"),
                  ((Device.last_seen >= online_since), "online"), else_="offline")
    counts = dict.fromkeys((*STATUSES, *DEVICE_STATES), 0)
    for kind, state, n in session.execute(select(status, Device.state, func.count()).group_by(status, Device.state)):
        counts[kind] += n
        if kind == "online" and state in counts:
            counts[state] += n
    return counts


def _added(before: dict[int, tuple[int, float]], after: dict[int, tuple[int, float]]) -> tuple[int, float]:
    steps, energy = 0, 0.0
    for device_id, (now_steps, now_energy) in after.items():
        was_steps, was_energy = before.get(device_id, (0, 0.0))
        steps += int(increase(was_steps, now_steps))
        energy += increase(was_energy, now_energy)
    return steps, energy


def samples_since(db: Database, since: float) -> list[Sample]:
    """The stored samples taken at or after ``since``, oldest first."""
    with db.read() as session:
        rows = session.scalars(select(FleetSample).where(FleetSample.sampled_at >= since)
                               .order_by(FleetSample.minute)).all()
    return [Sample(r.sampled_at, r.counts, r.steps, r.energy_j) for r in rows]


def per_hour(samples: list[Sample]) -> list[tuple[float, int, float]]:
    """Steps and energy added in each clock hour that has samples: ``(hour start, steps, joules)``, in order."""
    hours: dict[float, list[float]] = {}
    for s in samples:
        if s.steps is None:
            continue
        totals = hours.setdefault(s.at // 3600 * 3600, [0, 0.0])
        totals[0] += s.steps
        totals[1] += s.energy_j or 0.0
    return [(hour, int(steps), energy) for hour, (steps, energy) in sorted(hours.items())]
