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

Built-in profiles (:meth:`DeviceProfile.builtin`) are data files in
``schedules/devices/``: the POET paper's platforms ``mkr1000``, ``nrf52840``,
``rpi4`` and ``jetson-tx2`` with the reference implementation's figures
(``poet/chipsets.py`` of github.com/ShishirPatil/poet), and ``rpi5``,
``rpi5-nvme``, ``jetson-orin-nano`` from public specifications and
measurements.  Each file's ``sources`` says where every figure came from;
estimates say so.  A profile measured on the device (``poet-edge profile``)
beats any of them.

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

import functools
import json
import math
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from common.canonical import load_validated, parse_json_object
from schedules.errors import FormatError, PlannerError, UnknownNameError, UnsupportedVersionError
from schedules.graph import Node, TrainingGraph

DEVICE_FORMAT = "poet-edge/device-profile"
DEVICE_VERSION = 1


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
    update_costs:
        What an optimizer's update costs here, by the kind of update
        (:attr:`schedules.step_memory.TrainingSpec.update_kind`, ``"sgd:1:0"``):
        ``(seconds per chunk updated, seconds per byte updated)``, measured
        through the engine's update code (``poet-edge profile``).  The update
        runs beside no node the graph times, so a whole-step plan adds it to
        its step time (:func:`schedules.step_memory.update_ms`); a kind not
        here adds nothing.
    source:
        Where the figures came from, in a line (``builtin: ...``, ``measured on HOST at DATE``).
    sources:
        Where each figure came from, by field name (a data sheet, a measurement, an estimate and its
        reasoning); may be empty.
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
    update_costs: dict[str, tuple[float, float]] = field(default_factory=dict)
    source: str
    sources: dict[str, str] = field(default_factory=dict)
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

    def update_seconds(self, kind: str, chunks: int, nbytes: int) -> float | None:
        """Seconds the update of ``kind`` takes for ``nbytes`` of parameters in ``chunks`` chunks, or ``None``
        where this profile has not measured that kind."""
        cost = self.update_costs.get(kind)
        return None if cost is None else chunks * cost[0] + nbytes * cost[1]

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
        profile = _builtins().get(name.strip().lower()) if isinstance(name, str) else None
        if profile is None:
            raise UnknownNameError(
                f"unknown device profile {name!r}; built-in profiles: {', '.join(_builtins())}, "
                "or a profile file (device.json from `poet-edge profile`)"
            )
        return profile

    @staticmethod
    def builtin_names() -> tuple[str, ...]:
        """Names of the built-in profiles, in alphabetical order."""
        return tuple(_builtins())

    # -- files -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON shape (format tag first, then every field; ``update_costs`` only where measured)."""
        data: dict[str, Any] = {"format": DEVICE_FORMAT, "version": self.version}
        data.update({f.name: getattr(self, f.name) for f in fields(self) if f.name != "version"})
        if not self.update_costs:
            del data["update_costs"]
        else:
            data["update_costs"] = {kind: list(cost) for kind, cost in self.update_costs.items()}
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
        if isinstance(values.get("update_costs"), dict):
            values["update_costs"] = {kind: tuple(cost) if isinstance(cost, list) else cost
                                      for kind, cost in values["update_costs"].items()}
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
    if f.name not in ("description", "flops_per_s", "paging_hidden_fraction", "update_costs", "sources", "version")
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
    if not (isinstance(p.update_costs, dict) and all(
            isinstance(kind, str) and isinstance(cost, tuple) and len(cost) == 2
            and all(_is_number(v) and v >= 0 for v in cost) for kind, cost in p.update_costs.items())):
        problems.append("update_costs must map update kinds to [seconds per chunk, seconds per byte], both finite "
                        f"and >= 0, got {p.update_costs!r}")
    if not (isinstance(p.sources, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in p.sources.items())):
        problems.append(f"sources must map field names to text, got {p.sources!r}")
    elif set(p.sources) - set(_FIELDS):
        problems.append(f"sources names unknown field(s) {', '.join(sorted(set(p.sources) - set(_FIELDS)))}")
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
BUILTIN_DIR = "devices"
"""Folder of ``schedules`` holding one profile file per built-in device (``rpi4.json``, ...)."""


@functools.cache
def _builtins() -> dict[str, DeviceProfile]:
    """Every built-in profile by name, read once from the package's data files."""
    folder = resources.files("schedules") / BUILTIN_DIR
    found = {}
    for entry in folder.iterdir():
        if entry.name.endswith(".json"):
            profile = DeviceProfile.from_dict(parse_json_object(entry.read_bytes(), f"built-in profile {entry.name}"))
            found[profile.name] = profile
    return dict(sorted(found.items()))
