"""Eligibility monitors: may the device train now (idle, charging, cool, room on disk, inside quiet hours)?

Typical use (the agent daemon's waiting loop)::

    from agent.monitors import Eligibility, IdleMonitor, PowerMonitor, QuietHours, ThermalMonitor

    eligibility = Eligibility([PowerMonitor(), IdleMonitor(), ThermalMonitor(), QuietHours("01:00-06:00")])
    decision = eligibility.check(time.monotonic())
    decision.eligible, decision.reason   # False, "on battery 43%; cpu-thermal 78 C > 70 C"

Each monitor is one small class behind :class:`Monitor` and reads the outside
world through a sysfs root or an injectable callable, so tests run against a
fake tree.  This package imports neither torch nor anything that does: the
waiting daemon stays small.

Modules: :mod:`~agent.monitors.base` (the interface, the combined decision),
:mod:`~agent.monitors.power`, :mod:`~agent.monitors.idle`,
:mod:`~agent.monitors.thermal`, :mod:`~agent.monitors.storage`, :mod:`~agent.monitors.quiet`, and
:mod:`~agent.monitors.network` (not a training condition: it gates the fleet's traffic).
"""

from __future__ import annotations

from agent.monitors.base import Decision, Eligibility, Monitor, Verdict
from agent.monitors.idle import ForegroundCpu, IdleMonitor
from agent.monitors.power import PowerMonitor, PowerSupply, read_power_supplies
from agent.monitors.quiet import QuietHours, parse_window
from agent.monitors.storage import StorageMonitor
from agent.monitors.thermal import Temperature, ThermalMonitor, read_thermal_zones

__all__ = [
    "Decision",
    "Eligibility",
    "ForegroundCpu",
    "IdleMonitor",
    "Monitor",
    "PowerMonitor",
    "PowerSupply",
    "QuietHours",
    "StorageMonitor",
    "Temperature",
    "ThermalMonitor",
    "Verdict",
    "parse_window",
    "read_power_supplies",
    "read_thermal_zones",
]
