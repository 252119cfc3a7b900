"""The upper reference of a simulation: one model trained on the whole fleet's data pooled in one place.

What no federation can beat without seeing more data: the training images of every
device (each seen from its own angle) in one data set, trained from the same
initial weights with the same optimizer through the same training path, for as many
steps as the whole fleet trained, then evaluated on each device's own held-out images.
Runs in this process (torch is imported on the first call).
"""

from __future__ import annotations

from pathlib import Path

from agent.federated.virtual import FleetData


def centralized_accuracies(devices: int, data: FleetData, seed: int, steps: int, lr: float,
                           graph_file: Path, initial_weights: str = "") -> list[float]:
    """Held-out accuracy on each device (by partition) of one model trained ``steps`` steps on the fleet's pooled
    training images, from the fleet's start (``initial_weights``, else the seeded weights)."""
    import torch

    from agent.data import LocalDataset
    from agent.digits import BATCH_SIZE, device_dataset, fleet_workload
    from agent.federated.task import Task
    from schedules.graph import TrainingGraph

    shares = [device_dataset(i, devices, data=data, seed=seed) for i in range(devices)]
    pooled = LocalDataset(train_x=torch.cat([s.train_x for s in shares]),
                          train_y=torch.cat([s.train_y for s in shares]),
                          holdout_x=shares[0].holdout_x[:0], holdout_y=shares[0].holdout_y[:0], batch_size=BATCH_SIZE,
                          seed=seed, source=Path(f"{shares[0].source.parent}/pooled-{devices}"))
    task = Task(fleet_workload(data, seed, initial_weights=initial_weights), graph=TrainingGraph.load(graph_file))
    plan = task.plan("jetson-orin-nano", None)  # no memory limit: the reference is about accuracy
    outcome = task.train(task.initial, pooled, plan, steps=max(steps, 1), lr=lr, check_memory=False)
    return [task.evaluate(outcome.weights, share)[1] for share in shares]
