"""Pick the best energy meter this machine has, and say why the others were not used.

Order (the first that opens and answers one read wins):

1. an explicit ``MeterConfig.kind`` other than ``"auto"``: used as told, and
   an error if it cannot be (an operator who names a meter wants to hear
   that it is missing, not get a silent estimate);
2. INA3221 (Jetson): it measures the whole board at its input rail;
3. RAPL (x86): CPU package only, but a real measurement;
4. a serial meter, when ``serial_url`` is configured (UM24C/UM25C/UM34C or
   ``volts,amps`` lines): the whole board where it is plugged in; in
   practice it is the only sensor on a Raspberry Pi, which has neither of
   the above;
5. the estimate from the device profile's nominal powers, when given.

The reasons the earlier candidates were passed over come back with the
meter, for ``poet-edge profile`` to print beside each figure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.energy.errors import EnergyMeterError, MeterUnavailableError
from engine.energy.estimate import EstimatedMeter, NominalPowers
from engine.energy.ina3221 import open_ina3221
from engine.energy.meter import DEFAULT_CLOCK, Clock, EnergyMeter
from engine.energy.rapl import RaplMeter
from engine.energy.sampling import DEFAULT_INTERVAL_S, SampledMeter
from engine.energy.serial_meter import DEFAULT_BAUDRATE, DEFAULT_TIMEOUT_S, UM_MODELS, open_serial_meter

METER_KINDS = ("auto", "ina3221", "rapl", "serial", "estimate")
SERIAL_PROTOCOLS = (*UM_MODELS, "csv")


@dataclass(frozen=True)
class MeterConfig:
    """The ``[energy]`` part of the agent's config.

    Attributes
    ----------
    kind:
        ``"auto"`` or one of ``"ina3221"``, ``"rapl"``, ``"serial"``, ``"estimate"``.
    serial_url:
        Port of a serial meter (``/dev/rfcomm0``); ``None`` when there is none.
    serial_protocol:
        ``"UM24C"``, ``"UM25C"``, ``"UM34C"`` or ``"csv"``.
    serial_baudrate, serial_timeout_s:
        Port settings.
    interval_s:
        Sampling interval of power meters; ``None`` picks each meter's default.
    """

    kind: str = "auto"
    serial_url: str | None = None
    serial_protocol: str = "UM25C"
    serial_baudrate: int = DEFAULT_BAUDRATE
    serial_timeout_s: float = DEFAULT_TIMEOUT_S
    interval_s: float | None = None

    def problems(self) -> list[str]:
        """Every problem with this config at once (empty when it is usable)."""
        found = []
        if self.kind not in METER_KINDS:
            found.append(f"energy.kind = {self.kind!r} is not one of {', '.join(METER_KINDS)}")
        if self.kind == "serial" and not self.serial_url:
            found.append("energy.kind = 'serial' needs energy.serial_url (e.g. /dev/rfcomm0)")
        if self.serial_protocol.upper() not in {p.upper() for p in SERIAL_PROTOCOLS}:
            known = ", ".join(SERIAL_PROTOCOLS)
            found.append(f"energy.serial_protocol = {self.serial_protocol!r} is not one of {known}")
        if self.serial_baudrate <= 0:
            found.append(f"energy.serial_baudrate must be positive, not {self.serial_baudrate}")
        if self.serial_timeout_s <= 0:
            found.append(f"energy.serial_timeout_s must be positive, not {self.serial_timeout_s}")
        if self.interval_s is not None and self.interval_s <= 0:
            found.append(f"energy.interval_s must be positive, not {self.interval_s}")
        return found


@dataclass(frozen=True)
class Detection:
    """The meter chosen and why the candidates before it were not.

    Attributes
    ----------
    meter:
        Opened and read once, not started: the caller starts and closes it.
    skipped:
        One line per candidate passed over, ``"<kind>: <reason>"``.
    """

    meter: EnergyMeter
    skipped: tuple[str, ...] = ()

    def describe(self) -> str:
        """One paragraph for a report: the source, then the reasons."""
        label = "estimate" if self.meter.is_estimate else "measured"
        lines = [f"energy: {self.meter.source} ({label})"]
        lines += [f"  not used: {reason}" for reason in self.skipped]
        return "\n".join(lines)


def detect_meter(
    config: MeterConfig | None = None,
    *,
    powers: NominalPowers | None = None,
    sysfs_root: str | Path = "/sys",
    clock: Clock = DEFAULT_CLOCK,
) -> Detection:
    """Open the best meter available; see the module docstring for the order.

    Parameters
    ----------
    config:
        What the operator configured; ``None`` means all defaults (auto).
    powers:
        Nominal powers for the estimate (from the device profile); without
        them there is no fallback.
    sysfs_root:
        Where sysfs is mounted; tests pass a fake tree.
    clock:
        Given to the meter.

    Raises
    ------
    EnergyMeterError
        The config is invalid, the configured meter cannot be used, or (auto)
        nothing works; the message carries every reason.
    """
    config = config or MeterConfig()
    problems = config.problems()
    if problems:
        raise EnergyMeterError("invalid energy meter config: " + "; ".join(problems))
    openers = _openers(config, powers, Path(sysfs_root), clock)
    if config.kind != "auto":
        return Detection(_open_explicit(config.kind, openers[config.kind]))
    skipped: list[str] = []
    for kind in ("ina3221", "rapl", "serial", "estimate"):
        try:
            return Detection(_open_and_probe(openers[kind]), tuple(skipped))
        except EnergyMeterError as exc:
            skipped.append(f"{kind}: {exc}")
    raise MeterUnavailableError("no energy meter available: " + "; ".join(skipped))


Opener = Callable[[], EnergyMeter]


def _openers(config: MeterConfig, powers: NominalPowers | None, root: Path, clock: Clock) -> dict[str, Opener]:
    interval = config.interval_s or DEFAULT_INTERVAL_S

    def serial() -> EnergyMeter:
        if not config.serial_url:
            raise MeterUnavailableError("no serial meter configured (set energy.serial_url)")
        return open_serial_meter(
            config.serial_url,
            protocol=config.serial_protocol,
            baudrate=config.serial_baudrate,
            timeout_s=config.serial_timeout_s,
            interval_s=config.interval_s,
            clock=clock,
        )

    def estimate() -> EnergyMeter:
        if powers is None:
            raise MeterUnavailableError("no nominal powers given for an estimate (pass the device profile's)")
        return EstimatedMeter(powers, clock=clock)

    return {
        "ina3221": lambda: open_ina3221(root, interval_s=interval, clock=clock),
        "rapl": lambda: RaplMeter(root, clock=clock),
        "serial": serial,
        "estimate": estimate,
    }


def _open_and_probe(opener: Opener) -> EnergyMeter:
    """Open a meter and read it once, so that a meter that is there but unreadable is passed over."""
    meter = opener()
    try:
        if isinstance(meter, SampledMeter):
            meter.sample_now()
        elif isinstance(meter, RaplMeter):
            for domain in meter.domains:
                domain.read_uj()
    except EnergyMeterError:
        meter.close()  # release a serial port before trying the next candidate
        raise
    return meter


def _open_explicit(kind: str, opener: Opener) -> EnergyMeter:
    try:
        return _open_and_probe(opener)
    except EnergyMeterError as exc:
        raise type(exc)(f"energy.kind = {kind!r} is configured, but {exc}") from exc
