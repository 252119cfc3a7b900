"""Fakes of the outside world for the energy meter tests.

A clock, sysfs trees (powercap, both INA3221 drivers), a reader the kernel
treats as an ordinary user, and a UM meter at the far end of a pseudo-terminal.

Only the world outside our code is faked; the meters under test are the real ones.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable
from pathlib import Path

import pytest


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def write(path: Path, text: object) -> Path:
    """Create ``path`` (and its folders) holding ``text`` and a newline, as sysfs files read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{text}\n")
    return path


def make_rapl_zone(root: Path, zone: str, name: str, energy_uj: int = 0, max_uj: int = 262_143_328_850) -> Path:
    """One powercap zone folder as the kernel shows it (262143328850 µJ is a common range)."""
    folder = root / "class" / "powercap" / zone
    write(folder / "name", name)
    write(folder / "energy_uj", energy_uj)
    write(folder / "max_energy_range_uj", max_uj)
    write(folder / "enabled", 1)
    return folder


def make_jetpack5_chip(root: Path, chip: str, rails: dict[int, tuple[str, int, int]]) -> Path:
    """One INA3221 under the hwmon driver: ``{channel: (label, mV, mA)}`` plus the sum channel 7."""
    driver = root / "bus" / "i2c" / "drivers" / "ina3221"
    for entry in ("bind", "unbind", "uevent"):  # the driver folder holds these beside the devices
        write(driver / entry, "")
    hwmon = driver / chip / "hwmon" / "hwmon3"
    write(hwmon / "name", "ina3221")
    for channel, (label, millivolts, milliamps) in rails.items():
        write(hwmon / f"in{channel}_label", label)
        write(hwmon / f"in{channel}_input", millivolts)
        write(hwmon / f"curr{channel}_input", milliamps)
        write(hwmon / f"in{channel + 3}_input", 1200)  # the channel's shunt voltage, µV, unlabelled
    write(hwmon / "in7_label", "sum of shunt voltages")
    write(hwmon / "in7_input", 3600)  # µV
    write(hwmon / "curr4_input", sum(ma for _, _, ma in rails.values()))  # sum of currents
    return hwmon


def make_jetpack4_chip(root: Path, chip: str, rails: dict[int, tuple[str, int]]) -> Path:
    """One INA3221 under the JetPack 4 IIO driver: ``{channel: (rail name, mW)}``."""
    driver = root / "bus" / "i2c" / "drivers" / "ina3221x"
    write(driver / "uevent", "")
    iio = driver / chip / "iio:device0"
    for channel, (label, milliwatts) in rails.items():
        write(iio / f"rail_name_{channel}", label)
        write(iio / f"in_power{channel}_input", milliwatts)
        write(iio / f"in_voltage{channel}_input", 5000)
        write(iio / f"in_current{channel}_input", milliwatts // 5)
    return iio


NOBODY = 65534


def run_unprivileged(action: Callable[[], str]) -> str:
    """Run ``action`` where the kernel enforces file modes, and return its answer.

    Not root: runs here.  Root (whom the kernel lets read a mode-000 file):
    runs in a forked child that has dropped to ``nobody``, so the refusal the
    test sees is the kernel's own.  Exceptions come back as ``"Name: message"``.
    """
    if os.getuid() != 0:
        return _answer(action)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        try:
            os.close(read_end)
            try:
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                answer = _answer(action)
            except OSError as exc:
                answer = f"cannot drop privileges: {exc}"
            os.write(write_end, answer.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(pid, 0)
    answer = b"".join(chunks).decode()
    if answer.startswith("cannot drop privileges"):
        pytest.skip(f"running as root without CAP_SETUID, so file modes cannot be enforced here ({answer})")
    return answer


def _answer(action: Callable[[], str]) -> str:
    try:
        return action()
    except Exception as exc:  # the test inspects which error and what it says
        return f"{type(exc).__name__}: {exc}"


# Model IDs at offset 0 of a UM frame.
UM24C, UM25C, UM34C = 0x0963, 0x09C9, 0x0D4C


def um_frame(model_id: int, raw_volts: int, raw_amps: int, raw_milliwatts: int, end: int = 0xFFF1) -> bytes:
    """A UM answer built byte by byte, big-endian, independently of the decoder's struct format."""
    frame = bytearray(130)
    frame[0], frame[1] = model_id >> 8, model_id & 0xFF
    frame[2], frame[3] = raw_volts >> 8, raw_volts & 0xFF
    frame[4], frame[5] = raw_amps >> 8, raw_amps & 0xFF
    for i in range(4):
        frame[6 + i] = (raw_milliwatts >> (24 - 8 * i)) & 0xFF
    frame[10], frame[11] = 0, 31  # temperature, °C
    frame[12], frame[13] = 0, 88  # temperature, °F
    frame[128], frame[129] = end >> 8, end & 0xFF
    return bytes(frame)


# 5.123 V and 0.4567 A on a UM25C, 2.339 W
UM25C_FRAME = um_frame(UM25C, 5123, 4567, 2339)


class PtyMeter:
    """A UM meter at the far end of a pseudo-terminal: answers every 0xF0 with ``frame``."""

    def __init__(self, frame: bytes | None, stale: bytes = b"") -> None:
        self.master, self.slave = os.openpty()
        self.path = os.ttyname(self.slave)
        self.frame, self.stale, self.requests = frame, stale, bytearray()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.master], [], [], 0.01)
            if not ready:
                continue
            request = os.read(self.master, 64)
            self.requests += request
            for _ in range(request.count(0xF0)):
                if self.frame is not None:
                    os.write(self.master, self.frame)

    def send_stale(self, data: bytes) -> None:
        """Bytes a previous, timed-out answer left on the line."""
        os.write(self.master, data)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        os.close(self.master)
        os.close(self.slave)
