"""A simulated fleet's virtual devices: each device's node config from its partition id and the run's classes.

Flower's simulation engine gives each virtual SuperNode only ``partition-id`` and
``num-partitions``.  The run config's ``device-classes`` (``NAME=PROFILE:FRACTION,...``,
e.g. ``small=rpi4:0.5,large=jetson-orin-nano:1``) fills in the rest,
deterministically: device ``i`` is of class ``i mod len(classes)``, named
``NAME-iii``, and its viewpoint angle follows from its partition
(:func:`agent.digits.device_angle`).  The ClientApp (:mod:`agent.federated.clientapp`) and
``poet-edge simulate`` (which reports per device) both call
:func:`virtual_node_config`, so the two always agree.  How the digits are spread over the fleet (``samples``,
``label-alpha``, ``quantity-skew``, ``viewpoints``) is :class:`FleetData`; a device's part in each round under
the run's availability trace (``availability``, ``dropout``, ``straggle``) is :func:`round_part`.  Imports
neither torch nor Flower.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from agent.errors import FederationError
from common.errors import RunConfigError
from common.runconfig import RunConfig


STDLIB_TEXT = "python-stdlib"  # the dataset naming the standard library's text (agent.stdlib_text)


@dataclass(frozen=True)
class FleetData:
    """How a fleet's images are spread over its devices (the run config's ``dataset``, ``label-column``,
    ``partition-by``, ``samples``, ``label-alpha``, ``quantity-skew``, ``viewpoints`` and ``viewpoint-centre``).

    The images are the shipped digits, or a data set saved by Hugging Face ``datasets`` (``dataset``;
    :mod:`agent.image_sets`).  With ``partition_by`` each device is one natural id's images (a writer's),
    tested on its own held-out ones; otherwise:

    The digits are split once (by the seed) into a training pool and a test pool, so no device is ever tested
    on a digit any device trained on.  The training pool is partitioned over the devices by Flower Datasets'
    partitioners: evenly (:class:`~flwr_datasets.partitioner.IidPartitioner`) or, with ``label_alpha``, by a
    Dirichlet draw per class (:class:`~flwr_datasets.partitioner.DirichletPartitioner`: small alpha, a few
    classes per device, in uneven amounts).  Where the fleet needs more digits than the pool holds, the pool is
    first grown by copies turned by a small random angle each (augmentation), so the data set is never the
    limit.  With ``quantity_skew`` the devices' training-set sizes are a seeded log-normal draw around
    ``samples`` (:meth:`sample_counts`), cut by :class:`~flwr_datasets.partitioner.SizePartitioner` (or kept
    from each Dirichlet partition).  A device's held-out digits come from the test pool in its own label mix,
    seen from its angle.
    """

    samples: int = 0  # training digits per device (their mean with quantity_skew); 0: a whole partition
    label_alpha: float = 0.0  # Dirichlet concentration of the label mix; 0: every device the natural mix
    viewpoints: float = 360.0  # the devices' angles spread evenly over this many degrees (about the centre)
    holdout: int = 40  # held-out digits per device
    quantity_skew: float = 0.0  # sigma of the log-normal the devices' sample counts follow; 0: all ``samples``
    dataset: str = ""  # a saved data set's directory; empty: the shipped digits
    label_column: str = ""  # its label column; empty: its one ClassLabel column
    partition_by: str = ""  # a column of natural ids, one device each; empty: partition the training pool
    viewpoint_centre: float = 0.0  # the angle the devices' viewpoints centre on (0: upright, as the vendor sees)

    def check(self, partitions: int, batch_size: int) -> None:
        """Raise :class:`~agent.errors.FederationError` naming every setting that cannot make this fleet's data:
        the run config's ranges (:meth:`common.runconfig.RunConfig.check`), then what this fleet needs."""
        try:
            RunConfig(**self.run_config()).check()
            problems = []
        except RunConfigError as exc:
            problems = [str(exc)]
        problems += [text for bad, text in (
            (0 < self.samples < batch_size, f"samples {self.samples} is fewer than a batch of {batch_size}"),
            (self.holdout < 1, f"holdout must be 1 digit or more, got {self.holdout}"),
            (partitions < 1, f"a fleet needs 1 device or more, got {partitions}"),
            (self.dataset == STDLIB_TEXT and bool(self.label_alpha or self.partition_by or self.quantity_skew),
             f"{STDLIB_TEXT} text is split by package, one per device: leave label-alpha, partition-by and "
             "quantity-skew at 0"),
        ) if bad]
        if problems:
            raise FederationError("; ".join(problems))

    @classmethod
    def from_run_config(cls, run: RunConfig) -> FleetData:
        """The run config's data keys (:meth:`run_config`)."""
        return cls(**{name: getattr(run, name) for name in cls._RUN_CONFIG_FIELDS})

    def run_config(self) -> dict[str, Any]:
        """The :class:`~common.runconfig.RunConfig` fields :meth:`from_run_config` reads."""
        return {name: getattr(self, name) for name in self._RUN_CONFIG_FIELDS}

    _RUN_CONFIG_FIELDS = ("dataset", "label_column", "partition_by", "samples", "label_alpha", "viewpoints",
                          "quantity_skew", "viewpoint_centre")

    def sample_counts(self, partitions: int, seed: int, batch_size: int) -> list[int]:
        """Training digits per device: ``samples`` each, or with ``quantity_skew`` a seeded log-normal draw
        whose mean is ``samples`` (each at least a batch)."""
        if not self.quantity_skew:
            return [self.samples] * partitions
        rng = random.Random(f"quantity:{seed}")
        sigma = self.quantity_skew
        return [max(batch_size, round(self.samples * math.exp(rng.gauss(-sigma * sigma / 2, sigma))))
                for _ in range(partitions)]


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


NIGHT = (22.0, 7.0)  # local hours between which a device on the "night" trace is plugged in and idle


@dataclass(frozen=True)
class RoundPart:
    """What a virtual device does in one training round: its share of the local steps (1: all of them), or why
    it does not train (``absent``)."""

    share: float = 1.0
    absent: str = ""


def round_part(partition: int, partitions: int, server_round: int, run: RunConfig) -> RoundPart:
    """Device ``partition``'s part in training round ``server_round`` under the run's availability trace.

    With ``availability = "night"`` the device trains only while charging at night (:data:`NIGHT`, local time);
    the fleet's time zones are spread evenly round the clock and round ``r`` starts ``(r - 1) * round-hours``
    after midnight UTC.  An available device is then unplugged partway with chance ``dropout`` (it sends
    nothing), or with chance ``straggle`` finishes only part of its steps before the round closes (a share
    between 0.2 and 0.8; FedAvg weighs its update by the examples it trained).  Seeded by the run's seed, the
    device and the round: the same run gives every device the same part.
    """
    if run.availability == "night":
        hour = ((server_round - 1) * run.round_hours + 24.0 * partition / partitions) % 24.0
        start, end = NIGHT
        if end <= hour < start:
            return RoundPart(0.0, f"not charging at {int(hour):02d}:{int(hour % 1 * 60):02d} local time "
                                  f"(trains {int(start):02d}:00-{int(end):02d}:00)")
    rng = random.Random(f"round:{run.seed}:{partition}:{server_round}")
    if rng.random() < run.dropout:
        return RoundPart(0.0, f"unplugged partway through round {server_round}")
    if rng.random() < run.straggle:
        return RoundPart(round(rng.uniform(0.2, 0.8), 3))
    return RoundPart()
