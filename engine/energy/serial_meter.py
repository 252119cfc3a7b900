"""Power meters on a serial port: RDTech UM24C/UM25C/UM34C and ``volts,amps`` lines.

RDTech UM series (USB pass-through meters, usually over Bluetooth RFCOMM,
``/dev/rfcomm0`` at 9600 baud): send the byte ``0xF0`` and the meter answers
with one 130-byte big-endian frame::

    offset  size  field
    0       u16   model ID: 0x0963 UM24C, 0x09C9 UM25C, 0x0D4C UM34C
    2       u16   voltage   UM25C: mV (/1000)       UM24C, UM34C: 10 mV (/100)
    4       u16   current   UM25C: 0.1 mA (/10000)  UM24C, UM34C: mA (/1000)
    6       u32   power     all models: mW (/1000)
    128     u16   0xFFF1 on UM24C and UM25C; the UM34C ends in a checksum byte

The UM25C sends ten times the resolution of the other two (1 mV / 0.1 mA
against 10 mV / 1 mA); the power field is mW on all three (checked against
rdserialtool and libsigrok's rdtech-um driver, which agree).  Power is taken
from the power field: 1 mW resolution is finer than volts times amps on the
UM24C/UM34C and plenty on the UM25C.

Line protocol (e.g. an INA219 on a microcontroller): the device prints lines
``volts,amps`` (more fields after those are ignored); lines that do not parse
(a header, a boot banner, a torn line) are counted in ``junk_lines`` and
skipped.  The newest complete line is the reading; older buffered lines are
stale.

Ports are opened with ``serial.serial_for_url``, so a device path, ``loop://``
or ``socket://host:port`` all work, and a pseudo-terminal serves as a fake meter.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import serial

from engine.energy.errors import MeterReadError, MeterUnavailableError
from engine.energy.meter import DEFAULT_CLOCK, Clock
from engine.energy.sampling import SampledMeter

UM_POLL = b"\xf0"
UM_FRAME_BYTES = 130
UM_END_MARKER = 0xFFF1
DEFAULT_BAUDRATE = 9600
DEFAULT_TIMEOUT_S = 1.0
# A UM frame takes ~135 ms at 9600 baud; polling faster only queues requests.
DEFAULT_UM_INTERVAL_S = 0.2
DEFAULT_LINE_INTERVAL_S = 0.1
_MAX_LINES_PER_READ = 1000  # a fast talker must not keep one read going forever


@dataclass(frozen=True)
class UMModel:
    """How one UM model encodes its readings."""

    name: str
    model_id: int
    volts_per_count: float
    amps_per_count: float
    has_end_marker: bool


UM_MODELS = {
    "UM24C": UMModel("UM24C", 0x0963, 1 / 100, 1 / 1000, has_end_marker=True),
    "UM25C": UMModel("UM25C", 0x09C9, 1 / 1000, 1 / 10000, has_end_marker=True),
    "UM34C": UMModel("UM34C", 0x0D4C, 1 / 100, 1 / 1000, has_end_marker=False),
}
_BY_ID = {model.model_id: model for model in UM_MODELS.values()}


@dataclass(frozen=True)
class UMReading:
    """One decoded UM frame (the fields energy accounting needs)."""

    model: str
    volts: float
    amps: float
    watts: float


def decode_um_frame(frame: bytes, expected_model: str | None = None) -> UMReading:
    """Decode a 130-byte UM frame.

    Parameters
    ----------
    frame:
        The meter's answer to ``0xF0``.
    expected_model:
        When given, a frame from another model is refused (its scales differ).

    Raises
    ------
    MeterReadError
        Wrong length, unknown model ID, wrong model, or a bad end marker.
    """
    if len(frame) != UM_FRAME_BYTES:
        raise MeterReadError(f"UM frame has {len(frame)} bytes, expected {UM_FRAME_BYTES}")
    model_id, raw_volts, raw_amps, raw_mw = struct.unpack_from(">HHHI", frame, 0)
    model = _BY_ID.get(model_id)
    if model is None:
        raise MeterReadError(f"UM frame starts with unknown model ID 0x{model_id:04X} (out of sync, or not a UM meter)")
    if expected_model is not None and model.name != expected_model.upper():
        raise MeterReadError(f"the meter is a {model.name}, but the config says {expected_model}; fix the config")
    (end,) = struct.unpack_from(">H", frame, UM_FRAME_BYTES - 2)
    if model.has_end_marker and end != UM_END_MARKER:
        raise MeterReadError(f"UM frame ends with 0x{end:04X}, expected 0x{UM_END_MARKER:04X} (torn frame)")
    return UMReading(model.name, raw_volts * model.volts_per_count, raw_amps * model.amps_per_count, raw_mw / 1000)


def open_port(url: str, *, baudrate: int = DEFAULT_BAUDRATE, timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
    """Open a serial port by path or pyserial URL; converts failures to meter errors.

    Raises
    ------
    MeterUnavailableError
        The port does not exist or cannot be opened.
    """
    try:
        return serial.serial_for_url(url, baudrate=baudrate, timeout=timeout_s)
    except (serial.SerialException, OSError, ValueError) as exc:
        raise MeterUnavailableError(
            f"cannot open serial meter port {url!r}: {exc}. Check the path (ls /dev/rfcomm* /dev/ttyUSB* "
            "/dev/ttyACM*), bind a Bluetooth meter first (`sudo rfcomm bind 0 <MAC>`), and make sure the "
            "agent's user is in the dialout group"
        ) from exc


class UMSource:
    """A :class:`~engine.energy.sampling.PowerSource` polling a UM24C/UM25C/UM34C.

    Parameters
    ----------
    port:
        An open pyserial port (anything with ``write``, ``read``,
        ``reset_input_buffer``, ``close``) whose timeout bounds a read.
    model:
        ``"UM24C"``, ``"UM25C"`` or ``"UM34C"``; selects the scales.
    label:
        Where the port is, for the description (``/dev/rfcomm0``).
    """

    def __init__(self, port: Any, model: str, *, label: str = "") -> None:
        if model.upper() not in UM_MODELS:
            raise ValueError(f"unknown UM model {model!r}; expected one of {', '.join(UM_MODELS)}")
        self.model = model.upper()
        self.description = f"{self.model} on {label or getattr(port, 'name', 'serial port')}"
        self._port = port

    def read(self) -> UMReading:
        """Poll the meter once and decode its frame."""
        try:
            self._port.reset_input_buffer()  # drop the tail of an earlier, timed-out frame
            self._port.write(UM_POLL)
            frame = self._port.read(UM_FRAME_BYTES)
        except (serial.SerialException, OSError) as exc:
            raise MeterReadError(f"{self.description}: serial I/O failed: {exc}") from exc
        if len(frame) < UM_FRAME_BYTES:
            raise MeterReadError(
                f"{self.description}: got {len(frame)} of {UM_FRAME_BYTES} bytes before the timeout; "
                "is the meter switched on, paired and in range?"
            )
        return decode_um_frame(frame, self.model)

    def read_watts(self) -> float:
        """Power through the meter now, W."""
        return self.read().watts

    def close(self) -> None:
        """Close the port."""
        self._port.close()


def parse_volts_amps(line: str) -> float | None:
    """Watts from a ``volts,amps[,...]`` line, or None when it does not parse.

    The magnitude is taken: a shunt wired the other way round reports
    negative current, and the energy drawn is the same.
    """
    fields = line.strip().split(",")
    if len(fields) < 2:
        return None
    try:
        volts, amps = float(fields[0]), float(fields[1])
    except ValueError:
        return None
    if not (math.isfinite(volts) and math.isfinite(amps)):  # "nan" and "inf" parse, but are no reading
        return None
    return abs(volts * amps)


class LineSource:
    """A :class:`~engine.energy.sampling.PowerSource` reading ``volts,amps`` lines.

    Parameters
    ----------
    port:
        An open pyserial port whose timeout bounds the wait for a line.
    label:
        Where the port is, for the description.

    Attributes
    ----------
    junk_lines:
        Lines that did not parse, so far.
    """

    def __init__(self, port: Any, *, label: str = "") -> None:
        self.description = f"volts,amps lines on {label or getattr(port, 'name', 'serial port')}"
        self.junk_lines = 0
        self._port = port
        self._partial = b""  # a line cut by the timeout, completed by the next read

    def read_watts(self) -> float:
        """Power from the newest complete line, W.

        Drains what is already buffered (older lines are stale), and waits up
        to the port's timeout for a line when nothing is buffered.

        Raises
        ------
        MeterReadError
            No parsable line arrived before the timeout.
        """
        newest = None
        for _ in range(_MAX_LINES_PER_READ):
            line = self._next_line()
            if line is None:
                break
            watts = parse_volts_amps(line)
            if watts is None:
                self.junk_lines += 1
                continue
            newest = watts
            if not self._buffered():
                break
        if newest is None:
            raise MeterReadError(
                f"{self.description}: no 'volts,amps' line before the timeout ({self.junk_lines} junk lines so far)"
            )
        return newest

    def _next_line(self) -> str | None:
        """One complete line, or None when the timeout passed first."""
        try:
            chunk = self._port.readline()
        except (serial.SerialException, OSError) as exc:
            raise MeterReadError(f"{self.description}: serial I/O failed: {exc}") from exc
        data = self._partial + chunk
        if not data.endswith(b"\n"):
            self._partial = data
            return None
        self._partial = b""
        return data.decode("ascii", errors="replace")

    def _buffered(self) -> int:
        try:
            return int(self._port.in_waiting)
        except (serial.SerialException, OSError):
            return 0

    def close(self) -> None:
        """Close the port."""
        self._port.close()


def open_serial_meter(
    url: str,
    *,
    protocol: str = "UM25C",
    baudrate: int = DEFAULT_BAUDRATE,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float | None = None,
    clock: Clock = DEFAULT_CLOCK,
) -> SampledMeter:
    """A sampled meter over a serial power meter (not started yet).

    Parameters
    ----------
    url:
        Device path or pyserial URL (``/dev/rfcomm0``, ``loop://``).
    protocol:
        ``"UM24C"``, ``"UM25C"``, ``"UM34C"`` or ``"csv"`` (``volts,amps`` lines).
    baudrate, timeout_s:
        Port settings; the timeout bounds one read.
    interval_s:
        Seconds between samples; defaults to 0.2 s for UM meters (a frame takes
        ~135 ms at 9600 baud) and 0.1 s for line devices.
    clock:
        See :class:`~engine.energy.sampling.SampledMeter`.
    """
    kind = protocol.upper()
    if kind != "CSV" and kind not in UM_MODELS:
        raise ValueError(f"unknown serial meter protocol {protocol!r}; expected csv or one of {', '.join(UM_MODELS)}")
    port = open_port(url, baudrate=baudrate, timeout_s=timeout_s)
    if kind == "CSV":
        source: UMSource | LineSource = LineSource(port, label=url)
        name, default_interval = "serial-csv", DEFAULT_LINE_INTERVAL_S
    else:
        source, name, default_interval = UMSource(port, kind, label=url), kind.lower(), DEFAULT_UM_INTERVAL_S
    return SampledMeter(source, name=name, interval_s=interval_s or default_interval, clock=clock)
