"""Exceptions raised by the energy meters.

The whole tree, every package's branch with each class's exit code, is drawn once in
``docs/architecture.md`` ("Errors and exit codes"), generated from the classes and checked by
``tests/test_errors.py``.

OS and pyserial errors are converted where they enter (``raise ... from
exc``) and every message says what to do next.
"""

from __future__ import annotations

from engine.errors import EngineError
from common.exit_codes import ExitCode


class EnergyMeterError(EngineError):
    """Base class of every error raised by ``engine.energy``; commands exit 8 (meter) on any of them."""

    exit_code = ExitCode.METER


class MeterUnavailableError(EnergyMeterError):
    """The meter asked for does not exist here (no sysfs node, no serial port)."""


class MeterPermissionError(EnergyMeterError):
    """The meter exists but this process may not read it (RAPL since Linux 5.10)."""


class MeterReadError(EnergyMeterError):
    """A read failed, timed out, or returned data that does not parse."""
