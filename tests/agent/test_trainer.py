"""The daemon's trainer holds one model: its initial weights are a step-0 checkpoint on disk, not a copy in RAM."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

from agent.config import load_config
from agent.daemon.trainer import Trainer
from agent.data import open_dataset
from agent.prepare import prepare
from engine import rss
from engine.errors import UpdateInterrupted
from tests.agent.daemon_helpers import FakeDevice, _write_config, write_csv

WIDE = 2048


def wide_mlp() -> nn.Module:
    """32 features to 5 classes through two wide layers: 17 MB of weights, so a copy shows in RSS."""
    return nn.Sequential(nn.Linear(32, WIDE), nn.ReLU(), nn.Linear(WIDE, WIDE), nn.ReLU(), nn.Linear(WIDE, 5))


@pytest.fixture()
def made(tmp_path: Path):
    """The trainer's config, prepared workload and data (the wide MLP, SGD with momentum)."""
    torch.set_num_threads(1)
    device = FakeDevice(tmp_path / "root")
    path = _write_config(tmp_path, device, write_csv(tmp_path / "data.csv"), f"{__name__}:wide_mlp", "8x32",
                         training_memory_budget="1GB")
    config = load_config(path)
    prepared = prepare(config)
    data = open_dataset(config.data.path, (8, 32), holdout=config.data.holdout, seed=config.workload.seed)
    return config, prepared, data


def test_the_initial_weights_are_a_step_0_checkpoint_and_no_copy_stays_in_ram(made) -> None:
    config, prepared, data = made
    initial = {k: v.clone() for k, v in prepared.workload.model.state_dict().items()}
    model_bytes = sum(t.nbytes for t in initial.values())
    # a process's first optimizer imports PyTorch's compiler machinery (100 MB of code, once): not the trainer's
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1, momentum=0.9)
    rss.trim_heap()
    before = rss.current()
    trainer = Trainer(config, prepared, data)
    try:
        rss.trim_heap()
        assert rss.current() - before < model_bytes / 2  # a copy of the weights would be all of them
        loaded = trainer.store.load_latest()
        assert loaded.steps_done == 0
        assert all(torch.equal(loaded.state["model"][k].load(), v) for k, v in initial.items())
    finally:
        trainer.close()


def test_a_step_that_fails_after_updating_starts_over_from_the_checkpoint_on_disk(made, monkeypatch) -> None:
    config, prepared, data = made
    initial = {k: v.clone() for k, v in prepared.workload.model.state_dict().items()}
    trainer = Trainer(config, prepared, data)
    try:
        fused = trainer.training.fused
        applied = fused._apply

        def fail_after_the_first_update(slot, *args) -> None:
            applied(slot, *args)
            raise OSError("flash gone")

        monkeypatch.setattr(fused, "_apply", fail_after_the_first_update)
        with pytest.raises(UpdateInterrupted):
            trainer.step()
        monkeypatch.undo()
        assert trainer.steps_done == 0 and trainer.position == (0, 0)
        assert all(torch.equal(trainer.model.state_dict()[k], v) for k, v in initial.items())
    finally:
        trainer.close()
