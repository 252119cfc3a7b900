"""Device classes and the virtual fleet's node configs (what ``flower-supernode --node-config`` would carry).

The classes reach the ClientApps as one run config value (:func:`classes_config`); each virtual device derives
its own node config from its partition id with :func:`agent.federated.virtual.virtual_node_config`, the function
:func:`fleet_node_configs` calls too, so the report names devices exactly as the devices name themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.federated.virtual import FleetData, format_device_classes, virtual_node_config
from common.errors import CommandError
from common.exit_codes import ExitCode


@dataclass(frozen=True)
class DeviceClass:
    """Devices of one kind: a built-in device profile and a memory budget as a fraction of a plain step's whole
    memory (activations, gradients, optimizer state)."""

    name: str
    profile: str
    budget_fraction: float  # 1 or more: no limit

    def describe(self) -> str:
        limit = "no limit" if self.budget_fraction >= 1 else f"{self.budget_fraction:.0%} of a plain step's memory"
        return f"{self.name} ({self.profile}, {limit})"


# The digits model's plain step takes about 1.5 MB and no whole-step schedule fits below about 0.52 of it: at
# 0.55 the small class recomputes and pages most of its activations, at 0.7 the medium one some; the large one
# has no limit.
DEFAULT_CLASSES = (DeviceClass("small", "rpi4", 0.55), DeviceClass("medium", "rpi5", 0.7),
                   DeviceClass("large", "jetson-orin-nano", 1.0))


# Few digits per device, a moderately skewed label mix, cameras within 45 degrees of upright: each device's own
# data is too little to learn the digits well, and too particular for the global model alone (docs/benchmarks.md,
# "Fleet simulation").
DEFAULT_DATA = FleetData(samples=16, label_alpha=1.0, viewpoints=90.0)


def parse_classes(text: str) -> tuple[DeviceClass, ...]:
    """``PROFILE:FRACTION,...`` (e.g. ``rpi4:0.5,rpi5:0.7,jetson-orin-nano:1``) as classes named c0, c1, ..."""
    classes = []
    for i, part in enumerate(p.strip() for p in text.split(",") if p.strip()):
        profile, _, fraction = part.partition(":")
        try:
            value = float(fraction) if fraction else 1.0
        except ValueError as exc:
            raise CommandError(f"--classes: {part!r} is not PROFILE:FRACTION", ExitCode.USAGE) from exc
        if value <= 0:
            raise CommandError(f"--classes: the fraction in {part!r} must be positive", ExitCode.USAGE)
        classes.append(DeviceClass(f"c{i}", profile, value))
    if not classes:
        raise CommandError("--classes names no class; e.g. rpi4:0.5,rpi5:0.7", ExitCode.USAGE)
    return tuple(classes)


def classes_config(classes: tuple[DeviceClass, ...]) -> str:
    """The run config's ``device-classes``: ``NAME=PROFILE:FRACTION,...``."""
    return format_device_classes([(c.name, c.profile, c.budget_fraction) for c in classes])


def fleet_node_configs(devices: int, classes: tuple[DeviceClass, ...]) -> list[dict[str, Any]]:
    """Device ``i`` is of class ``i mod len(classes)`` and holds digits partition ``i`` of ``devices``."""
    text = classes_config(classes)
    return [virtual_node_config(i, devices, text) for i in range(devices)]
