"""A vendor's pretrained model: what a fleet starts from when its operator ships a trained model, not a seeded one.

Before any device joins, the vendor trains the fleet's model centrally on images no device of the fleet holds
(:func:`agent.digits.vendor_dataset`: the training pool's other images, upright; the devices see theirs from
their own angle), and writes it as a ``.safetensors`` file: the file ``poet-edge server versions import``
stores as a signed version and a device agent's ``[workload] weights`` names.  ``poet-edge simulate
--pretrain STEPS`` starts every run of a seed (and its local-only baseline, and the centralized reference) from
it (run config ``initial-weights``).  Runs in this process (torch is imported on the first call).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from agent.federated.virtual import STDLIB_TEXT, FleetData

if TYPE_CHECKING:
    from engine.workload import Workload

VENDOR_PROFILE = "jetson-orin-nano"  # the vendor trains without a device's memory limit


@dataclass(frozen=True)
class VendorModel:
    """The pretrained weights' file, what they were trained on, and their accuracy on unseen upright images."""

    path: Path
    images: int  # training samples: images, or windows of text
    steps: int
    accuracy: float  # on held-out samples: of images, or of next tokens
    what: str = "upright images"

    def describe(self) -> str:
        return (f"pretrained by the vendor: {self.steps} steps on {self.images} {self.what} no device holds, "
                f"{self.accuracy:.1%} on held-out ones ({self.path})")


def pretrain(devices: int, data: FleetData, seed: int, steps: int, lr: float, out: Path,
             graph_file: Path | None = None, model: Callable[[int], Workload] | None = None) -> VendorModel:
    """Train the fleet's model from its seeded weights ``steps`` steps on the vendor's images and write it to
    ``out`` (``.safetensors``); planned from ``graph_file`` (a profile of the model), else from one made now.
    ``model(seed)`` builds the fleet's model where it is not :func:`agent.digits.fleet_workload`'s for ``data``
    (the demo's deeper digits model)."""
    from safetensors.torch import save_file

    from agent.digits import fleet_workload, vendor_dataset
    from agent.federated.task import Task
    from schedules.graph import TrainingGraph

    images = vendor_dataset(devices, data=data, seed=seed)
    # the whole model, not adapters: what the devices' adapters are then added to
    task = Task(model(seed) if model is not None else fleet_workload(data, seed, adapters=False),
                graph=TrainingGraph.load(graph_file) if graph_file else None)
    plan = task.plan(VENDOR_PROFILE, None)
    outcome = task.train(task.initial, images, plan, steps=max(steps, 1), lr=lr, check_memory=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    save_file({name: value.detach().contiguous() for name, value in outcome.weights.items()}, str(partial),
              metadata={"trained-on": str(images.source), "steps": str(steps)})
    partial.replace(out)  # whole or not at all: a cached file is read by later runs
    _, accuracy, _ = task.evaluate(outcome.weights, images)
    what = "windows of text" if data.dataset == STDLIB_TEXT else "upright images"
    return VendorModel(out, len(images.train_x), steps, accuracy, what)
