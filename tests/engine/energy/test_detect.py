"""Auto-detection order, reasons for what was passed over, explicit configs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.energy.detect import MeterConfig, detect_meter
from engine.energy.errors import EnergyMeterError, MeterUnavailableError
from engine.energy.estimate import NominalPowers
from tests.engine.energy.fakes import UM25C_FRAME, PtyMeter, make_jetpack5_chip, make_rapl_zone, run_unprivileged

POWERS = NominalPowers(idle_w=2.7, compute_w=3.7, memory_w=0.5)


@pytest.fixture
def um25c() -> Iterator[PtyMeter]:
    meter = PtyMeter(UM25C_FRAME)
    yield meter
    meter.close()


def _jetson_with_rapl(root: Path) -> None:
    make_jetpack5_chip(root, "1-0040", {1: ("VDD_IN", 5000, 1000)})
    make_rapl_zone(root, "intel-rapl:0", "package-0")  # impossible on a Jetson, but it shows the order


def test_ina3221_comes_first(tmp_path: Path) -> None:
    _jetson_with_rapl(tmp_path)
    detection = detect_meter(sysfs_root=tmp_path, powers=POWERS)
    assert (detection.meter.name, detection.skipped) == ("ina3221", ())


def test_rapl_when_there_is_no_ina3221(tmp_path: Path, um25c: PtyMeter) -> None:
    make_rapl_zone(tmp_path, "intel-rapl:0", "package-0")
    config = MeterConfig(serial_url=um25c.path)  # configured, but RAPL ranks higher
    detection = detect_meter(config, sysfs_root=tmp_path, powers=POWERS)
    assert detection.meter.name == "rapl"
    assert [reason.split(":")[0] for reason in detection.skipped] == ["ina3221"]
    assert um25c.requests == b""  # the serial meter was not even asked


def test_a_configured_serial_meter_before_the_estimate(tmp_path: Path, um25c: PtyMeter) -> None:
    detection = detect_meter(MeterConfig(serial_url=um25c.path, serial_timeout_s=2.0), sysfs_root=tmp_path)
    with detection.meter as meter:
        assert (meter.name, meter.source) == ("um25c", f"UM25C on {um25c.path}")
    assert [reason.split(":")[0] for reason in detection.skipped] == ["ina3221", "rapl"]


def test_the_estimate_last_with_every_reason(tmp_path: Path) -> None:
    detection = detect_meter(sysfs_root=tmp_path, powers=POWERS)
    assert detection.meter.is_estimate
    kinds = [reason.split(":")[0] for reason in detection.skipped]
    assert kinds == ["ina3221", "rapl", "serial"]
    assert "no serial meter configured" in detection.skipped[2]
    assert "estimate from device profile (estimate)" in detection.describe()
    assert "  not used: rapl: no " in detection.describe()


def test_a_serial_meter_that_does_not_answer_falls_through(tmp_path: Path) -> None:
    config = MeterConfig(serial_url="loop://", serial_protocol="csv", serial_timeout_s=0.05)
    detection = detect_meter(config, sysfs_root=tmp_path, powers=POWERS)
    assert detection.meter.name == "estimate"
    assert "no 'volts,amps' line" in detection.skipped[-1]


def _fds_open_on(path: str) -> int:
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == path)


def test_a_silent_serial_meter_is_passed_over_and_its_port_closed(tmp_path: Path) -> None:
    silent = PtyMeter(frame=None)
    try:
        config = MeterConfig(serial_url=silent.path, serial_timeout_s=0.05)
        detection = detect_meter(config, sysfs_root=tmp_path, powers=POWERS)
        assert detection.meter.name == "estimate"
        assert "got 0 of 130 bytes" in detection.skipped[-1]
        assert silent.requests == b"\xf0"
        assert _fds_open_on(silent.path) == 1  # only the fake meter's own end is still open
    finally:
        silent.close()


def test_unreadable_rapl_is_passed_over_with_the_fix(public_tmp: Path) -> None:
    package = make_rapl_zone(public_tmp, "intel-rapl:0", "package-0")
    os.chmod(package / "energy_uj", 0o400)

    def detect_as_ordinary_user() -> str:
        detection = detect_meter(sysfs_root=public_tmp, powers=POWERS)
        return f"{detection.meter.name}|{detection.skipped[1]}"

    chosen, reason = run_unprivileged(detect_as_ordinary_user).split("|", 1)
    assert chosen == "estimate"
    assert reason.startswith("rapl: cannot read") and "chmod 0444" in reason


def test_nothing_at_all_is_an_error_listing_every_reason(tmp_path: Path) -> None:
    with pytest.raises(MeterUnavailableError) as caught:
        detect_meter(sysfs_root=tmp_path)
    for kind in ("ina3221:", "rapl:", "serial:", "estimate: no nominal powers"):
        assert kind in str(caught.value)


def test_an_explicit_meter_is_used_even_when_a_better_one_exists(tmp_path: Path) -> None:
    _jetson_with_rapl(tmp_path)
    assert detect_meter(MeterConfig(kind="rapl"), sysfs_root=tmp_path).meter.name == "rapl"
    assert detect_meter(MeterConfig(kind="estimate"), sysfs_root=tmp_path, powers=POWERS).meter.is_estimate


def test_an_explicit_meter_that_is_missing_is_an_error_not_a_fallback(tmp_path: Path) -> None:
    with pytest.raises(MeterUnavailableError, match="energy.kind = 'ina3221' is configured, but no INA3221"):
        detect_meter(MeterConfig(kind="ina3221"), sysfs_root=tmp_path, powers=POWERS)


def test_every_config_problem_is_reported_at_once(tmp_path: Path) -> None:
    config = MeterConfig(kind="serial", serial_protocol="UM99", interval_s=0.0)
    assert len(config.problems()) == 3
    with pytest.raises(EnergyMeterError) as caught:
        detect_meter(config, sysfs_root=tmp_path)
    for fragment in ("needs energy.serial_url", "UM99", "interval_s"):
        assert fragment in str(caught.value)
