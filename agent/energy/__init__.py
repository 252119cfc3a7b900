"""Energy meters: one interface over RAPL, Jetson INA3221, serial USB meters and an estimate.

Typical use (the executor, ``poet-edge profile``)::

    from agent.energy import Activity, StepEnergyAccount, detect_meter

    detection = detect_meter(config, powers=nominal_powers)
    print(detection.describe())             # which source, and why not the others
    with detection.meter as meter:
        with StepEnergyAccount(meter) as account:
            with account.track(Activity.COMPUTE):
                ...
        account.result.to_dict()

Modules: :mod:`~agent.energy.meter` (the interface), :mod:`~agent.energy.sampling`
(power to energy), :mod:`~agent.energy.rapl`, :mod:`~agent.energy.ina3221`,
:mod:`~agent.energy.serial_meter`, :mod:`~agent.energy.estimate`,
:mod:`~agent.energy.account` (per node class), :mod:`~agent.energy.detect`,
:mod:`~agent.energy.errors`.
"""

from __future__ import annotations

from agent.energy.account import StepEnergy, StepEnergyAccount
from agent.energy.detect import Detection, MeterConfig, detect_meter
from agent.energy.errors import EnergyMeterError, MeterPermissionError, MeterReadError, MeterUnavailableError
from agent.energy.estimate import EstimatedMeter, NominalPowers
from agent.energy.ina3221 import Ina3221Source, open_ina3221
from agent.energy.meter import Activity, EnergyMeter, Measurement
from agent.energy.rapl import RaplMeter
from agent.energy.sampling import PowerSource, SampledMeter
from agent.energy.serial_meter import LineSource, UMSource, decode_um_frame, open_serial_meter

__all__ = [
    "Activity",
    "Detection",
    "EnergyMeter",
    "EnergyMeterError",
    "EstimatedMeter",
    "Ina3221Source",
    "LineSource",
    "Measurement",
    "MeterConfig",
    "MeterPermissionError",
    "MeterReadError",
    "MeterUnavailableError",
    "NominalPowers",
    "PowerSource",
    "RaplMeter",
    "SampledMeter",
    "StepEnergy",
    "StepEnergyAccount",
    "UMSource",
    "decode_um_frame",
    "detect_meter",
    "open_ina3221",
    "open_serial_meter",
]
