"""Training on the device's own data through the executor, resumable to the bit.

:class:`Trainer` owns the model, its optimizer, the executor running the
schedule, the local data set and the checkpoints.  Each :meth:`Trainer.step`
takes the batch at the current data position, runs one executor step (which
may be cancelled between instructions, leaving the model as it was) and the
optimizer step, then moves the position.  A checkpoint holds the model, the
optimizer, the step count, the data position and the RNG states, so training
resumed from one continues exactly as an uninterrupted run would: the data
order of an epoch is a function of the seed and the epoch
(:meth:`agent.data.LocalDataset.batch`), and nothing else draws random numbers.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from agent.daemon.checkpoint import CheckpointStore, Loaded
from agent.daemon.config import AgentConfig
from agent.daemon.prepare import Prepared
from agent.data import LocalDataset
from agent.errors import MemoryBoundError
from agent.executor import Executor
from agent.holdout import Evaluation, evaluate



@dataclass(frozen=True)
class StepResult:
    """One committed step."""

    steps_done: int
    loss: float
    seconds: float
    peak_bytes: int | None  # the process's peak RSS during the step
    bound_bytes: int | None  # what that peak may reach: (RSS before the step + budget) x (1 + slack)
    energy_j: float | None


def make_optimizer(config: AgentConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The configured optimizer over the model's trainable parameters."""
    t = config.training
    params = [p for p in model.parameters() if p.requires_grad]
    if t.optimizer == "sgd":
        return torch.optim.SGD(params, lr=t.learning_rate, momentum=t.momentum, weight_decay=t.weight_decay)
    if t.optimizer == "adam":
        return torch.optim.Adam(params, lr=t.learning_rate, weight_decay=t.weight_decay)
    return torch.optim.AdamW(params, lr=t.learning_rate, weight_decay=t.weight_decay)


class Trainer:
    """Trains ``prepared.workload`` on ``data`` under ``prepared.schedule``; see the module docstring."""

    def __init__(self, config: AgentConfig, prepared: Prepared, data: LocalDataset, *, meter: Any = None,
                 store: CheckpointStore | None = None) -> None:
        self.config = config
        self.prepared = prepared
        self.model = prepared.workload.model
        self.loss_fn = prepared.workload.loss_fn
        self.data = data
        self.optimizer = make_optimizer(config, self.model)
        self.store = store or CheckpointStore(config.device.state_dir / "checkpoints" / prepared.key)
        self.executor = Executor(self.model, prepared.segments, prepared.graph, prepared.schedule,
                                 config.swap_dir, meter=meter)
        self.steps_done = 0
        self.position = (0, 0)  # (epoch, batch index) of the next step's batch
        self.resumed: Loaded | None = None

    def close(self) -> None:
        self.executor.close()

    # -- checkpoints ---------------------------------------------------------------
    def restore(self) -> Loaded | None:
        """Continue from the newest readable checkpoint, if any; returns it."""
        self.store.remove_temporaries()
        loaded = self.store.load_latest()
        if loaded is None:
            return None
        state = loaded.state
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps_done = int(state["steps_done"])
        self.position = (int(state["position"][0]), int(state["position"][1]))
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(_python_rng(state["rng"]["python"]))
        self.resumed = loaded
        return loaded

    def checkpoint(self) -> float:
        """Write a checkpoint of the current state; returns the seconds it took."""
        started = time.perf_counter()
        self.store.save(self.steps_done, {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "steps_done": self.steps_done,
            "position": list(self.position),
            "rng": {"torch": torch.get_rng_state(), "python": _python_rng_state()},
            "schedule_id": self.prepared.schedule.schedule_id,
        })
        return time.perf_counter() - started

    # -- steps ------------------------------------------------------------------------
    def step(self, cancel: Callable[[], bool] | None = None) -> StepResult:
        """One training step on the next batch; a cancelled step raises and changes nothing."""
        inputs, targets = self.data.batch(*self.position)
        self.model.zero_grad(set_to_none=True)
        loss = self.executor.step(inputs, targets, cancel)
        stats = self.executor.last_stats
        bound = self._bound(stats.rss_before_bytes)
        if bound is not None and stats.peak_rss_bytes is not None and stats.peak_rss_bytes > bound:
            raise MemoryBoundError(
                f"step peak {stats.peak_rss_bytes:,} B over the bound {bound:,} B (memory before the step + "
                f"budget {self.prepared.schedule.memory_budget:,} B + {self.config.training.memory_slack:.0%}); "
                "the step was not applied: lower training.memory_budget or check for other memory use")
        self.optimizer.step()
        self.model.zero_grad(set_to_none=True)  # gradients are not part of the state between steps
        self.steps_done += 1
        self.position = self.data.position_after(*self.position)
        energy = stats.energy.total_joules if stats.energy is not None else None
        return StepResult(self.steps_done, float(loss), stats.step_seconds, stats.peak_rss_bytes, bound, energy)

    def _bound(self, rss_before: int | None) -> int | None:
        budget = self.prepared.schedule.memory_budget
        if rss_before is None or budget is None:
            return None
        return int((rss_before + budget) * (1 + self.config.training.memory_slack))

    def evaluate(self) -> Evaluation | None:
        """Loss and accuracy on the held-out data (``None`` without any); leaves the training state alone."""
        return evaluate(self.model, self.loss_fn, self.data)


def _python_rng_state() -> list[Any]:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _python_rng(saved: list[Any]) -> tuple[Any, ...]:
    return saved[0], tuple(saved[1]), saved[2]
