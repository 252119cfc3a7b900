"""Eligibility monitors against a fake outside world: a sysfs tree in tmp_path, a fake vcgencmd,
CPU counters, temperature readings and a wall clock chosen by the test.  The monitors are the real ones."""

from __future__ import annotations

import subprocess
import sys
from collections import namedtuple
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest

import agent.monitors
from agent.monitors import (
    Eligibility,
    ForegroundCpu,
    IdleMonitor,
    Monitor,
    PowerMonitor,
    QuietHours,
    ThermalMonitor,
    parse_window,
)

REPO = Path(__file__).resolve().parents[2]

# psutil's own result shapes (its named tuples are private)
Battery = namedtuple("Battery", "percent secsleft power_plugged")
Reading = namedtuple("Reading", "label current high critical")


# --- the outside world ------------------------------------------------------------------------------------------


def write(path: Path, text: object) -> None:
    """Create ``path`` holding ``text`` and a newline, as sysfs files read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{text}\n")


def supply(root: Path, name: str, kind: str, **attributes: object) -> Path:
    """One ``/sys/class/power_supply`` entry: its ``type`` plus the given attribute files."""
    folder = root / "sys" / "class" / "power_supply" / name
    write(folder / "type", kind)
    for attribute, value in attributes.items():
        write(folder / attribute, value)
    return folder


def unreadable(path: Path) -> None:
    """Make reading ``path`` fail with an OSError even as root (a folder in the file's place)."""
    if path.exists():
        path.unlink()
    path.mkdir(parents=True)


def laptop(root: Path, ac_online: int, status: str, capacity: int | str = 43) -> Path:
    """A laptop: the ACPI adapter ``AC`` (Mains) and one battery ``BAT0``."""
    supply(root, "AC", "Mains", online=ac_online)
    return supply(root, "BAT0", "Battery", status=status, capacity=capacity, present=1, scope="System")


def zone(root: Path, index: int, kind: str, millidegrees: object) -> Path:
    folder = root / "sys" / "class" / "thermal" / f"thermal_zone{index}"
    write(folder / "type", kind)
    write(folder / "temp", millidegrees)
    return folder


class FakeVcgencmd:
    """Answers ``vcgencmd get_throttled`` like the Pi firmware tool, and records how it was run."""

    def __init__(
        self, stdout: str = "throttled=0x0\n", returncode: int = 0, stderr: str = "", error: Exception | None = None
    ) -> None:
        self.stdout, self.returncode, self.stderr, self.error = stdout, returncode, stderr, error
        self.calls: list[tuple[list[str], dict[str, Any]]] = []

    def __call__(self, args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append((args, kwargs))
        if self.error is not None:
            raise self.error
        return subprocess.CompletedProcess(args, self.returncode, self.stdout, self.stderr)


class CpuSamples:
    """Foreground CPU percentages, one per call."""

    def __init__(self, values: Iterable[float]) -> None:
        self.values = list(values)

    def __call__(self) -> float:
        return self.values.pop(0)


def all_clear() -> FakeVcgencmd:
    """A vcgencmd reporting no throttling, so a power test sees only the supplies."""
    return FakeVcgencmd()


# --- power ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "reason"), [("USB", "USB power, no battery"), ("Mains", "mains power, no battery")])
def test_external_power_without_battery_counts_as_charging(tmp_path: Path, kind: str, reason: str) -> None:
    supply(tmp_path, "usb" if kind == "USB" else "AC", kind, online=1)
    verdict = PowerMonitor(tmp_path, run=all_clear()).check(0.0)
    assert (verdict.name, verdict.eligible, verdict.reason) == ("power", True, reason)


def test_laptop_on_battery_is_not_eligible_and_says_the_charge(tmp_path: Path) -> None:
    laptop(tmp_path, ac_online=0, status="Discharging", capacity=43)
    verdict = PowerMonitor(tmp_path, run=all_clear()).check(0.0)
    assert not verdict.eligible
    assert verdict.reason == "on battery 43%"


def test_on_battery_is_allowed_when_charging_is_not_required(tmp_path: Path) -> None:
    laptop(tmp_path, ac_online=0, status="Discharging", capacity=43)
    verdict = PowerMonitor(tmp_path, require_charging=False, run=all_clear()).check(0.0)
    assert verdict.eligible
    assert verdict.reason == "on battery 43%"


@pytest.mark.parametrize(
    ("ac_online", "status", "capacity", "eligible", "reason"),
    [
        (1, "Charging", 43, True, "charging 43% (Mains)"),
        (1, "Full", 100, True, "battery full 100% (Mains)"),
        (1, "Not charging", 80, True, "plugged in, not charging 80% (Mains)"),  # held by a charge threshold
        (1, "Unknown", 80, True, "plugged in, not charging 80% (Mains)"),
        (0, "Not charging", 80, False, "on battery 80%"),
        (0, "Charging", 43, True, "charging 43%"),  # charging from a supply the kernel does not list
    ],
)
def test_battery_status_decides_with_the_external_supply(
    tmp_path: Path, ac_online: int, status: str, capacity: int, eligible: bool, reason: str
) -> None:
    laptop(tmp_path, ac_online=ac_online, status=status, capacity=capacity)
    verdict = PowerMonitor(tmp_path, run=all_clear()).check(0.0)
    assert (verdict.eligible, verdict.reason) == (eligible, reason)


@pytest.mark.parametrize(("status", "eligible"), [("Discharging", False), ("Charging", True), ("Full", True)])
def test_a_ups_counts_like_a_battery(tmp_path: Path, status: str, eligible: bool) -> None:
    supply(tmp_path, "ups", "UPS", status=status, capacity=90)
    assert PowerMonitor(tmp_path, run=all_clear()).check(0.0).eligible is eligible


def test_any_discharging_battery_means_on_battery_and_the_lowest_charge_is_reported(tmp_path: Path) -> None:
    supply(tmp_path, "AC", "Mains", online=0)
    supply(tmp_path, "BAT0", "Battery", status="Unknown", capacity=60)
    supply(tmp_path, "BAT1", "Battery", status="Discharging", capacity=30)
    verdict = PowerMonitor(tmp_path, run=all_clear()).check(0.0)
    assert (verdict.eligible, verdict.reason) == (False, "on battery 30%")


def test_peripheral_batteries_and_empty_bays_are_ignored(tmp_path: Path) -> None:
    supply(tmp_path, "AC", "Mains", online=1)
    supply(tmp_path, "hid-00:1f:20:aa:bb:cc-battery", "Battery", status="Discharging", capacity=5, scope="Device")
    supply(tmp_path, "BAT1", "Battery", status="Discharging", capacity=0, present=0)
    verdict = PowerMonitor(tmp_path, run=all_clear()).check(0.0)
    assert (verdict.eligible, verdict.reason) == (True, "mains power, no battery")


def test_unreadable_files_are_tolerated(tmp_path: Path) -> None:
    battery = laptop(tmp_path, ac_online=1, status="Charging", capacity=43)
    unreadable(battery / "status")
    write(battery / "capacity", "not a number")
    broken = supply(tmp_path, "weird", "Battery", status="Discharging")
    unreadable(broken / "type")  # cannot tell what it is: left out
    verdict = PowerMonitor(tmp_path, run=all_clear()).check(0.0)
    assert (verdict.eligible, verdict.reason) == (True, "plugged in, not charging (Mains)")


def test_an_unreadable_status_without_external_power_is_on_battery(tmp_path: Path) -> None:
    battery = laptop(tmp_path, ac_online=0, status="Charging", capacity=43)
    unreadable(battery / "status")
    unreadable(tmp_path / "sys/class/power_supply/AC/online")
    verdict = PowerMonitor(tmp_path, run=all_clear()).check(0.0)
    assert (verdict.eligible, verdict.reason) == (False, "on battery 43%")


@pytest.mark.parametrize(
    ("battery", "eligible", "reason"),
    [
        (None, True, "no battery reported"),
        (Battery(43.4, 3600, False), False, "on battery 43%"),
        (Battery(80.0, psutil.POWER_TIME_UNLIMITED, True), True, "plugged in 80%"),
        (Battery(80.0, 3600, None), False, "battery 80%, power source unknown"),
    ],
)
def test_without_any_power_supply_psutil_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, battery: Battery | None, eligible: bool, reason: str
) -> None:
    (tmp_path / "sys" / "class" / "power_supply").mkdir(parents=True)  # listed but empty, as in a container
    monkeypatch.setattr(psutil, "sensors_battery", lambda: battery)
    verdict = PowerMonitor(tmp_path, run=all_clear()).check(0.0)
    assert (verdict.eligible, verdict.reason) == (eligible, reason)


def test_a_failing_psutil_is_not_eligible_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> None:
        raise OSError("no such device")

    monkeypatch.setattr(psutil, "sensors_battery", fail)
    verdict = PowerMonitor(tmp_path, run=all_clear()).check(0.0)
    assert not verdict.eligible
    assert "no such device" in verdict.reason


def test_psutil_is_not_asked_when_the_kernel_lists_supplies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # psutil counts any entry named "*battery*", so a desktop's mouse would look like a discharging laptop.
    supply(tmp_path, "hid-mouse-battery", "Battery", status="Discharging", capacity=20, scope="Device")
    monkeypatch.setattr(psutil, "sensors_battery", lambda: Battery(20.0, 600, False))
    verdict = PowerMonitor(tmp_path, run=all_clear()).check(0.0)
    assert (verdict.eligible, verdict.reason) == (True, "no battery reported")


@pytest.mark.parametrize(("capacity", "eligible"), [(12, False), (29, False), (30, True), (80, True)])
def test_minimum_charge_applies_even_while_charging(tmp_path: Path, capacity: int, eligible: bool) -> None:
    laptop(tmp_path, ac_online=1, status="Charging", capacity=capacity)
    verdict = PowerMonitor(tmp_path, min_battery_percent=30, run=all_clear()).check(0.0)
    assert verdict.eligible is eligible
    assert ("< 30% minimum" in verdict.reason) is not eligible
    assert f"charging {capacity}% (Mains)" in verdict.reason


def test_under_voltage_now_blocks_training(tmp_path: Path) -> None:
    supply(tmp_path, "usb", "USB", online=1)
    vcgencmd = FakeVcgencmd("throttled=0x50005\n")
    verdict = PowerMonitor(tmp_path, run=vcgencmd).check(0.0)
    assert not verdict.eligible
    assert verdict.reason == "under-voltage now (vcgencmd get_throttled 0x50005), USB power, no battery"
    args, kwargs = vcgencmd.calls[0]
    assert args == ["vcgencmd", "get_throttled"]
    assert kwargs["timeout"] == 2.0


@pytest.mark.parametrize(
    ("ac_online", "status", "readings"),
    [
        (1, "Charging", {"power_source": "mains", "charging": True, "battery_percent": 43}),
        (0, "Discharging", {"power_source": "battery", "charging": False, "battery_percent": 43}),
    ],
)
def test_the_power_verdict_carries_what_the_dashboard_shows(
    tmp_path: Path, ac_online: int, status: str, readings: dict[str, Any]
) -> None:
    laptop(tmp_path, ac_online=ac_online, status=status, capacity=43)
    verdict = PowerMonitor(tmp_path, run=FakeVcgencmd("throttled=0x50005\n")).check(0.0)
    assert verdict.readings == {**readings, "under_voltage": True}
    usb_only = tmp_path / "usb"
    supply(usb_only, "usb", "USB", online=1)
    assert PowerMonitor(usb_only, vcgencmd="/nonexistent/vcgencmd").check(0.0).readings == {
        "power_source": "usb", "charging": True, "battery_percent": None, "under_voltage": None}


def test_under_voltage_since_boot_is_only_mentioned(tmp_path: Path) -> None:
    supply(tmp_path, "usb", "USB", online=1)
    verdict = PowerMonitor(tmp_path, run=FakeVcgencmd("throttled=0x50000\n")).check(0.0)
    assert verdict.eligible
    assert verdict.reason == "USB power, no battery, under-voltage since boot (vcgencmd get_throttled 0x50000)"


def test_no_throttling_adds_nothing(tmp_path: Path) -> None:
    supply(tmp_path, "usb", "USB", online=1)
    verdict = PowerMonitor(tmp_path, run=FakeVcgencmd("throttled=0x0\n")).check(0.0)
    assert (verdict.eligible, verdict.reason) == (True, "USB power, no battery")


@pytest.mark.parametrize(
    ("vcgencmd", "said"),
    [
        (FakeVcgencmd(error=subprocess.TimeoutExpired(["vcgencmd"], 2.0)), "timed out"),
        (FakeVcgencmd(error=PermissionError("Permission denied")), "Permission denied"),
        (FakeVcgencmd("", returncode=255, stderr="VCHI initialization failed\n"), "exit 255: VCHI initialization"),
        (FakeVcgencmd("error=1 error_msg=\"Command not registered\"\n"), "unexpected output"),
    ],
)
def test_a_failing_vcgencmd_is_reported_not_fatal(tmp_path: Path, vcgencmd: FakeVcgencmd, said: str) -> None:
    supply(tmp_path, "usb", "USB", online=1)
    verdict = PowerMonitor(tmp_path, run=vcgencmd).check(0.0)
    assert verdict.eligible
    assert verdict.reason.startswith("USB power, no battery, vcgencmd get_throttled")
    assert said in verdict.reason


def test_vcgencmd_on_the_path_is_run_and_its_absence_skips_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    supply(tmp_path, "usb", "USB", online=1)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    assert PowerMonitor(tmp_path).check(0.0).reason == "USB power, no battery"
    script = bin_dir / "vcgencmd"
    script.write_text('#!/bin/sh\n[ "$1" = get_throttled ] && echo throttled=0x1\n')
    script.chmod(0o755)
    verdict = PowerMonitor(tmp_path).check(0.0)
    assert not verdict.eligible
    assert verdict.reason == "under-voltage now (vcgencmd get_throttled 0x1), USB power, no battery"


# --- idle -------------------------------------------------------------------------------------------------------


def test_idle_needs_the_whole_duration() -> None:
    monitor = IdleMonitor(max_foreground_percent=20, idle_seconds=60, sample=CpuSamples([3, 3, 3]))
    first, second, third = (monitor.check(t) for t in (0.0, 30.0, 60.0))
    assert (first.eligible, first.reason) == (False, "foreground CPU 3% <= 20% for 0 s, needs 60 s")
    assert (second.eligible, second.reason) == (False, "foreground CPU 3% <= 20% for 30 s, needs 60 s")
    assert (third.eligible, third.reason) == (True, "foreground CPU 3% <= 20% for 60 s")
    assert third.readings == {"cpu_load": 3.0}


def test_busy_cpu_restarts_the_idle_clock_from_the_sample_it_covers() -> None:
    monitor = IdleMonitor(max_foreground_percent=20, idle_seconds=60, sample=CpuSamples([3, 61, 3, 3]))
    monitor.check(0.0)
    busy = monitor.check(30.0)
    assert (busy.eligible, busy.reason) == (False, "foreground CPU 61% > 20% for 30 s")
    # The 3% at t=60 covers 30..60: idle since 30, not since 0.
    assert monitor.check(60.0).reason == "foreground CPU 3% <= 20% for 30 s, needs 60 s"
    assert monitor.check(90.0).eligible


def test_hysteresis_keeps_an_idle_device_eligible_until_threshold_plus_margin() -> None:
    samples = CpuSamples([3, 3, 24, 25, 26, 24, 3])
    monitor = IdleMonitor(max_foreground_percent=20, idle_seconds=30, hysteresis_percent=5, sample=samples)
    monitor.check(0.0)
    assert monitor.check(30.0).eligible
    in_band = monitor.check(40.0)
    assert (in_band.eligible, in_band.reason) == (True, "foreground CPU 24% <= 25% (20% + 5% hysteresis) for 40 s")
    assert monitor.check(50.0).eligible  # exactly at the ceiling
    left = monitor.check(60.0)
    assert (left.eligible, left.reason) == (False, "foreground CPU 26% > 25% (20% + 5% hysteresis) for 10 s")
    # Busy again: the plain threshold applies until it has been idle for the whole duration.
    again = monitor.check(70.0)
    assert (again.eligible, again.reason) == (False, "foreground CPU 24% > 20% for 20 s")
    assert monitor.check(80.0).reason == "foreground CPU 3% <= 20% for 10 s, needs 30 s"


def test_a_device_never_idle_is_not_let_in_by_the_hysteresis_band() -> None:
    monitor = IdleMonitor(max_foreground_percent=20, idle_seconds=10, hysteresis_percent=5, sample=CpuSamples([22] * 5))
    assert not any(monitor.check(t).eligible for t in (0.0, 10.0, 20.0, 30.0, 40.0))


def _cpu_times(**seconds: float) -> Any:
    """A ``psutil.cpu_times()`` result of this platform's shape: the named fields set, the rest 0."""
    shape = type(psutil.cpu_times())
    return shape(**{field: seconds.get(field, 0.0) for field in shape._fields})


def test_foreground_cpu_counts_user_and_system_and_leaves_niced_work_out(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = [
        _cpu_times(user=100, nice=0, system=50, idle=850),
        # 10 s on one CPU: 1 s user, 1 s system, 5 s niced (the agent training), 3 s idle
        _cpu_times(user=101, nice=5, system=51, idle=853),
        _cpu_times(user=101, nice=5, system=51, idle=853),  # no tick since: the previous figure stands
    ]
    monkeypatch.setattr(psutil, "cpu_times", lambda percpu=False: readings.pop(0))
    sample = ForegroundCpu()
    assert sample() == pytest.approx(20.0)
    assert sample() == pytest.approx(20.0)


# --- thermal ----------------------------------------------------------------------------------------------------


def test_the_hottest_zone_decides(tmp_path: Path) -> None:
    zone(tmp_path, 0, "cpu-thermal", 45_000)
    zone(tmp_path, 1, "gpu-thermal", 78_000)
    zone(tmp_path, 2, "board", 30_000)
    verdict = ThermalMonitor(limit_c=70, sysfs_root=tmp_path).check(0.0)
    assert (verdict.name, verdict.eligible, verdict.reason) == ("thermal", False, "gpu-thermal 78 C > 70 C")
    assert verdict.readings == {"temperature_c": 78.0}


def test_thermal_hysteresis(tmp_path: Path) -> None:
    sensor = zone(tmp_path, 0, "cpu-thermal", 48_312)
    monitor = ThermalMonitor(limit_c=70, hysteresis_c=5, sysfs_root=tmp_path)

    def at(millidegrees: int) -> tuple[bool, str]:
        write(sensor / "temp", millidegrees)
        verdict = monitor.check(0.0)
        return verdict.eligible, verdict.reason

    assert at(48_312) == (True, "cpu-thermal 48.3 C <= 70 C")
    assert at(70_000) == (True, "cpu-thermal 70 C <= 70 C")
    assert at(70_400) == (False, "cpu-thermal 70.4 C > 70 C")
    assert at(67_000) == (False, "cpu-thermal 67 C, cooling to below 65 C (70 C - 5 C hysteresis)")
    assert at(65_000) == (False, "cpu-thermal 65 C, cooling to below 65 C (70 C - 5 C hysteresis)")
    assert at(64_900) == (True, "cpu-thermal 64.9 C <= 70 C")
    assert at(68_000) == (True, "cpu-thermal 68 C <= 70 C")  # cool again: the plain limit applies


def test_unreadable_zones_are_skipped(tmp_path: Path) -> None:
    zone(tmp_path, 0, "cpu-thermal", 50_000)
    unreadable(zone(tmp_path, 1, "iwlwifi_1", 90_000) / "temp")  # a switched-off sensor answers ENODATA
    zone(tmp_path, 2, "acpitz", "garbage")
    verdict = ThermalMonitor(sysfs_root=tmp_path, sensors=lambda: {"hot": [Reading("", 99.0, None, None)]}).check(0.0)
    assert (verdict.eligible, verdict.reason) == (True, "cpu-thermal 50 C <= 70 C")


def test_psutil_sensors_are_the_fallback_without_zones(tmp_path: Path) -> None:
    readings = {
        "coretemp": [Reading("Package id 0", 81.0, 100.0, 100.0), Reading("Core 0", 79.0, 100.0, 100.0)],
        "nvme": [Reading("", 40.0, None, None)],
    }
    verdict = ThermalMonitor(sysfs_root=tmp_path, sensors=lambda: readings).check(0.0)
    assert (verdict.eligible, verdict.reason) == (False, "coretemp/Package id 0 81 C > 70 C")


def test_no_sensor_at_all_is_eligible(tmp_path: Path) -> None:
    verdict = ThermalMonitor(sysfs_root=tmp_path, sensors=dict).check(0.0)
    assert (verdict.eligible, verdict.reason, verdict.readings) == (True, "no temperature sensor",
                                                                    {"temperature_c": None})


# --- quiet hours ------------------------------------------------------------------------------------------------


def _at(hour: int, minute: int) -> Callable[[], datetime]:
    """A wall clock stopped at hour:minute."""
    return lambda: datetime(2025, 3, 14, hour, minute)


@pytest.mark.parametrize(
    ("hour", "minute", "inside"),
    [
        (22, 59, False), (23, 0, True), (23, 59, True), (0, 0, True),
        (2, 30, True), (5, 59, True), (6, 0, False), (14, 12, False),
    ],
)
def test_quiet_hours_wrap_midnight(hour: int, minute: int, inside: bool) -> None:
    verdict = QuietHours("23:00-06:00", clock=_at(hour, minute)).check(0.0)
    assert verdict.eligible is inside
    where = "inside" if inside else "outside"
    assert verdict.reason == f"{where} quiet hours 23:00-06:00 (now {hour:02d}:{minute:02d})"


@pytest.mark.parametrize(
    ("hour", "minute", "inside"), [(0, 59, False), (1, 0, True), (5, 59, True), (6, 0, False), (14, 12, False)]
)
def test_quiet_hours_within_one_day(hour: int, minute: int, inside: bool) -> None:
    assert QuietHours("01:00-06:00", clock=_at(hour, minute)).check(0.0).eligible is inside


def test_quiet_hours_until_midnight() -> None:
    assert QuietHours("22:00-24:00", clock=_at(23, 59)).check(0.0).eligible
    assert not QuietHours("22:00-24:00", clock=_at(0, 0)).check(0.0).eligible


def test_quiet_hours_tolerate_spaces_and_one_digit_hours() -> None:
    verdict = QuietHours(" 1:00 - 6:30 ", clock=_at(6, 15)).check(0.0)
    assert verdict.reason == "inside quiet hours 01:00-06:30 (now 06:15)"


@pytest.mark.parametrize(
    "text", ["25:00-06:00", "01:60-06:00", "01:00-24:30", "24:00-06:00", "1-6", "01:00", "", "night"]
)
def test_malformed_quiet_hours_are_refused_with_the_expected_form(text: str) -> None:
    with pytest.raises(ValueError, match=r"quiet hours .*: expected HH:MM-HH:MM") as caught:
        parse_window(text)
    assert repr(text) in str(caught.value)
    with pytest.raises(ValueError):
        QuietHours(text)


def test_quiet_hours_of_zero_length_are_refused() -> None:
    with pytest.raises(ValueError, match="start equals end"):
        parse_window("01:00-01:00")


# --- eligibility ------------------------------------------------------------------------------------------------


def test_eligibility_reports_only_the_failing_reasons(tmp_path: Path) -> None:
    laptop(tmp_path, ac_online=0, status="Discharging", capacity=43)
    zone(tmp_path, 0, "cpu-thermal", 78_000)
    monitors = [
        PowerMonitor(tmp_path, run=all_clear()),
        ThermalMonitor(sysfs_root=tmp_path),
        QuietHours("01:00-06:00", clock=_at(2, 0)),
    ]
    decision = Eligibility(monitors).check(0.0)
    assert not decision.eligible
    assert decision.reason == "on battery 43%; cpu-thermal 78 C > 70 C"
    verdicts = [(v.name, v.eligible) for v in decision.verdicts]
    assert verdicts == [("power", False), ("thermal", False), ("quiet_hours", True)]


def test_eligibility_lists_every_reason_when_eligible(tmp_path: Path) -> None:
    laptop(tmp_path, ac_online=1, status="Charging", capacity=43)
    zone(tmp_path, 0, "cpu-thermal", 50_000)
    monitors = [
        PowerMonitor(tmp_path, run=all_clear()), ThermalMonitor(sysfs_root=tmp_path), QuietHours(clock=_at(2, 0))
    ]
    decision = Eligibility(monitors).check(0.0)
    assert decision.eligible
    assert decision.reason == (
        "charging 43% (Mains), cpu-thermal 50 C <= 70 C, inside quiet hours 01:00-06:00 (now 02:00)"
    )


def test_every_monitor_is_asked_so_the_idle_clock_runs_while_on_battery(tmp_path: Path) -> None:
    ac = supply(tmp_path, "AC", "Mains", online=0)
    supply(tmp_path, "BAT0", "Battery", status="Discharging", capacity=90)
    eligibility = Eligibility(
        [PowerMonitor(tmp_path, run=all_clear()), IdleMonitor(idle_seconds=60, sample=CpuSamples([1, 1, 1]))]
    )
    assert eligibility.check(0.0).reason == "on battery 90%; foreground CPU 1% <= 20% for 0 s, needs 60 s"
    assert not eligibility.check(30.0).eligible
    write(ac / "online", 1)
    write(tmp_path / "sys/class/power_supply/BAT0/status", "Charging")
    decision = eligibility.check(60.0)
    assert (decision.eligible, decision.reason) == (True, "charging 90% (Mains), foreground CPU 1% <= 20% for 60 s")


def test_every_monitor_is_a_monitor(tmp_path: Path) -> None:
    monitors = [
        PowerMonitor(tmp_path, run=all_clear()), IdleMonitor(sample=CpuSamples([])), ThermalMonitor(), QuietHours()
    ]
    for monitor in monitors:
        assert isinstance(monitor, Monitor), type(monitor).__name__
    assert len({m.name for m in monitors}) == len(monitors)


def test_public_surface_is_pinned() -> None:
    assert set(agent.monitors.__all__) == {
        "Decision", "Eligibility", "ForegroundCpu", "IdleMonitor", "Monitor", "PowerMonitor", "PowerSupply",
        "QuietHours", "StorageMonitor", "Temperature", "ThermalMonitor", "Verdict", "parse_window",
        "read_power_supplies", "read_thermal_zones",
    }
    assert all(hasattr(agent.monitors, name) for name in agent.monitors.__all__)


def test_importing_the_monitors_does_not_import_torch() -> None:
    code = "import sys, agent.monitors; print(sorted(m for m in ('torch', 'flwr') if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]"


def test_storage_low_on_any_watched_disk_holds_training_back(tmp_path: Path) -> None:
    from agent.monitors import StorageMonitor

    state, swap = tmp_path / "state", tmp_path / "sd" / "swap"  # swap not made yet: its parent is measured
    state.mkdir()
    (tmp_path / "sd").mkdir()
    free = {state: 900_000_000, tmp_path / "sd": 150_000_000}  # a fake statvfs: the disks' free bytes
    monitor = StorageMonitor([state, swap], 200_000_000, free_bytes=lambda path: free[path])
    verdict = monitor.check(0.0)
    assert not verdict.eligible and "storage low: 150 MB free on" in verdict.reason and str(swap) in verdict.reason
    assert verdict.readings["storage_free_bytes"] == 150_000_000
    free[tmp_path / "sd"] = 250_000_000
    assert monitor.check(1.0).eligible


def test_storage_is_measured_on_the_real_disk(tmp_path: Path) -> None:
    import shutil

    from agent.monitors import StorageMonitor

    free = shutil.disk_usage(tmp_path).free
    assert StorageMonitor([tmp_path], free // 2).check(0.0).eligible
    assert not StorageMonitor([tmp_path], free * 2).check(0.0).eligible
