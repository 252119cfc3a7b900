"""The one interface every energy meter offers, and what a measurement returns.

Two kinds of hardware hide behind it:

* counter meters (RAPL) keep a cumulative energy counter in the kernel;
  reading it twice and subtracting is the measurement;
* power meters (INA3221, USB meters, an INA219 on a microcontroller) report
  instantaneous power; :class:`engine.energy.sampling.SampledMeter` samples
  them on a background thread and integrates with the trapezoidal rule, so
  they too offer a cumulative counter.

Either way a caller sees a monotonically non-decreasing ``read_joules()``
(cheap: no blocking I/O, safe to call around every instruction of a step)
and a ``measure()`` context manager for a block of work (as exact as the
meter allows: sampled meters take a fresh sample at both ends)::

    with meter:                         # start() ... close()
        with meter.measure() as m:
            run_step()
        print(m.joules, m.seconds, m.watts)

Every meter measures *whole-board* (INA3221 ``VDD_IN``, a USB meter) or
*package* (RAPL) energy, idle draw included.  The planner's device profile
prices what computing and paging add above idle; subtract
``idle_power_w * seconds`` before comparing the two.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

Clock = Callable[[], float]
"""A monotonic clock in seconds; injectable so tests can drive time."""

DEFAULT_CLOCK: Clock = time.perf_counter


class Activity(str, enum.Enum):
    """What the device is doing, as far as energy accounting cares.

    The values name the executor's node classes; ``IDLE`` is everything else.
    """

    IDLE = "idle"
    COMPUTE = "compute"
    PAGE_IN = "page_in"
    PAGE_OUT = "page_out"


@dataclass
class Measurement:
    """Energy and time of one block of work; filled in when the block ends.

    Attributes
    ----------
    joules:
        Energy drawn during the block, J (0.0 until the block ends).
    seconds:
        Duration of the block on the meter's clock, s.
    source:
        The meter's human-readable source (``"INA3221 VDD_IN"``).
    is_estimate:
        True when the figure comes from nominal powers, not a measurement.
    done:
        False while the block is still running.
    """

    joules: float = 0.0
    seconds: float = 0.0
    source: str = ""
    is_estimate: bool = False
    done: bool = False

    @property
    def watts(self) -> float:
        """Mean power over the block, W (0.0 for an empty block)."""
        return self.joules / self.seconds if self.seconds > 0 else 0.0


@runtime_checkable
class EnergyMeter(Protocol):
    """Anything that can tell how much energy the device drew.

    Attributes
    ----------
    name:
        Short identifier of the meter kind (``"rapl"``, ``"ina3221"``,
        ``"um25c"``, ``"serial-csv"``, ``"estimate"``).
    source:
        Human-readable origin of the figures, for reports
        (``"RAPL package-0 via /sys/class/powercap"``).
    is_estimate:
        True when figures come from nominal powers rather than a sensor.
    """

    name: str
    source: str
    is_estimate: bool

    def start(self) -> None:
        """Begin measuring (idempotent); the counter starts at 0 here.

        ``read_joules`` and ``measure`` call it themselves when needed.
        """

    def read_joules(self) -> float:
        """Cumulative energy since ``start()``, J; never decreases."""

    def measure(self) -> AbstractContextManager[Measurement]:
        """Context manager measuring the block it wraps; yields a :class:`Measurement`."""

    def set_activity(self, activity: Activity) -> None:
        """Say what the device does from now on.

        Measuring meters ignore it; the estimate uses it to pick a nominal power.
        """

    def close(self) -> None:
        """Stop sampling and release the device (idempotent)."""

    def __enter__(self) -> EnergyMeter: ...

    def __exit__(self, *exc_info: object) -> None: ...


@contextmanager
def measure_counter(
    read_joules: Callable[[], float], clock: Clock, *, source: str, is_estimate: bool
) -> Iterator[Measurement]:
    """Measure a block by reading a cumulative counter before and after it.

    Parameters
    ----------
    read_joules:
        The meter's cumulative counter.
    clock:
        The meter's clock, for the block's duration.
    source, is_estimate:
        Copied into the :class:`Measurement`.

    Yields
    ------
    Measurement
        Filled in when the block exits, also when it raises: energy spent on
        a failed step was still spent.
    """
    result = Measurement(source=source, is_estimate=is_estimate)
    t0, j0 = clock(), read_joules()
    try:
        yield result
    finally:
        result.joules = read_joules() - j0
        result.seconds = clock() - t0
        result.done = True
