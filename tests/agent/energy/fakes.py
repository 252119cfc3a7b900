"""Fakes of the outside world for the energy meter tests: a clock, sysfs trees, an unprivileged reader.

Only the world outside our code is faked; the meters under test are the real ones.
"""

from __future__ import annotations

import os
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
        write(hwmon / f"in{channel + 3}_input", 12)  # shunt voltage of the channel, mV, unlabelled
    write(hwmon / "in7_label", "sum of shunt voltages")
    write(hwmon / "in7_input", 36)
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
