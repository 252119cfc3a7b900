"""Power: train only on external power, with enough charge and a healthy supply.

Reads ``<sysfs_root>/sys/class/power_supply/*/{type,online,status,capacity}``
directly: ``psutil.sensors_battery()`` returns None on a Pi or a Jetson and
decides "plugged in" from the ``AC0``/``AC`` entries only.  psutil is asked
only where the kernel reports no power supply at all (macOS, Windows, BSD).

On a Raspberry Pi, ``vcgencmd get_throttled`` reports under-voltage (bit 0:
now, bit 16: since boot); a weak supply that browns out during training
corrupts the SD card, so under-voltage now blocks training.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from agent.monitors.base import Verdict, read_attribute

Runner = Callable[..., Any]
"""Runs a command like ``subprocess.run`` and returns an object with ``returncode``, ``stdout``, ``stderr``."""

_BATTERY_TYPES = {"Battery", "UPS"}
# Charge thresholds (ThinkPads, many laptops) hold a plugged-in battery at "Not charging" or "Unknown".
_PLUGGED_STATUSES = {"Not charging", "Unknown", None}
_UNDER_VOLTAGE_NOW = 1 << 0
_UNDER_VOLTAGE_SINCE_BOOT = 1 << 16
_THROTTLED = re.compile(r"throttled=(0x[0-9a-fA-F]+)")


@dataclass(frozen=True)
class PowerSupply:
    """One entry of ``/sys/class/power_supply`` as far as eligibility cares.

    Attributes
    ----------
    name:
        The entry's folder name (``BAT0``, ``AC``, ``usb``).
    type:
        ``Mains``, ``USB`` (older kernels: ``USB_DCP``, ``USB_PD``, ...), ``Wireless``, ``Battery`` or ``UPS``.
    online:
        The ``online`` attribute is ``1`` (an external supply delivering power).
    status:
        A battery's ``status`` (``Charging``, ``Discharging``, ``Not charging``, ``Full``, ``Unknown``), or None.
    capacity:
        A battery's charge, percent, or None when not reported.
    """

    name: str
    type: str
    online: bool
    status: str | None
    capacity: int | None

    @property
    def is_battery(self) -> bool:
        return self.type in _BATTERY_TYPES

    @property
    def is_external(self) -> bool:
        return self.type in ("Mains", "Wireless") or self.type.startswith("USB")


def read_power_supplies(sysfs_root: str | Path = "/") -> list[PowerSupply] | None:
    """The system's power supplies, by name; None when the kernel lists no entry at all.

    Peripheral batteries (``scope`` is ``Device``: a wireless mouse) and empty
    battery bays (``present`` is ``0``) are left out, as are entries whose
    ``type`` cannot be read.
    """
    folder = Path(sysfs_root) / "sys" / "class" / "power_supply"
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return None
    if not entries:
        return None
    supplies = [_read_supply(entry) for entry in entries]
    return [s for s in supplies if s is not None]


def _read_supply(entry: Path) -> PowerSupply | None:
    kind = read_attribute(entry / "type")
    if not kind or read_attribute(entry / "scope") == "Device":
        return None
    if kind in _BATTERY_TYPES and read_attribute(entry / "present") == "0":
        return None
    capacity = read_attribute(entry / "capacity")
    return PowerSupply(
        name=entry.name,
        type=kind,
        online=read_attribute(entry / "online") == "1",
        status=read_attribute(entry / "status"),
        capacity=int(capacity) if capacity and capacity.isdigit() else None,
    )


@dataclass(frozen=True)
class _PowerState:
    charging: bool  # on external power (charging, full, or held by a charge threshold), or no battery at all
    reason: str
    capacity: int | None
    source: str | None = None  # "mains", "usb", "battery"...; None where the kernel does not say


def _state_from_sysfs(supplies: list[PowerSupply]) -> _PowerState:
    external = [s for s in supplies if s.is_external and s.online]
    batteries = [s for s in supplies if s.is_battery]
    if not batteries:
        if external:
            kind = "mains" if any(s.type == "Mains" for s in external) else external[0].type
            return _PowerState(True, f"{kind} power, no battery", None, kind.lower())
        # Nothing can be discharging; a Pi UPS HAT, which registers no supply, is invisible here.
        return _PowerState(True, "no battery reported", None)
    capacity = min((b.capacity for b in batteries if b.capacity is not None), default=None)
    percent = "" if capacity is None else f" {capacity}%"
    statuses = {b.status for b in batteries}
    plugged = bool(external)
    if not all(b.status in ("Charging", "Full") or (plugged and b.status in _PLUGGED_STATUSES) for b in batteries):
        return _PowerState(False, f"on battery{percent}", capacity, "battery")
    if statuses == {"Full"}:
        word = "battery full"
    else:
        word = "charging" if "Charging" in statuses else "plugged in, not charging"
    sources = "+".join(sorted({s.type for s in external}))
    source = "mains" if any(s.type == "Mains" for s in external) else external[0].type.lower() if external else None
    return _PowerState(True, f"{word}{percent}" + (f" ({sources})" if sources else ""), capacity, source)


def _state_from_psutil() -> _PowerState:
    read = getattr(psutil, "sensors_battery", None)  # absent on platforms psutil has no battery code for
    try:
        battery = read() if read is not None else None
    except (OSError, RuntimeError, psutil.Error) as exc:
        return _PowerState(False, f"power state unknown (psutil.sensors_battery: {exc})", None)
    if battery is None:
        return _PowerState(True, "no battery reported", None)
    capacity = round(battery.percent)
    if battery.power_plugged:
        return _PowerState(True, f"plugged in {capacity}%", capacity, "mains")
    if battery.power_plugged is None:
        return _PowerState(False, f"battery {capacity}%, power source unknown", capacity)
    return _PowerState(False, f"on battery {capacity}%", capacity, "battery")


class PowerMonitor:
    """Eligible on external power (or with no battery), above a minimum charge, without under-voltage.

    Parameters
    ----------
    sysfs_root:
        Where the root filesystem is; ``/sys/class/power_supply`` is read below it. Tests pass a fake tree.
    require_charging:
        When False, running on battery is allowed (the minimum charge still applies).
    min_battery_percent:
        Not eligible while a battery's charge is below this (the lowest battery counts).
    run:
        Runs ``vcgencmd``, like ``subprocess.run``; by default ``subprocess.run`` where
        ``shutil.which(vcgencmd)`` finds the executable, and no under-voltage check elsewhere.
    vcgencmd:
        The Raspberry Pi firmware tool's name or path.
    """

    name = "power"

    def __init__(
        self,
        sysfs_root: str | Path = "/",
        *,
        require_charging: bool = True,
        min_battery_percent: float = 0,
        run: Runner | None = None,
        vcgencmd: str = "vcgencmd",
    ) -> None:
        self.sysfs_root = Path(sysfs_root)
        self.require_charging = require_charging
        self.min_battery_percent = min_battery_percent
        self.vcgencmd = vcgencmd
        self._run = run if run is not None else subprocess.run if shutil.which(vcgencmd) else None

    def check(self, now: float) -> Verdict:
        """Read the supplies (and ``vcgencmd``) now; ``now`` is unused: power has no memory."""
        supplies = read_power_supplies(self.sysfs_root)
        state = _state_from_psutil() if supplies is None else _state_from_sysfs(supplies)
        failing: list[str] = []
        notes = [state.reason]
        if self.require_charging and not state.charging:
            failing, notes = notes, []
        if state.capacity is not None and state.capacity < self.min_battery_percent:
            failing.append(f"battery {state.capacity}% < {self.min_battery_percent:g}% minimum")
        under_voltage_now, note = self._throttled()
        if note:
            (failing if under_voltage_now else notes).append(note)
        readings = {"power_source": state.source, "charging": state.charging, "battery_percent": state.capacity,
                    "under_voltage": under_voltage_now if self._run is not None else None}
        return Verdict(self.name, not failing, ", ".join(failing + notes), readings)

    def _throttled(self) -> tuple[bool, str | None]:
        """(under-voltage now, what to say) from ``vcgencmd get_throttled``; a failing tool is only reported."""
        if self._run is None:
            return False, None
        args = [self.vcgencmd, "get_throttled"]
        command = " ".join(args)
        try:
            result = self._run(args, capture_output=True, text=True, timeout=2.0, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            return False, f"{command} failed ({exc})"
        stdout, stderr = _text(result.stdout), _text(result.stderr)
        if result.returncode != 0:
            # Typically "VCHI initialization failed": the user is not in the video group.
            return False, f"{command} failed (exit {result.returncode}: {stderr.strip() or stdout.strip()})"
        match = _THROTTLED.search(stdout)
        if match is None:
            return False, f"{command}: unexpected output {stdout.strip()!r}"
        flags = int(match.group(1), 16)
        if flags & _UNDER_VOLTAGE_NOW:
            return True, f"under-voltage now ({command} {match.group(1)})"
        if flags & _UNDER_VOLTAGE_SINCE_BOOT:
            return False, f"under-voltage since boot ({command} {match.group(1)})"
        return False, None


def _text(output: str | bytes | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""
