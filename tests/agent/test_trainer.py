"""A worker holds one model: the daemon's trainer keeps its initial weights as a step-0 checkpoint on disk and a
federated worker in a file it maps, not a copy in RAM; and what the model makes in its forward counts in the
steps' memory."""

from __future__ import annotations

import json
import subprocess
import sys
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


def test_a_federated_worker_keeps_its_initial_weights_on_disk_not_in_ram(made, tmp_path: Path) -> None:
    from agent.federated.task import Task

    config, prepared, data = made
    initial = {k: v.clone() for k, v in prepared.workload.model.state_dict().items()}
    model_bytes = sum(t.nbytes for t in initial.values())
    before = rss.settled_anonymous()
    task = Task(prepared.workload, tmp_path / "swap", graph=prepared.graph, segments=prepared.segments)
    assert rss.anonymous_growth_since(before) < model_bytes / 2  # a copy of the weights would be all of them
    kept = task.initial
    assert list(kept) == list(initial) and all(torch.equal(kept[k], v) for k, v in initial.items())
    # a second worker of the same model (a forked ClientApp) finds the same file, not one more
    Task(prepared.workload, tmp_path / "swap", graph=prepared.graph, segments=prepared.segments)
    assert len(list((tmp_path / "swap").glob("*.pt"))) == 1


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


_PROCESS_CACHE: list[torch.Tensor] = []  # what the first training forward of this process builds


class Caching(nn.Module):
    """32 features to 5 classes whose first training forward in the process builds a 16 MB cache that every
    later model shares (as a library builds its kernels' tables or a thread pool once): memory the process
    holds from then on, built while profiling in the window that profiles and while cutting in any other."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and not _PROCESS_CACHE:  # not in the zoo's trial forward (eval, no gradients)
            _PROCESS_CACHE.append(torch.ones(4 << 20))
        return self.body(x)


class Copying(nn.Module):
    """32 features to 5 classes through a 16 MB table it copies in every forward (and adds a slice of)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 5))
        self.register_buffer("table", torch.ones(4 << 20))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        copy = self.table.clone()
        return self.body(x) + copy[:5]


def plain_body() -> nn.Module:
    return Caching().body


WINDOW = """
import json, sys
import torch
from agent.config import load_config
from agent.daemon.trainer import Trainer
from agent.data import open_dataset
from agent.prepare import prepare

torch.set_num_threads(1)
config = load_config(sys.argv[1])
prepared = prepare(config)
data = open_dataset(config.data.path, (8, 32), holdout=config.data.holdout, seed=config.workload.seed)
trainer = Trainer(config, prepared, data)
try:
    memory = max(trainer.step().memory_bytes for _ in range(2))
finally:
    trainer.close()
print(json.dumps({"profiled": prepared.profiled, "runtime_bytes": prepared.graph.runtime_bytes,
                  "first_run_bytes": prepared.first_run_bytes, "memory": memory}))
"""


def _window(config: Path) -> dict:
    """A training window in a process of its own, as the daemon runs each: what it prepared and measured."""
    done = subprocess.run([sys.executable, "-c", WINDOW, str(config)], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).parents[2], timeout=300)
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("factory", ["Caching", "Copying", "plain_body"])
def test_memory_the_model_makes_in_its_forward_counts_in_the_steps(tmp_path: Path, factory: str) -> None:
    path = _write_config(tmp_path, FakeDevice(tmp_path / "root"), write_csv(tmp_path / "data.csv"),
                         f"{__name__}:{factory}", "8x32", training_memory_budget="1GB")
    first, window = _window(path), _window(path)  # the first window profiles; the next prepares from it
    assert first["profiled"] and not window["profiled"]
    caching = factory == "Caching"
    # the profile saw the cache the model's first run left, and what an executor's step holds beside its values
    # (its copy of the model's buffers, Copying's 16 MB table among them, to undo a step that fails), and
    # keeps room for them in every plan ...
    assert (window["runtime_bytes"] >= 15 << 20) == (factory != "plain_body"), window
    # ... and it counts in the steps of every window, as a copy made in the forward counts as the step's own:
    # in a later window the cut built it, in the first the profile did before the cut
    for seen in (first, window):
        assert (seen["first_run_bytes"] >= 15 << 20) == caching, seen
        assert (seen["memory"] >= 15 << 20) == (factory != "plain_body"), seen
