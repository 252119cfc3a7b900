"""The fallback: nominal powers times measured time, labelled as an estimate.

Used where the board has no sensor (a Raspberry Pi without a USB meter).  The
powers follow the device profile's convention (``schedules/device.py``):
``compute_w`` and ``memory_w`` are what computing and paging draw *above
idle*.  This meter reports whole-board energy like the real meters do, so it
charges ``idle_w + compute_w`` while computing, ``idle_w + memory_w`` while
paging and ``idle_w`` otherwise; which of those applies is what the caller
says through :meth:`EstimatedMeter.set_activity`.  The caller passes the
powers (from a ``DeviceProfile``); this module does not import the planner.
"""

from __future__ import annotations

import math
import threading
from contextlib import AbstractContextManager
from dataclasses import dataclass

from engine.energy.meter import DEFAULT_CLOCK, Activity, Clock, Measurement, measure_counter


@dataclass(frozen=True)
class NominalPowers:
    """Nominal powers of a device, W.

    Attributes
    ----------
    idle_w:
        The board doing nothing.
    compute_w:
        Added above idle while computing.
    memory_w:
        Added above idle while paging to or from flash/SD.
    """

    idle_w: float
    compute_w: float
    memory_w: float

    def __post_init__(self) -> None:
        for field, value in (("idle_w", self.idle_w), ("compute_w", self.compute_w), ("memory_w", self.memory_w)):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"nominal power {field} must be a finite number >= 0, not {value!r}")

    def board_watts(self, activity: Activity) -> float:
        """Whole-board power while doing ``activity``, W."""
        if activity is Activity.COMPUTE:
            return self.idle_w + self.compute_w
        if activity in (Activity.PAGE_IN, Activity.PAGE_OUT):
            return self.idle_w + self.memory_w
        return self.idle_w


class EstimatedMeter:
    """An :class:`~engine.energy.meter.EnergyMeter` that multiplies nominal power by time.

    Parameters
    ----------
    powers:
        The device's nominal powers.
    clock:
        Monotonic clock in seconds.
    """

    name = "estimate"
    source = "estimate from device profile"
    is_estimate = True

    def __init__(self, powers: NominalPowers, *, clock: Clock = DEFAULT_CLOCK) -> None:
        self.powers = powers
        self._clock = clock
        self._lock = threading.Lock()
        self._activity = Activity.IDLE
        self._t_last: float | None = None
        self._joules = 0.0

    def start(self) -> None:
        """Start the counter at 0 now (idempotent)."""
        with self._lock:
            if self._t_last is None:
                self._t_last = self._clock()

    def _accrue(self) -> None:
        """Charge the time since the last accrual at the current activity's power."""
        now = self._clock()
        assert self._t_last is not None
        self._joules += self.powers.board_watts(self._activity) * (now - self._t_last)
        self._t_last = now

    def read_joules(self) -> float:
        """Estimated energy since ``start()``, J."""
        self.start()
        with self._lock:
            self._accrue()
            return self._joules

    def set_activity(self, activity: Activity) -> None:
        """Charge what came before at the old power; from now on use ``activity``'s."""
        self.start()
        with self._lock:
            self._accrue()
            self._activity = Activity(activity)

    def measure(self) -> AbstractContextManager[Measurement]:
        """Estimate the wrapped block; yields a :class:`Measurement` marked as an estimate."""
        return measure_counter(self.read_joules, self._clock, source=self.source, is_estimate=True)

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> EstimatedMeter:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
