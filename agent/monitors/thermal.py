"""Thermal: train only while the hottest sensor is below a limit.

Reads ``<sysfs_root>/sys/class/thermal/thermal_zone*/{type,temp}`` (millidegrees
Celsius); where the kernel has no thermal zone, asks ``psutil.sensors_temperatures()``
(hwmon on Linux, and the BSDs).  Training heats the SoC itself, so once too hot
the device must cool to ``limit - hysteresis`` before it trains again.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from agent.monitors.base import Verdict, read_attribute

Sensors = Callable[[], dict[str, list[Any]]]
"""Returns temperatures like ``psutil.sensors_temperatures()``: chip name -> readings with ``label`` and ``current``."""

_ZONE = re.compile(r"^thermal_zone(\d+)$")


@dataclass(frozen=True)
class Temperature:
    """One sensor's reading.

    Attributes
    ----------
    name:
        The zone's ``type`` (``cpu-thermal``, ``x86_pkg_temp``) or psutil's ``chip/label``.
    celsius:
        Degrees Celsius.
    """

    name: str
    celsius: float


def read_thermal_zones(sysfs_root: str | Path = "/") -> list[Temperature]:
    """Every readable thermal zone under ``<sysfs_root>/sys/class/thermal``, in zone order.

    A zone whose ``temp`` cannot be read (a sensor that is switched off answers
    ENODATA) or is not a number is left out.
    """
    folder = Path(sysfs_root) / "sys" / "class" / "thermal"
    try:
        zones = [entry for entry in folder.iterdir() if _ZONE.match(entry.name)]
    except OSError:
        return []
    readings = []
    for zone in sorted(zones, key=lambda z: int(_ZONE.match(z.name).group(1))):  # type: ignore[union-attr]
        millidegrees = read_attribute(zone / "temp")
        try:
            celsius = int(millidegrees) / 1000  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        readings.append(Temperature(read_attribute(zone / "type") or zone.name, celsius))
    return readings


def _read_psutil(sensors: Sensors | None) -> list[Temperature]:
    read = sensors if sensors is not None else getattr(psutil, "sensors_temperatures", None)
    if read is None:  # psutil has no temperature code for this platform (macOS, Windows)
        return []
    try:
        chips = read()
    except (OSError, RuntimeError, ValueError, psutil.Error):
        return []
    return [
        Temperature(f"{chip}/{entry.label}" if entry.label else chip, float(entry.current))
        for chip, entries in chips.items()
        for entry in entries
        if entry.current is not None
    ]


class ThermalMonitor:
    """Eligible while the hottest sensor is at or below ``limit_c``, with hysteresis once too hot.

    Parameters
    ----------
    limit_c:
        Not eligible above this, degrees Celsius.
    hysteresis_c:
        Once too hot, eligible again only below ``limit_c - hysteresis_c``.
    sysfs_root:
        Where the root filesystem is; ``/sys/class/thermal`` is read below it. Tests pass a fake tree.
    sensors:
        The fallback where there is no thermal zone; default ``psutil.sensors_temperatures``.
    """

    name = "thermal"

    def __init__(
        self,
        limit_c: float = 70.0,
        hysteresis_c: float = 5.0,
        sysfs_root: str | Path = "/",
        sensors: Sensors | None = None,
    ) -> None:
        self.limit_c = limit_c
        self.hysteresis_c = hysteresis_c
        self.sysfs_root = Path(sysfs_root)
        self._sensors = sensors
        self._too_hot = False

    def check(self, now: float) -> Verdict:
        """Read every sensor now; ``now`` is unused (the memory is only "too hot or not")."""
        readings = read_thermal_zones(self.sysfs_root) or _read_psutil(self._sensors)
        if not readings:
            self._too_hot = False
            return Verdict(self.name, True, "no temperature sensor", {"temperature_c": None})
        hottest = max(readings, key=lambda t: t.celsius)
        here = f"{hottest.name} {round(hottest.celsius, 1):g} C"  # 70.4 must not print as 70
        measured = {"temperature_c": round(hottest.celsius, 1)}
        if hottest.celsius > self.limit_c:
            self._too_hot = True
            return Verdict(self.name, False, f"{here} > {self.limit_c:g} C", measured)
        resume = self.limit_c - self.hysteresis_c
        if self._too_hot and hottest.celsius >= resume:
            hysteresis = f"{self.limit_c:g} C - {self.hysteresis_c:g} C hysteresis"
            return Verdict(self.name, False, f"{here}, cooling to below {resume:g} C ({hysteresis})", measured)
        self._too_hot = False
        return Verdict(self.name, True, f"{here} <= {self.limit_c:g} C", measured)
