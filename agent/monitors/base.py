"""The one interface every monitor offers, and how their verdicts combine into a decision."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Verdict:
    """One monitor's answer.

    Attributes
    ----------
    name:
        The monitor that gave it (``"power"``, ``"idle"``, ``"thermal"``, ``"quiet_hours"``).
    eligible:
        True when this condition allows training now.
    reason:
        What was seen, for a person: ``"on battery 43%"``, ``"cpu-thermal 78 C > 70 C"``.
    readings:
        What was measured, for the fleet's dashboard (status fields of :mod:`agent.daemon.status`):
        ``power_source``, ``charging``, ``battery_percent``, ``under_voltage`` (power), ``temperature_c``
        (thermal), ``cpu_load`` (idle: foreground CPU percent). ``None`` where the device has no such sensor.
    """

    name: str
    eligible: bool
    reason: str
    readings: dict[str, Any] = field(default_factory=dict, compare=False)


@runtime_checkable
class Monitor(Protocol):
    """Anything that says whether one condition for training holds.

    ``check`` takes ``now``, a ``time.monotonic()`` reading, so that monitors
    with memory (how long the CPU has been idle) follow the caller's clock.
    A monitor never raises for what it reads from the outside world: a missing
    or unreadable sensor becomes part of the verdict's reason.
    """

    name: str

    def check(self, now: float) -> Verdict:
        """The verdict at ``now`` (monotonic seconds)."""
        ...


@dataclass(frozen=True)
class Decision:
    """Whether the device may train now, and every verdict behind the answer.

    Attributes
    ----------
    eligible:
        True when every monitor's verdict is eligible.
    reason:
        When not eligible, the failing verdicts' reasons joined by ``"; "``;
        otherwise every reason joined by ``", "``.
    verdicts:
        One per monitor, in the order the monitors were given.
    """

    eligible: bool
    reason: str
    verdicts: tuple[Verdict, ...]


class Eligibility:
    """Asks every monitor and combines their verdicts: training needs all of them.

    Parameters
    ----------
    monitors:
        The conditions to check, in the order their reasons are reported.
    """

    def __init__(self, monitors: Iterable[Monitor]) -> None:
        self.monitors: list[Monitor] = list(monitors)

    def check(self, now: float) -> Decision:
        """Ask each monitor at ``now`` (monotonic seconds); every monitor is asked, so
        stateful ones (idle, thermal hysteresis) keep their clocks up to date."""
        verdicts = tuple(monitor.check(now) for monitor in self.monitors)
        failing = [v.reason for v in verdicts if not v.eligible]
        if failing:
            return Decision(False, "; ".join(failing), verdicts)
        return Decision(True, ", ".join(v.reason for v in verdicts) or "no conditions set", verdicts)


def read_attribute(path: Path) -> str | None:
    """A sysfs attribute's text without the trailing newline, or None when it is missing or unreadable.

    Sysfs reads fail in many ways (EACCES, ENODATA from a sensor that is off,
    EIO from a driver); a monitor treats all of them as "not reported".
    """
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None
