"""Jetson INA3221 through fake sysfs trees in both layouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.energy.errors import MeterReadError, MeterUnavailableError
from engine.energy.ina3221 import Ina3221Source, find_rails, open_ina3221
from tests.engine.energy.fakes import FakeClock, make_jetpack4_chip, make_jetpack5_chip, write

ORIN_NANO = {1: ("VDD_IN", 5080, 1520), 2: ("VDD_CPU_GPU_CV", 5072, 410), 3: ("VDD_SOC", 5072, 380)}


def test_jetpack5_prefers_the_input_rail(tmp_path: Path) -> None:
    make_jetpack5_chip(tmp_path, "1-0040", ORIN_NANO)
    source = Ina3221Source(find_rails(tmp_path))
    assert source.description == "INA3221 VDD_IN"
    assert source.read_watts() == pytest.approx(5.080 * 1.520)


def test_jetpack5_sums_rails_and_skips_nc_and_the_sum_channel(tmp_path: Path) -> None:
    # Two chips, no input rail (AGX Xavier style); an unconnected channel still reads a little.
    make_jetpack5_chip(tmp_path, "1-0040", {1: ("GPU", 19000, 100), 2: ("CPU", 19000, 200), 3: ("NC", 24, 8)})
    make_jetpack5_chip(tmp_path, "1-0041", {1: ("SOC", 19000, 300)})
    rails = find_rails(tmp_path)
    assert [rail.label for rail in rails] == ["GPU", "CPU", "SOC"]
    source = Ina3221Source(rails)
    assert source.description == "INA3221 sum of GPU+CPU+SOC"
    assert source.read_watts() == pytest.approx(19.0 * 0.6)


def test_jetpack4_nano_reads_pom_5v_in_in_milliwatts(tmp_path: Path) -> None:
    make_jetpack4_chip(tmp_path, "6-0040", {0: ("POM_5V_IN", 3250), 1: ("POM_5V_GPU", 410), 2: ("POM_5V_CPU", 1220)})
    source = Ina3221Source(find_rails(tmp_path))
    assert source.description == "INA3221 POM_5V_IN"
    assert source.read_watts() == pytest.approx(3.25)


def test_jetpack4_tx2_finds_vdd_in_on_the_second_chip(tmp_path: Path) -> None:
    make_jetpack4_chip(tmp_path, "0-0040", {0: ("VDD_SYS_GPU", 900), 1: ("VDD_SYS_SOC", 700), 2: ("VDD_4V0_WIFI", 50)})
    make_jetpack4_chip(tmp_path, "0-0041", {0: ("VDD_IN", 4100), 1: ("VDD_SYS_CPU", 600), 2: ("VDD_SYS_DDR", 400)})
    source = Ina3221Source(find_rails(tmp_path))
    assert (source.description, source.read_watts()) == ("INA3221 VDD_IN", pytest.approx(4.1))


def test_jetpack4_without_a_total_sums_the_rails(tmp_path: Path) -> None:
    make_jetpack4_chip(tmp_path, "0-0040", {0: ("VDD_SYS_GPU", 900), 1: ("NC", 15), 2: ("VDD_SYS_SOC", 700)})
    assert Ina3221Source(find_rails(tmp_path)).read_watts() == pytest.approx(1.6)


def test_a_board_without_ina3221_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "bus" / "i2c" / "drivers" / "rtc-ds1307").mkdir(parents=True)
    with pytest.raises(MeterUnavailableError, match="Nano 2GB"):
        find_rails(tmp_path)


def test_a_vanished_value_file_is_a_read_error(tmp_path: Path) -> None:
    hwmon = make_jetpack5_chip(tmp_path, "1-0040", ORIN_NANO)
    source = Ina3221Source(find_rails(tmp_path))
    (hwmon / "curr1_input").unlink()  # the driver was unbound under us
    with pytest.raises(MeterReadError, match="curr1_input"):
        source.read_watts()


def test_sampled_board_energy_follows_the_rail(tmp_path: Path, clock: FakeClock) -> None:
    hwmon = make_jetpack5_chip(tmp_path, "1-0040", ORIN_NANO)
    write(hwmon / "curr1_input", 1000)  # 5.08 W
    meter = open_ina3221(tmp_path, interval_s=None, clock=clock)
    with meter, meter.measure() as m:
        clock.advance(1.0)
        meter.sample_now()
        write(hwmon / "curr1_input", 2000)  # 10.16 W from here on
        clock.advance(2.0)
    # 1 s at 5.08 W, then the trapezoid over the change, 2 s from 5.08 to 10.16 W
    assert m.joules == pytest.approx(5.08 + 2.0 * (5.08 + 10.16) / 2)
    assert (m.seconds, meter.name, meter.source) == (3.0, "ina3221", "INA3221 VDD_IN")
