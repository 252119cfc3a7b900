"""A simulated fleet's virtual devices: each device's node config from its partition id and the run's classes.

Flower's simulation engine gives each virtual SuperNode only ``partition-id`` and
``num-partitions``.  The run config's ``device-classes`` (``NAME=PROFILE:FRACTION,...``,
e.g. ``small=rpi4:0.5,large=jetson-orin-nano:1``) and ``skew`` fill in the rest,
deterministically: device ``i`` is of class ``i mod len(classes)``, named
``NAME-iii``, and its viewpoint angle follows from its partition
(:func:`agent.digits.device_angle`).  The ClientApp (:mod:`agent.flower`) and
``poet-edge simulate`` (which reports per device) both call
:func:`virtual_node_config`, so the two always agree.  Imports neither torch nor Flower.
"""

from __future__ import annotations

from typing import Any

from agent.errors import FederationError


def parse_device_classes(text: str) -> list[tuple[str, str, float]]:
    """``NAME=PROFILE:FRACTION,...`` as ``[(name, profile, budget fraction), ...]`` (fraction 1 or more: no limit)."""
    classes = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, rest = part.partition("=")
        profile, _, fraction = rest.partition(":")
        try:
            value = float(fraction or 1.0)
        except ValueError:
            value = -1.0
        if not name or not profile or value <= 0:
            raise FederationError(f"device class {part!r} is not NAME=PROFILE:FRACTION (e.g. small=rpi4:0.5)")
        classes.append((name, profile, value))
    return classes


def format_device_classes(classes: list[tuple[str, str, float]]) -> str:
    """The run config value for ``classes``: the inverse of :func:`parse_device_classes`."""
    return ",".join(f"{name}={profile}:{fraction!r}" for name, profile, fraction in classes)


def virtual_node_config(partition: int, partitions: int, device_classes: str, skew: float = 0.0) -> dict[str, Any]:
    """Virtual device ``partition`` of ``partitions``: the node config a real SuperNode would be given."""
    classes = parse_device_classes(device_classes)
    if not classes:
        raise FederationError("the run config's device-classes names no class")
    name, profile, fraction = classes[partition % len(classes)]
    return {"partition-id": partition, "num-partitions": partitions, "device-name": f"{name}-{partition:03d}",
            "device-class": name, "device-profile": profile, "budget-fraction": fraction, "skew": skew}
