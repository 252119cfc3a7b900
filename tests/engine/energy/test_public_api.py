"""The package's public surface, pinned; every meter satisfies the one interface."""

from __future__ import annotations

from pathlib import Path

import engine.energy
from engine.energy import EnergyMeter, EstimatedMeter, NominalPowers, RaplMeter, SampledMeter
from engine.errors import EngineError
from tests.engine.energy.fakes import make_rapl_zone

EXPECTED = {
    "Activity", "Detection", "EnergyMeter", "EnergyMeterError", "EstimatedMeter", "Ina3221Source", "LineSource",
    "Measurement", "MeterConfig", "MeterPermissionError", "MeterReadError", "MeterUnavailableError",
    "NominalPowers", "PowerSource", "RaplMeter", "SampledMeter", "StepEnergy", "StepEnergyAccount", "UMSource",
    "decode_um_frame", "detect_meter", "open_ina3221", "open_serial_meter",
}


def test_all_is_pinned_and_importable() -> None:
    assert set(engine.energy.__all__) == EXPECTED
    assert all(hasattr(engine.energy, name) for name in EXPECTED)


def test_errors_belong_to_the_agent_tree() -> None:
    assert issubclass(engine.energy.MeterPermissionError, engine.energy.EnergyMeterError)
    assert issubclass(engine.energy.EnergyMeterError, EngineError)


class _ConstantSupply:
    description = "constant"

    def read_watts(self) -> float:
        return 1.0

    def close(self) -> None:
        pass


def test_every_meter_is_an_energy_meter(tmp_path: Path) -> None:
    make_rapl_zone(tmp_path, "intel-rapl:0", "package-0")
    meters = [
        RaplMeter(tmp_path),
        SampledMeter(_ConstantSupply(), name="constant", interval_s=None),
        EstimatedMeter(NominalPowers(1.0, 1.0, 1.0)),
    ]
    for meter in meters:
        assert isinstance(meter, EnergyMeter), type(meter).__name__
