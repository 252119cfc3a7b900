"""Exceptions raised by the energy meters.

The tree::

    EnergyMeterError              anything a meter refuses to do
    ├── MeterUnavailableError     this kind of meter is not on this machine
    ├── MeterPermissionError      the meter is there but this user may not read it
    └── MeterReadError            a read failed or returned something unreadable

``agent/errors.py`` does not exist yet; when the agent grows its own tree,
``EnergyMeterError`` should become a subclass of its base class.  OS and
pyserial errors are converted where they enter (``raise ... from exc``) and
every message says what to do next.
"""

from __future__ import annotations


class EnergyMeterError(Exception):
    """Base class of every error raised by ``agent.energy``."""


class MeterUnavailableError(EnergyMeterError):
    """The meter asked for does not exist here (no sysfs node, no serial port)."""


class MeterPermissionError(EnergyMeterError):
    """The meter exists but this process may not read it (RAPL since Linux 5.10)."""


class MeterReadError(EnergyMeterError):
    """A read failed, timed out, or returned data that does not parse."""
