"""DeviceProfile: what computing and paging cost on one device, in SI units.

A profile holds the figures POET's cost model needs -- the power drawn while
computing and while paging, the swap path's bandwidth and latency in each
direction, idle power, RAM, compute speed -- plus where the figures came from.
:func:`price_graph` turns a graph's times and bytes into the energies the MILP
minimises::

    compute_j = compute_ms / 1000 * compute_power_w
    pagein_j  = (pagein_latency_s  + bytes / pagein_bandwidth_bps)  * memory_power_w
    pageout_j = (pageout_latency_s + bytes / pageout_bandwidth_bps) * memory_power_w

Powers follow the POET reference's convention: ``compute_power_w`` and
``memory_power_w`` are what computing and paging draw *above idle*, so a
step's energy is what the schedule adds to a board that is on anyway;
``idle_power_w`` is kept separately for whole-board estimates
(``idle_power_w * step seconds`` plus the priced energies).

Built-in profiles (:meth:`DeviceProfile.builtin`): the POET paper's platforms
``mkr1000``, ``nrf52840``, ``rpi4`` and ``jetson-tx2`` with the reference
implementation's figures, and ``rpi5``, ``rpi5-nvme``, ``jetson-orin-nano``
from public specifications and measurements.  Every figure carries its source
in a comment; estimates say so.  A profile measured on the device
(``poet-edge profile``) beats any of them.

How the POET reference graphs (``../shared/bench/poet_graphs``) relate to these
profiles (``tests/schedules/test_device.py`` checks it): the reference prices a
layer of ``f`` FLOPs as ``cost_cpu_ms = f / FLOPS`` -- in *seconds*, despite the
name -- and ``compute_j = f / FLOPS_PER_WATT``, so ``compute_j / cost_cpu_ms =
FLOPS / FLOPS_PER_WATT`` is a power.  For the ``m4`` graph it is 0.0109824 W,
exactly ``nrf52840.compute_power_w``, and pricing that graph (times converted
to ms) with ``nrf52840`` reproduces all three energy columns.  For the ``a72``
graphs it is 49.86 W: the reference's RPi ``FLOPS`` is 2 GFLOPS while its
``FLOPS_PER_WATT`` was derived from a measured 120.34 MFLOPS at 3 W
(24.9 nJ/FLOP), so the graphs charge 2e9 / 120.34e6 = 16.6 times the 3 W that
``rpi4`` uses; their page-in and page-out energies equal ``rpi4``'s exactly.
Reading ``cost_cpu_ms`` literally as milliseconds would make every priced
compute energy another 1000 times smaller.  Reference graphs carry their own
energies, and :func:`price_graph` keeps them unless told to overwrite.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from schedules.canonical import load_validated
from schedules.errors import FormatError, PlannerError, UnknownNameError, UnsupportedVersionError
from schedules.graph import Node, TrainingGraph

DEVICE_FORMAT = "poet-edge/device-profile"
DEVICE_VERSION = 1
_KIB = 1024
_GIB = 1024**3


@dataclass(frozen=True, kw_only=True)
class DeviceProfile:
    """Cost figures of one device; see the module docstring for the conventions.

    Attributes
    ----------
    name, description:
        Short identifier (``rpi4``) and one line for people.
    compute_power_w:
        Power drawn above idle while computing, W.
    idle_power_w:
        Power of the board doing nothing, W.
    memory_power_w:
        Power drawn above idle while paging to or from flash/SD (the POET
        paper's memory power), W.
    pagein_bandwidth_bps, pageout_bandwidth_bps:
        Swap-path throughput, bytes per second (> 0).
    pagein_latency_s, pageout_latency_s:
        Fixed cost of one transfer, seconds.
    paging_overlaps_compute:
        True when transfers run beside computation (DMA, an I/O thread on
        another core); False when the CPU itself drives them.
    paging_hidden_fraction:
        Where paging overlaps compute, the share of its time measured hidden
        behind the training step (``poet-edge profile``); the rest slows the
        step and the planner counts it.  ``None``: all of it hidden.
    ram_bytes:
        Memory available on the device, bytes.
    flops_per_s:
        Effective compute speed, FLOP/s, to turn FLOP counts into time and to
        scale timings between devices; ``None`` when unknown.
    source:
        Where the figures came from (``builtin: ...``, ``measured on HOST at DATE``).
    version:
        Format version of the profile file.
    """

    name: str
    description: str = ""
    compute_power_w: float
    idle_power_w: float
    memory_power_w: float
    pagein_bandwidth_bps: float
    pageout_bandwidth_bps: float
    pagein_latency_s: float
    pageout_latency_s: float
    paging_overlaps_compute: bool
    ram_bytes: int
    flops_per_s: float | None = None
    paging_hidden_fraction: float | None = None
    source: str
    version: int = DEVICE_VERSION

    def __post_init__(self) -> None:
        if self.version != DEVICE_VERSION:
            raise UnsupportedVersionError(
                f"device profile version {self.version!r} is not supported (this release reads version "
                f"{DEVICE_VERSION}); re-create the profile with this release's `poet-edge profile`"
            )
        problems = _problems(self)
        if problems:
            raise FormatError(f"device profile {self.name!r} is invalid: " + "; ".join(problems))

    # -- costs -------------------------------------------------------------------
    def compute_energy_j(self, compute_ms: float) -> float:
        """Energy of ``compute_ms`` milliseconds of computation, J."""
        return compute_ms / 1000.0 * self.compute_power_w

    def pagein_seconds(self, nbytes: float) -> float:
        """Time to page ``nbytes`` in from flash/SD, s."""
        return self.pagein_latency_s + nbytes / self.pagein_bandwidth_bps

    def pageout_seconds(self, nbytes: float) -> float:
        """Time to page ``nbytes`` out to flash/SD, s."""
        return self.pageout_latency_s + nbytes / self.pageout_bandwidth_bps

    @property
    def exposed_paging_fraction(self) -> float:
        """Share of paging time a training step pays: 1 where the CPU drives the transfers, else the part
        not hidden behind compute (0 without a measurement)."""
        if not self.paging_overlaps_compute:
            return 1.0
        return 1.0 - (self.paging_hidden_fraction if self.paging_hidden_fraction is not None else 1.0)

    def compute_ms_for_flops(self, flops: float) -> float:
        """Milliseconds this device needs for ``flops`` floating-point operations.

        Raises
        ------
        PlannerError
            The profile has no ``flops_per_s``.
        """
        if self.flops_per_s is None:
            raise PlannerError(
                f"device profile {self.name!r} has no flops_per_s; set it (e.g. from a measured "
                "FLOP count and time) before converting FLOPs to time"
            )
        return flops / self.flops_per_s * 1000.0

    def with_ram(self, ram_bytes: int) -> "DeviceProfile":
        """A copy with ``ram_bytes`` replaced (e.g. the 8 GB model of a board)."""
        return replace(self, ram_bytes=ram_bytes)

    # -- built-ins ---------------------------------------------------------------
    @classmethod
    def builtin(cls, name: str) -> "DeviceProfile":
        """The built-in profile called ``name`` (case-insensitive).

        Raises
        ------
        UnknownNameError
            No built-in profile has that name; the message lists the valid ones.
        """
        profile = _BUILTINS.get(name.strip().lower()) if isinstance(name, str) else None
        if profile is None:
            raise UnknownNameError(
                f"unknown device profile {name!r}; built-in profiles: {', '.join(_BUILTINS)} "
                "(or load a profile file with DeviceProfile.load(path))"
            )
        return profile

    @staticmethod
    def builtin_names() -> tuple[str, ...]:
        """Names of the built-in profiles, POET paper's platforms first."""
        return tuple(_BUILTINS)

    # -- files -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON shape (format tag first, then every field)."""
        data: dict[str, Any] = {"format": DEVICE_FORMAT, "version": self.version}
        data.update({f.name: getattr(self, f.name) for f in fields(self) if f.name != "version"})
        return data

    @classmethod
    def from_dict(cls, data: Any) -> "DeviceProfile":
        """Build from the JSON shape; every problem is reported in one :class:`FormatError`."""
        if not isinstance(data, dict):
            raise FormatError("a device profile must be a JSON object")
        if data.get("format") != DEVICE_FORMAT:
            raise FormatError(f"not a device profile: expected format {DEVICE_FORMAT!r}, found {data.get('format')!r}")
        if data.get("version") != DEVICE_VERSION:
            raise UnsupportedVersionError(
                f"device profile version {data.get('version')!r} is not supported (this release reads version "
                f"{DEVICE_VERSION}); re-create the profile with this release's `poet-edge profile`"
            )
        values = {k: v for k, v in data.items() if k not in ("format", "version")}
        _check_keys(values)
        if isinstance(values.get("ram_bytes"), float) and values["ram_bytes"].is_integer():
            values["ram_bytes"] = int(values["ram_bytes"])  # 4e9 written by hand is still a byte count
        return cls(**values)

    @classmethod
    def load(cls, path: str | Path) -> "DeviceProfile":
        """Load a profile file written by :meth:`save` or by hand."""
        return load_validated(path, "device profile", cls.from_dict)

    def save(self, path: str | Path) -> None:
        """Write the profile as indented JSON.

        Not canonical one-line JSON like graphs and schedules: profiles are
        small, nothing signs or hashes them, and people edit them by hand.
        """
        text = json.dumps(self.to_dict(), indent=2, allow_nan=False, ensure_ascii=False)
        Path(path).write_text(text + "\n", encoding="utf-8")


# -- validation ----------------------------------------------------------------
_POWERS = ("compute_power_w", "idle_power_w", "memory_power_w")
_BANDWIDTHS = ("pagein_bandwidth_bps", "pageout_bandwidth_bps")
_LATENCIES = ("pagein_latency_s", "pageout_latency_s")
_FIELDS = tuple(f.name for f in fields(DeviceProfile) if f.name != "version")
_REQUIRED = tuple(
    f.name for f in fields(DeviceProfile)
    if f.name not in ("description", "flops_per_s", "paging_hidden_fraction", "version")
)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _problems(p: DeviceProfile) -> list[str]:
    """Every reason ``p`` is not a usable profile, so one error can list them all."""
    problems = [f"{k} must be text, got {getattr(p, k)!r}" for k in ("name", "description", "source")
                if not isinstance(getattr(p, k), str)]
    if isinstance(p.name, str) and not p.name.strip():
        problems.append("name must not be empty")
    problems += [f"{k} must be a finite number >= 0 W, got {getattr(p, k)!r}" for k in _POWERS
                 if not (_is_number(getattr(p, k)) and getattr(p, k) >= 0)]
    problems += [f"{k} must be a finite number > 0 bytes/s, got {getattr(p, k)!r}" for k in _BANDWIDTHS
                 if not (_is_number(getattr(p, k)) and getattr(p, k) > 0)]
    problems += [f"{k} must be a finite number >= 0 s, got {getattr(p, k)!r}" for k in _LATENCIES
                 if not (_is_number(getattr(p, k)) and getattr(p, k) >= 0)]
    if not isinstance(p.paging_overlaps_compute, bool):
        problems.append(f"paging_overlaps_compute must be true or false, got {p.paging_overlaps_compute!r}")
    if not (isinstance(p.ram_bytes, int) and not isinstance(p.ram_bytes, bool) and p.ram_bytes > 0):
        problems.append(f"ram_bytes must be a whole number of bytes > 0, got {p.ram_bytes!r}")
    hidden = p.paging_hidden_fraction
    if hidden is not None and not (_is_number(hidden) and 0 <= hidden <= 1):
        problems.append(f"paging_hidden_fraction must be a number from 0 to 1 or null, got {hidden!r}")
    if p.flops_per_s is not None and not (_is_number(p.flops_per_s) and p.flops_per_s > 0):
        problems.append(f"flops_per_s must be a finite number > 0 or null, got {p.flops_per_s!r}")
    return problems


def _check_keys(values: dict[str, Any]) -> None:
    """Refuse unknown and missing fields: a typo in a hand-written profile must not pass silently."""
    unknown = sorted(set(values) - set(_FIELDS))
    missing = [k for k in _REQUIRED if k not in values]
    problems = []
    if unknown:
        problems.append(f"unknown field(s) {', '.join(unknown)}")
    if missing:
        problems.append(f"missing field(s) {', '.join(missing)}")
    if problems:
        raise FormatError(
            "device profile " + " and ".join(problems) + f"; a profile has the fields {', '.join(_FIELDS)}"
        )


# -- pricing -------------------------------------------------------------------
def price_graph(graph: TrainingGraph, device: DeviceProfile, *, overwrite: bool = False) -> TrainingGraph:
    """Fill in each node's compute, page-in and page-out energy from ``device``.

    Parameters
    ----------
    graph:
        The graph; ``compute_ms`` must be milliseconds and ``bytes`` bytes.
    device:
        The profile whose powers, bandwidths and latencies price the nodes.
    overwrite:
        Replace energies the graph already carries.  Off by default: measured
        energies, and the POET reference graphs' own, are used as they are.

    Returns
    -------
    TrainingGraph
        A copy whose nodes all carry energies (see the module docstring for
        the formulas).
    """
    return graph.with_nodes(_priced_node(n, device, overwrite) for n in graph.nodes)


def _priced_node(node: Node, device: DeviceProfile, overwrite: bool) -> Node:
    def pick(present: float | None, priced: float) -> float:
        return priced if overwrite or present is None else present

    return replace(
        node,
        compute_j=pick(node.compute_j, device.compute_energy_j(node.compute_ms)),
        pagein_j=pick(node.pagein_j, device.pagein_seconds(node.bytes) * device.memory_power_w),
        pageout_j=pick(node.pageout_j, device.pageout_seconds(node.bytes) * device.memory_power_w),
    )


def paging_time_ms(graph: TrainingGraph, device: DeviceProfile) -> tuple[list[float], list[float]]:
    """Per-node page-in and page-out times on ``device``, milliseconds.

    Returns
    -------
    tuple[list[float], list[float]]
        ``(pagein_ms, pageout_ms)``, each ``latency + bytes / bandwidth`` per node.
    """
    pagein = [device.pagein_seconds(n.bytes) * 1000.0 for n in graph.nodes]
    pageout = [device.pageout_seconds(n.bytes) * 1000.0 for n in graph.nodes]
    return pagein, pageout


# -- built-in profiles ---------------------------------------------------------
# "chipsets.py" below is poet/chipsets.py of the POET reference implementation
# (github.com/ShishirPatil/poet); its figures are the paper's.  Supply voltages
# are the reference's: 3.3 V for the microcontrollers, 5 V for the Pi.

def _mkr1000() -> DeviceProfile:
    return DeviceProfile(
        name="mkr1000",
        description="Arduino MKR1000: Cortex-M0+ (SAM D21, 48 MHz, no FPU), 32 KB SRAM, SD card over SPI",
        compute_power_w=0.020 * 3.3,  # chipsets.py MKR1000 POWER: 20 mA @ 3.3 V
        # SAM D21 datasheet (DS40001882, "Power Consumption"): ACTIVE is ~3.4 mA at 48 MHz and
        # IDLE sleep with the clocks kept running roughly half of it.  Approximate; measure the board.
        idle_power_w=0.0015 * 3.3,
        memory_power_w=0.100 * 3.3,  # chipsets.py MEMORY_POWER: SD card 100 mA @ 3.3 V
        pagein_bandwidth_bps=4616.51e3,  # chipsets.py PAGEIN_THROUGHPUT, measured on the SD card
        pageout_bandwidth_bps=4440e3,  # chipsets.py PAGEOUT_THROUGHPUT
        pagein_latency_s=0.109e-3,  # chipsets.py PAGEIN_LATENCY
        pageout_latency_s=0.113e-3,  # chipsets.py PAGEOUT_LATENCY
        paging_overlaps_compute=False,  # single core; the CPU itself drives the SPI transfers
        ram_bytes=32 * _KIB,  # Arduino MKR1000 tech specs / SAM D21G18A: 32 KB SRAM
        flops_per_s=2000 / 0.012,  # chipsets.py FLOPS: 2000 software-float FLOPs in 12 ms (0.17 MFLOPS)
        source="builtin: POET reference chipsets.py (MKR1000); RAM and idle from the SAM D21 datasheet",
    )


def _nrf52840() -> DeviceProfile:
    return DeviceProfile(
        name="nrf52840",
        description="Nordic nRF52840: Cortex-M4F (64 MHz), 256 KB RAM, SD card over SPI",
        # chipsets.py M4F POWER: 3.328 mA @ 3.3 V (the nRF52840 running code from flash at 64 MHz).
        # It is also the m4 reference graph's compute_j / cost_cpu_ms, to the last digit.
        compute_power_w=3.328e-3 * 3.3,
        # nRF52840 Product Specification, "Current consumption: sleep": System ON, full RAM
        # retention, woken by the RTC: 3.16 uA at 3 V.
        idle_power_w=3.16e-6 * 3.0,
        memory_power_w=0.100 * 3.3,  # chipsets.py: "The SD card costs are same as MKR1000"
        pagein_bandwidth_bps=4616.51e3,
        pageout_bandwidth_bps=4440e3,
        pagein_latency_s=0.109e-3,
        pageout_latency_s=0.113e-3,
        paging_overlaps_compute=False,  # one core driving the SD card's SPI bus
        ram_bytes=256 * _KIB,  # nRF52840 Product Specification: 256 KB RAM
        flops_per_s=(16283 * 100 * 1000) / 255.6237,  # chipsets.py FLOPS: 1.63 GFLOP in 255.6 s (6.37 MFLOPS)
        source="builtin: POET reference chipsets.py (M4F); RAM and idle from the nRF52840 Product Specification",
    )


def _rpi4() -> DeviceProfile:
    return DeviceProfile(
        name="rpi4",
        description="Raspberry Pi 4 Model B: 4x Cortex-A72 (1.5 GHz), 4 GB, microSD (DDR50)",
        # chipsets.py RPi POWER: 600 mA @ 5 V, which the reference treats as peak minus idle
        # (pidramble.com power benchmarks: 6.4 W with stress on 4 cores - 2.7 W idle = 3.7 W).
        # The a72 reference graphs charge 49.86 W per second of compute instead; see the module docstring.
        compute_power_w=0.6 * 5,
        idle_power_w=2.7,  # pidramble.com power benchmarks: Pi 4 B idle 540 mA @ 5 V
        memory_power_w=0.030 * 5,  # chipsets.py MEMORY_POWER: SD card 30 mA @ 5 V
        # chipsets.py RPi, "config: with caching"; these reproduce the a72 graphs' paging energies
        # exactly.  The reference's RPiNoCache page-out is 17.1 MB/s with 4.23532 ms latency.
        pagein_bandwidth_bps=45.5e6,
        pageout_bandwidth_bps=24.5e6,
        pagein_latency_s=0.00509561e-3,
        pageout_latency_s=0.0185314e-3,
        paging_overlaps_compute=True,  # the executor pages on an I/O thread; four cores
        ram_bytes=4 * _GIB,  # the 4 GB model; 1, 2 and 8 GB exist: use with_ram()
        flops_per_s=2e9,  # chipsets.py RPi FLOPS, the speed behind the a72 graphs' times
        source="builtin: POET reference chipsets.py (RPi, with caching); idle from pidramble.com",
    )


def _jetson_tx2() -> DeviceProfile:
    return DeviceProfile(
        name="jetson-tx2",
        description="NVIDIA Jetson TX2: 2x Denver 2 + 4x Cortex-A57, 256-core Pascal GPU, 8 GB LPDDR4",
        compute_power_w=(995 - 229) * 1e-3,  # chipsets.py JetsonTX2 POWER: 1-CPU stress 995 mW - 229 mW idle
        idle_power_w=229e-3,  # the idle figure chipsets.py subtracts
        memory_power_w=309e-3,  # chipsets.py MEMORY_POWER: the read power, used for writes too
        pagein_bandwidth_bps=108.5e6,  # chipsets.py PAGEIN_THROUGHPUT
        pageout_bandwidth_bps=94.37e6,  # chipsets.py PAGEOUT_THROUGHPUT
        pagein_latency_s=0.00054,  # chipsets.py PAGEIN_LATENCY
        pageout_latency_s=0.002396,  # chipsets.py PAGEOUT_LATENCY
        paging_overlaps_compute=True,
        ram_bytes=8 * _GIB,  # Jetson TX2 module data sheet: 8 GB 128-bit LPDDR4
        flops_per_s=None,  # chipsets.py gives no FLOPS for the TX2
        source="builtin: POET reference chipsets.py (JetsonTX2); RAM from the Jetson TX2 data sheet",
    )


# Raspberry Pi 5 (BCM2712, 4x Cortex-A76 at 2.4 GHz, LPDDR4X, microSD with SDR104,
# one PCIe 2.0 lane): Raspberry Pi 5 product brief.  Raspberry Pi publishes no power
# figures beyond the 5 V / 5 A supply, so the powers are third-party measurements.
_RPI5_IDLE_W = 3.0  # u-labs.de (Raspberry Pi OS 12): about 3 W idle at the USB-C input
# Third-party reviews measure roughly 6-7 W under a four-core stress test; 6.5 W - idle.  Estimate.
_RPI5_COMPUTE_W = 6.5 - _RPI5_IDLE_W
# Raspberry Pi's launch post: 2-3x the CPU performance of a Pi 4; 2.5x the reference's 2 GFLOPS.
_RPI5_FLOPS = 2.5 * 2e9


def _rpi5() -> DeviceProfile:
    sd_read_bps, sd_write_bps = 85e6, 45e6
    return DeviceProfile(
        name="rpi5",
        description="Raspberry Pi 5: 4x Cortex-A76 (2.4 GHz), 8 GB LPDDR4X, microSD (SDR104)",
        compute_power_w=_RPI5_COMPUTE_W,
        idle_power_w=_RPI5_IDLE_W,
        # Estimate: the card power of the reference's Pi 4 (30 mA @ 5 V).  SDR104 can draw more
        # (the SD spec's default UHS-I limit is 0.72 W); measure.
        memory_power_w=0.030 * 5,
        # SDR104 bus limit 104 MB/s; good A2 cards reach about 85 MB/s sequential reads on a Pi 5.
        pagein_bandwidth_bps=sd_read_bps,
        # Estimate: about twice the reference's Pi 4 write (24.5 MB/s), SDR104 doubling DDR50's clock.
        pageout_bandwidth_bps=sd_write_bps,
        # Raspberry Pi's microSD card spec on a Pi 5 (SDR104): 5,000 random 4 KB reads and 2,000
        # writes per second; latency is one operation's time less its transfer time.
        pagein_latency_s=1 / 5000 - 4096 / sd_read_bps,
        pageout_latency_s=1 / 2000 - 4096 / sd_write_bps,
        paging_overlaps_compute=True,
        ram_bytes=8 * _GIB,  # the 8 GB model; 2, 4 and 16 GB exist: use with_ram()
        flops_per_s=_RPI5_FLOPS,
        source="builtin: Raspberry Pi 5 product brief, Raspberry Pi microSD card spec, third-party power "
        "measurements; partly estimated",
    )


def _rpi5_nvme() -> DeviceProfile:
    return replace(
        _rpi5(),
        name="rpi5-nvme",
        description="Raspberry Pi 5 with an M.2 HAT+ NVMe SSD (PCIe 2.0 x1) as the swap path",
        # Estimate: a 2230/2242 NVMe SSD's active power; drive data sheets give 2-3.5 W at full
        # speed, less on one PCIe 2.0 lane.
        memory_power_w=2.0,
        # PCIe 2.0 x1: 5 GT/s with 8b/10b coding = 500 MB/s (M.2 HAT+ product brief); about 85%
        # of it for reads and 75% for writes is what such links sustain.  Estimate.
        pagein_bandwidth_bps=0.85 * 500e6,
        pageout_bandwidth_bps=0.75 * 500e6,
        # Typical queue-depth-1 4 KiB latencies of consumer NVMe SSDs (writes land in the drive's cache).
        pagein_latency_s=100e-6,
        pageout_latency_s=50e-6,
        source="builtin: Raspberry Pi 5 and M.2 HAT+ product briefs, typical NVMe SSD figures; partly estimated",
    )


def _jetson_orin_nano() -> DeviceProfile:
    idle_w = 3.0
    return DeviceProfile(
        name="jetson-orin-nano",
        description="NVIDIA Jetson Orin Nano 8GB dev kit, 15 W mode: 6x Cortex-A78AE, 1024-core Ampere GPU, NVMe",
        # Jetson Orin Nano Series data sheet: 7 W and 15 W module power modes.  Training keeps the
        # GPU busy, so the module runs near the 15 W budget; minus idle.  Estimate.
        compute_power_w=15.0 - idle_w,
        # About 3 W for the idle module (NVIDIA developer forum: 2.2 W VDD_IN with displays, PCIe
        # and most engines switched off).  Estimate; tegrastats' VDD_IN on the device is better.
        idle_power_w=idle_w,
        memory_power_w=2.5,  # estimate: an M.2 2280 NVMe SSD's active power (data sheets: 2-4 W)
        # Dev kit's M.2 Key M slot: PCIe Gen3 x4 (3.9 GB/s link).  Conservative sustained figures for
        # a mainstream NVMe SSD; estimates.
        pagein_bandwidth_bps=2.0e9,
        pageout_bandwidth_bps=1.0e9,
        pagein_latency_s=100e-6,  # typical queue-depth-1 4 KiB NVMe read latency
        pageout_latency_s=50e-6,  # writes land in the drive's cache
        paging_overlaps_compute=True,  # GPU compute, DMA transfers on another engine
        ram_bytes=8 * _GIB,  # data sheet: 8 GB 128-bit LPDDR5 (68 GB/s), shared by CPU and GPU
        # Data sheet: 1024 CUDA cores at up to 625 MHz; 2 FP32 FLOPs per core per cycle (FMA).
        # A peak; training reaches a fraction of it.
        flops_per_s=1024 * 2 * 625e6,
        source="builtin: Jetson Orin Nano Series data sheet (power modes, GPU, memory), dev kit PCIe Gen3 x4 "
        "M.2 slot, typical NVMe SSD figures; partly estimated",
    )


_BUILTINS: dict[str, DeviceProfile] = {
    p.name: p for p in (_mkr1000(), _nrf52840(), _rpi4(), _jetson_tx2(), _rpi5(), _rpi5_nvme(), _jetson_orin_nano())
}
