"""Jetson board power from the INA3221 monitors, in both sysfs layouts.

JetPack 4 (L4T 32, the out-of-tree ``ina3221x`` IIO driver)::

    <root>/bus/i2c/drivers/ina3221x/*/iio:device*/rail_name_N      e.g. POM_5V_IN
    <root>/bus/i2c/drivers/ina3221x/*/iio:device*/in_power{N}_input  mW

JetPack 5/6 (L4T 34+, the mainline ``ina3221`` hwmon driver)::

    <root>/bus/i2c/drivers/ina3221/*/hwmon/hwmon*/in{N}_label    e.g. VDD_IN
    <root>/bus/i2c/drivers/ina3221/*/hwmon/hwmon*/in{N}_input    mV (bus voltage)
    <root>/bus/i2c/drivers/ina3221/*/hwmon/hwmon*/curr{N}_input  mA

In the hwmon layout channel 7 is the sum of the shunt voltages (not a rail),
and unconnected channels are labelled ``NC``; both are skipped.  The total
input rail (``VDD_IN``, ``POM_5V_IN`` on the Nano) measures the whole board
and is used alone when present, since the other rails are parts of it;
otherwise the rails are summed.  The Jetson Nano 2GB has no INA3221.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from engine.energy.errors import MeterReadError, MeterUnavailableError
from engine.energy.meter import DEFAULT_CLOCK, Clock
from engine.energy.sampling import DEFAULT_INTERVAL_S, SampledMeter

TOTAL_RAILS = ("VDD_IN", "POM_5V_IN")
_SUM_CHANNEL = 7
_HWMON_LABEL = re.compile(r"^in(\d+)_label$")
_IIO_RAIL = re.compile(r"^rail_name_(\d+)$")


@dataclass(frozen=True)
class Rail:
    """One monitored rail and the files its power is read from.

    Attributes
    ----------
    label:
        Rail name as the board calls it (``VDD_IN``).
    power_mw:
        JetPack 4: the power file, mW.
    voltage_mv, current_ma:
        JetPack 5/6: the bus voltage (mV) and current (mA) files.
    """

    label: str
    power_mw: Path | None = None
    voltage_mv: Path | None = None
    current_ma: Path | None = None

    def read_watts(self) -> float:
        """Power on this rail now, W."""
        if self.power_mw is not None:
            return _read_number(self.power_mw) / 1e3
        assert self.voltage_mv is not None and self.current_ma is not None
        return _read_number(self.voltage_mv) * _read_number(self.current_ma) / 1e6


def _read_number(path: Path) -> float:
    try:
        return float(path.read_text().strip())
    except (OSError, ValueError) as exc:
        raise MeterReadError(f"cannot read INA3221 value {path}: {exc}") from exc


def _read_label(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _is_rail(label: str) -> bool:
    return bool(label) and label.upper() != "NC" and not label.lower().startswith("sum of")


def find_rails(sysfs_root: str | Path = "/sys") -> list[Rail]:
    """Every connected rail of every INA3221 on the board, either layout.

    Raises
    ------
    MeterUnavailableError
        When neither driver is bound or no rail is connected.
    """
    drivers = Path(sysfs_root) / "bus" / "i2c" / "drivers"
    rails = _hwmon_rails(drivers / "ina3221") + _iio_rails(drivers / "ina3221x")
    if not rails:
        raise MeterUnavailableError(
            f"no INA3221 rail under {drivers}/ina3221 or {drivers}/ina3221x "
            "(not a Jetson, a Jetson Nano 2GB, or the driver is not bound)"
        )
    return rails


def _hwmon_rails(driver: Path) -> list[Rail]:
    rails = []
    for label_path in sorted(driver.glob("*/hwmon/hwmon*/in*_label")):
        match = _HWMON_LABEL.match(label_path.name)
        if not match or int(match.group(1)) == _SUM_CHANNEL:
            continue
        n, folder = match.group(1), label_path.parent
        label = _read_label(label_path)
        current = folder / f"curr{n}_input"
        if _is_rail(label) and current.exists():
            rails.append(Rail(label, voltage_mv=folder / f"in{n}_input", current_ma=current))
    return rails


def _iio_rails(driver: Path) -> list[Rail]:
    rails = []
    for name_path in sorted(driver.glob("*/iio:device*/rail_name_*")):
        match = _IIO_RAIL.match(name_path.name)
        if not match:
            continue
        label = _read_label(name_path)
        power = name_path.parent / f"in_power{match.group(1)}_input"
        if _is_rail(label) and power.exists():
            rails.append(Rail(label, power_mw=power))
    return rails


class Ina3221Source:
    """A :class:`~engine.energy.sampling.PowerSource` over the board's rails.

    Parameters
    ----------
    rails:
        From :func:`find_rails`; the total rail is picked out here.
    """

    def __init__(self, rails: list[Rail]) -> None:
        total = [rail for rail in rails if rail.label in TOTAL_RAILS]
        self.rails = total[:1] or rails
        if total:
            self.description = f"INA3221 {total[0].label}"
        else:
            self.description = "INA3221 sum of " + "+".join(rail.label for rail in rails)

    def read_watts(self) -> float:
        """Board power now, W."""
        return sum(rail.read_watts() for rail in self.rails)

    def close(self) -> None:
        """Nothing to release: each read opens and closes its files."""


def open_ina3221(
    sysfs_root: str | Path = "/sys",
    *,
    interval_s: float | None = DEFAULT_INTERVAL_S,
    clock: Clock = DEFAULT_CLOCK,
) -> SampledMeter:
    """A sampled meter over the Jetson's INA3221 (not started yet).

    Parameters
    ----------
    sysfs_root:
        Where sysfs is mounted; tests pass a fake tree.
    interval_s, clock:
        See :class:`~engine.energy.sampling.SampledMeter`.
    """
    return SampledMeter(Ina3221Source(find_rails(sysfs_root)), name="ina3221", interval_s=interval_s, clock=clock)
