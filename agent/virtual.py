"""A simulated fleet's virtual devices: each device's node config from its partition id and the run's classes.

Flower's simulation engine gives each virtual SuperNode only ``partition-id`` and
``num-partitions``.  The run config's ``device-classes`` (``NAME=PROFILE:FRACTION,...``,
e.g. ``small=rpi4:0.5,large=jetson-orin-nano:1``) fills in the rest,
deterministically: device ``i`` is of class ``i mod len(classes)``, named
``NAME-iii``, and its viewpoint angle follows from its partition
(:func:`agent.digits.device_angle`).  The ClientApp (:mod:`agent.flower`) and
``poet-edge simulate`` (which reports per device) both call
:func:`virtual_node_config`, so the two always agree.  How the digits are spread over the fleet (``samples``,
``label-alpha``, ``viewpoints``) is :class:`FleetData`.  Imports neither torch nor Flower.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.errors import FederationError


@dataclass(frozen=True)
class FleetData:
    """How a fleet's digits are spread over its devices (the run config's ``samples``, ``label-alpha`` and
    ``viewpoints``).

    The digits are split once (by the seed) into a training pool and a test pool, so no device is ever tested
    on a digit any device trained on.  The training pool is partitioned over the devices by Flower Datasets'
    partitioners: evenly (:class:`~flwr_datasets.partitioner.IidPartitioner`) or, with ``label_alpha``, by a
    Dirichlet draw per class (:class:`~flwr_datasets.partitioner.DirichletPartitioner`: small alpha, a few
    classes per device, in uneven amounts).  Where the fleet needs more digits than the pool holds, the pool is
    first grown by copies turned by a small random angle each (augmentation), so the data set is never the
    limit.  A device's held-out digits come from the test pool in its own label mix, seen from its angle.
    """

    samples: int = 0  # training digits per device; 0: the device's whole partition of the pool
    label_alpha: float = 0.0  # Dirichlet concentration of the label mix; 0: every device the natural mix
    viewpoints: float = 360.0  # the devices' angles spread evenly over this many degrees (centred on upright)
    holdout: int = 40  # held-out digits per device

    def check(self, partitions: int, batch_size: int) -> None:
        """Raise :class:`~agent.errors.FederationError` naming every setting that cannot make this fleet's data."""
        problems = [text for bad, text in (
            (self.samples < 0, f"samples must be 0 (a whole partition) or more, got {self.samples}"),
            (0 < self.samples < batch_size, f"samples {self.samples} is fewer than a batch of {batch_size}"),
            (self.label_alpha < 0, f"label-alpha must be 0 (natural mix) or positive, got {self.label_alpha}"),
            (not 0 <= self.viewpoints <= 360, f"viewpoints must be in [0, 360] degrees, got {self.viewpoints}"),
            (self.holdout < 1, f"holdout must be 1 digit or more, got {self.holdout}"),
            (partitions < 1, f"a fleet needs 1 device or more, got {partitions}"),
        ) if bad]
        if problems:
            raise FederationError("; ".join(problems))

    @classmethod
    def from_run_config(cls, run: Mapping[str, Any]) -> "FleetData":
        """The run config's ``samples``, ``label-alpha`` and ``viewpoints`` (absent: the defaults)."""
        d = cls()
        try:
            return cls(int(run.get("samples", d.samples)), float(run.get("label-alpha", d.label_alpha)),
                       float(run.get("viewpoints", d.viewpoints)))
        except (TypeError, ValueError) as exc:
            raise FederationError(f"the run config's fleet data has a value of the wrong type: {exc}") from exc

    def run_config(self) -> dict[str, Any]:
        """The run config keys :meth:`from_run_config` reads."""
        return {"samples": self.samples, "label-alpha": self.label_alpha, "viewpoints": self.viewpoints}


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


def virtual_node_config(partition: int, partitions: int, device_classes: str) -> dict[str, Any]:
    """Virtual device ``partition`` of ``partitions``: the node config a real SuperNode would be given."""
    classes = parse_device_classes(device_classes)
    if not classes:
        raise FederationError("the run config's device-classes names no class")
    name, profile, fraction = classes[partition % len(classes)]
    return {"partition-id": partition, "num-partitions": partitions, "device-name": f"{name}-{partition:03d}",
            "device-class": name, "device-profile": profile, "budget-fraction": fraction}
