"""RAPL through a fake powercap tree: package zones only, wraps, the root-only permission."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.energy.errors import MeterPermissionError, MeterUnavailableError
from engine.energy.rapl import RaplMeter, counter_delta, find_rapl_domains
from tests.engine.energy.fakes import FakeClock, make_rapl_zone, run_unprivileged, write

MAX_UJ = 262_143_328_850


def _typical_laptop(root: Path) -> Path:
    """package-0 with its subzones, plus psys and the MMIO duplicate that must not be counted."""
    package = make_rapl_zone(root, "intel-rapl:0", "package-0", energy_uj=10_000_000)
    make_rapl_zone(root, "intel-rapl:0:0", "core", energy_uj=7_000_000)
    make_rapl_zone(root, "intel-rapl:0:1", "uncore", energy_uj=1_000_000)
    make_rapl_zone(root, "intel-rapl:0:2", "dram", energy_uj=2_000_000)
    make_rapl_zone(root, "intel-rapl:1", "psys", energy_uj=30_000_000)
    make_rapl_zone(root, "intel-rapl-mmio:0", "package-0", energy_uj=10_000_000)
    return package


def test_only_package_zones_are_read(tmp_path: Path) -> None:
    _typical_laptop(tmp_path)
    domains = find_rapl_domains(tmp_path)
    assert [(d.name, d.energy_path.parent.name) for d in domains] == [("package-0", "intel-rapl:0")]
    assert RaplMeter(tmp_path).source == f"RAPL package-0 via {tmp_path}/class/powercap"


def test_energy_is_the_package_counter_delta_in_joules(tmp_path: Path) -> None:
    package = _typical_laptop(tmp_path)
    meter = RaplMeter(tmp_path)
    meter.start()
    write(package / "energy_uj", 12_500_000)
    # subzones and psys move too; counting them would inflate the figure
    write(tmp_path / "class/powercap/intel-rapl:1/energy_uj", 90_000_000)
    write(tmp_path / "class/powercap/intel-rapl:0:0/energy_uj", 9_000_000)
    assert meter.read_joules() == pytest.approx(2.5)
    write(package / "energy_uj", 13_000_000)
    assert meter.read_joules() == pytest.approx(3.0)


def test_packages_are_summed_in_zone_order(tmp_path: Path) -> None:
    first = make_rapl_zone(tmp_path, "intel-rapl:0", "package-0", energy_uj=0)
    second = make_rapl_zone(tmp_path, "intel-rapl:1", "package-1", energy_uj=0)
    meter = RaplMeter(tmp_path)
    meter.start()
    write(first / "energy_uj", 1_000_000)
    write(second / "energy_uj", 4_000_000)
    assert meter.read_joules() == pytest.approx(5.0)
    assert "package-0+package-1" in meter.source


def test_amd_rapl_zone_names_are_found(tmp_path: Path) -> None:
    make_rapl_zone(tmp_path, "amd-rapl:0", "package-0")
    make_rapl_zone(tmp_path, "amd-rapl:0:0", "core")
    assert [d.energy_path.parent.name for d in find_rapl_domains(tmp_path)] == ["amd-rapl:0"]


def test_a_wrap_between_two_reads_adds_the_range(tmp_path: Path) -> None:
    package = make_rapl_zone(tmp_path, "intel-rapl:0", "package-0", energy_uj=MAX_UJ - 1_000_000, max_uj=MAX_UJ)
    meter = RaplMeter(tmp_path)
    meter.start()
    write(package / "energy_uj", 500_000)  # 1 J to the top, the step back to 0, then 0.5 J
    assert meter.read_joules() == pytest.approx(1.500001, abs=1e-9)
    write(package / "energy_uj", 2_500_000)  # and counting goes on normally after the wrap
    assert meter.read_joules() == pytest.approx(3.500001, abs=1e-9)


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [(10, 25, 15), (0, 0, 0), (95, 5, 4 + 1 + 5), (99, 0, 1)],  # 95..99, 99->0, 0..5
)
def test_counter_delta_counts_the_step_from_max_to_zero(before: int, after: int, expected: int) -> None:
    assert counter_delta(before, after, 99) == expected


def test_measure_reports_joules_and_seconds_of_the_block(tmp_path: Path, clock: FakeClock) -> None:
    package = make_rapl_zone(tmp_path, "intel-rapl:0", "package-0", energy_uj=1_000_000)
    meter = RaplMeter(tmp_path, clock=clock)
    with meter.measure() as m:
        write(package / "energy_uj", 31_000_000)
        clock.advance(2.0)
    assert (m.done, m.joules, m.seconds, m.watts, m.is_estimate) == (True, pytest.approx(30.0), 2.0, 15.0, False)


def test_a_root_only_counter_names_the_fix(public_tmp: Path) -> None:
    package = make_rapl_zone(public_tmp, "intel-rapl:0", "package-0", energy_uj=5)
    (package / "energy_uj").chmod(0o400)  # what Linux >= 5.10 does: readable by root only

    def read_as_ordinary_user() -> str:
        RaplMeter(public_tmp).read_joules()
        return "read without error"

    answer = run_unprivileged(read_as_ordinary_user)
    assert answer.startswith(f"{MeterPermissionError.__name__}: cannot read {package}/energy_uj")
    for fix in ("CVE-2020-8694", "run as root", "chmod 0444", "udev", 'SUBSYSTEM=="powercap"'):
        assert fix in answer


def test_no_powercap_or_no_package_zone_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(MeterUnavailableError, match="no .*powercap"):
        RaplMeter(tmp_path)
    make_rapl_zone(tmp_path, "intel-rapl:1", "psys")
    with pytest.raises(MeterUnavailableError, match="no RAPL package zone"):
        RaplMeter(tmp_path)
