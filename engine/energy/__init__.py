"""Energy meters: one interface over RAPL, Jetson INA3221, serial USB meters and an estimate.

Typical use (the executor, ``poet-edge profile``)::

    from engine.energy import Activity, StepEnergyAccount, detect_meter

    detection = detect_meter(config, powers=nominal_powers)
    print(detection.describe())             # which source, and why not the others
    with detection.meter as meter:
        with StepEnergyAccount(meter) as account:
            with account.track(Activity.COMPUTE):
                ...
        account.result.to_dict()

Modules: :mod:`~engine.energy.meter` (the interface), :mod:`~engine.energy.sampling`
(power to energy), :mod:`~engine.energy.rapl`, :mod:`~engine.energy.ina3221`,
:mod:`~engine.energy.serial_meter`, :mod:`~engine.energy.estimate`,
:mod:`~engine.energy.account` (per node class), :mod:`~engine.energy.detect`,
:mod:`~engine.energy.errors`.
"""

from __future__ import annotations

from engine.energy.account import StepEnergy, StepEnergyAccount
from engine.energy.detect import Detection, MeterConfig, detect_meter
from engine.energy.errors import EnergyMeterError, MeterPermissionError, MeterReadError, MeterUnavailableError
from engine.energy.estimate import EstimatedMeter, NominalPowers
from engine.energy.ina3221 import Ina3221Source, open_ina3221
from engine.energy.meter import Activity, EnergyMeter, Measurement
from engine.energy.rapl import RaplMeter
from engine.energy.sampling import PowerSource, SampledMeter
from engine.energy.serial_meter import LineSource, UMSource, decode_um_frame, open_serial_meter

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
