"""Intel/AMD RAPL package energy through the powercap sysfs interface.

Each top-level zone ``<sysfs_root>/class/powercap/intel-rapl:N`` (or
``amd-rapl:N``) whose ``name`` starts with ``package`` is one CPU package; its
``energy_uj`` is a cumulative counter in microjoules that wraps to 0 after
``max_energy_range_uj``.  Only package zones are read: subzones
(``intel-rapl:0:0`` core, ``:1`` uncore, ``:2`` dram), ``psys`` (the whole
platform, which contains the packages) and the ``intel-rapl-mmio`` duplicate
of package 0 would count the same joules twice.

Since Linux 5.10 ``energy_uj`` is readable by root only (CVE-2020-8694,
the "Platypus" power side channel); the
:class:`~engine.energy.errors.MeterPermissionError` raised then names the fix.
"""

from __future__ import annotations

import re
import threading
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from engine.energy.errors import MeterPermissionError, MeterReadError, MeterUnavailableError
from engine.energy.meter import DEFAULT_CLOCK, Activity, Clock, Measurement, measure_counter

# Top-level zones only: one index after the colon.  Excludes subzones and intel-rapl-mmio.
_ZONE = re.compile(r"^(intel|amd)-rapl:(\d+)$")

PERMISSION_FIX = (
    "energy_uj has been readable by root only since Linux 5.10 (CVE-2020-8694). Either run as root, "
    "or make the counters world-readable until the next boot with "
    "`sudo chmod 0444 /sys/class/powercap/intel-rapl:*/energy_uj`, or for good with a udev rule in "
    "/etc/udev/rules.d/70-rapl.rules: "
    'ACTION=="add", SUBSYSTEM=="powercap", KERNEL=="intel-rapl:*", RUN+="/bin/chmod 0444 /sys%p/energy_uj"'
)


@dataclass(frozen=True)
class RaplDomain:
    """One package zone.

    Attributes
    ----------
    name:
        The zone's ``name`` file (``package-0``).
    energy_path:
        Its ``energy_uj`` counter.
    max_energy_uj:
        Its ``max_energy_range_uj``: the largest value before the counter wraps to 0.
    """

    name: str
    energy_path: Path
    max_energy_uj: int

    def read_uj(self) -> int:
        """The counter now, µJ; converts OS errors to meter errors."""
        try:
            return int(self.energy_path.read_text().strip())
        except PermissionError as exc:
            raise MeterPermissionError(f"cannot read {self.energy_path}: {PERMISSION_FIX}") from exc
        except (OSError, ValueError) as exc:
            raise MeterReadError(f"cannot read RAPL counter {self.energy_path}: {exc}") from exc


def find_rapl_domains(sysfs_root: str | Path = "/sys") -> list[RaplDomain]:
    """The package zones under ``<sysfs_root>/class/powercap``, in zone order.

    Raises
    ------
    MeterUnavailableError
        When there is no powercap directory or no package zone in it.
    """
    powercap = Path(sysfs_root) / "class" / "powercap"
    if not powercap.is_dir():
        raise MeterUnavailableError(f"no {powercap} (no RAPL: not an x86 CPU, or the intel_rapl driver is not loaded)")
    domains = []
    for zone in sorted(powercap.iterdir(), key=_zone_order):
        name = _read_optional(zone / "name")
        if _ZONE.match(zone.name) and name is not None and name.startswith("package"):
            domains.append(RaplDomain(name, zone / "energy_uj", _read_max(zone)))
    if not domains:
        raise MeterUnavailableError(f"no RAPL package zone under {powercap}")
    return domains


def _zone_order(zone: Path) -> tuple[str, int]:
    match = _ZONE.match(zone.name)
    return (match.group(1), int(match.group(2))) if match else (zone.name, -1)


def _read_optional(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_max(zone: Path) -> int:
    text = _read_optional(zone / "max_energy_range_uj")
    try:
        return int(text)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise MeterReadError(f"cannot read {zone / 'max_energy_range_uj'}: {text!r}") from exc


def counter_delta(before_uj: int, after_uj: int, max_energy_uj: int) -> int:
    """Energy between two readings of one counter, µJ, across at most one wrap.

    The counter runs 0..max_energy_uj and then restarts at 0, so a reading
    smaller than the previous one means it wrapped once: the distance is
    ``after - before + max_energy_uj + 1``.  More than one wrap between two
    reads cannot be seen; at 100 W a typical 262 kJ range lasts 43 minutes.
    """
    delta = after_uj - before_uj
    return delta + max_energy_uj + 1 if delta < 0 else delta


class RaplMeter:
    """Cumulative package energy from RAPL; an :class:`~engine.energy.meter.EnergyMeter`.

    Parameters
    ----------
    sysfs_root:
        Where sysfs is mounted; tests pass a fake tree.
    clock:
        Monotonic clock for ``measure()``'s durations.
    """

    name = "rapl"
    is_estimate = False

    def __init__(self, sysfs_root: str | Path = "/sys", *, clock: Clock = DEFAULT_CLOCK) -> None:
        self.domains = find_rapl_domains(sysfs_root)
        names = "+".join(d.name for d in self.domains)
        self.source = f"RAPL {names} via {Path(sysfs_root) / 'class' / 'powercap'}"
        self._clock = clock
        self._lock = threading.Lock()
        self._last_uj: list[int] | None = None
        self._total_uj = 0

    def start(self) -> None:
        """Take the baseline readings; permission problems surface here."""
        with self._lock:
            if self._last_uj is None:
                self._last_uj = [d.read_uj() for d in self.domains]

    def read_joules(self) -> float:
        """Package energy since ``start()``, J, summed over packages."""
        self.start()
        with self._lock:
            now = [d.read_uj() for d in self.domains]
            assert self._last_uj is not None
            for domain, before, after in zip(self.domains, self._last_uj, now):
                self._total_uj += counter_delta(before, after, domain.max_energy_uj)
            self._last_uj = now
            return self._total_uj / 1e6

    def measure(self) -> AbstractContextManager[Measurement]:
        """Measure the wrapped block; yields a :class:`Measurement` filled in on exit."""
        return measure_counter(self.read_joules, self._clock, source=self.source, is_estimate=False)

    def set_activity(self, activity: Activity) -> None:
        """Ignored: the counter measures whatever the CPU does."""

    def close(self) -> None:
        """Nothing to release: each read opens and closes the file."""

    def __enter__(self) -> RaplMeter:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
