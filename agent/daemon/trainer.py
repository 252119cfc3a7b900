"""A training window on the device's own data through :class:`engine.training.Training`, resumable to the bit.

:class:`Trainer` adds to the one training path what a daemon window needs:
the local data set, the data position, checkpoints and the step count.  Each
:meth:`Trainer.step` takes the batches at the current data position (one per
micro-batch), runs one training step (cancellable between instructions until
its first update), then moves the position.  A checkpoint holds the model,
the optimizer (state on flash streamed chunk by chunk), the step count, the
data position and the RNG states, so training resumed from one continues
exactly as an uninterrupted run would: the data order of an epoch is a
function of the seed and the epoch (:meth:`agent.data.LocalDataset.batch`),
and nothing else draws random numbers.  A step that fails after it began
updating parameters leaves the model between two steps: the trainer restores
its last checkpoint before the error propagates.  The initial weights are the
first checkpoint (step 0, written when the trainer starts with none), so the
process never holds a second copy of the model to start over from.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from agent.daemon.checkpoint import CheckpointStore, Loaded
from agent.errors import CheckpointError
from agent.config import AgentConfig
from agent.prepare import Prepared
from agent.data import LocalDataset
from agent.weight_files import describe as describe_weights
from engine.errors import MemoryBoundError, UpdateInterrupted
from agent.holdout import Evaluation, evaluate
from engine.training import OptimizerSettings, StepReport, Training


@dataclass(frozen=True)
class StepResult:
    """One committed step."""

    steps_done: int
    loss: float
    seconds: float
    memory_bytes: int | None  # the step's peak RSS beyond the process with the model loaded
    budget_bytes: int  # what the schedule allows it
    parts: dict[str, int]  # measured peak of activations, gradients and optimizer state
    energy_j: float | None


class Trainer:
    """Trains ``prepared.workload`` on ``data`` under ``prepared.schedule``; see the module docstring."""

    def __init__(self, config: AgentConfig, prepared: Prepared, data: LocalDataset, *, meter: Any = None,
                 store: CheckpointStore | None = None) -> None:
        self.config = config
        self.prepared = prepared
        self.data = data
        self.settings = OptimizerSettings.from_config(config.training)
        self.training = Training(prepared.workload, prepared.graph, prepared.segments, prepared.schedule,
                                 self.settings, config.swap_dir, meter=meter,
                                 tolerance_bytes=config.training.memory_tolerance,
                                 first_run_bytes=prepared.first_run_bytes)
        self.model = self.training.model
        self.loss_fn = prepared.workload.loss_fn
        self.store = store or CheckpointStore(config.device.state_dir / "checkpoints" / prepared.key)
        self.steps_done = 0
        self.position = (0, 0)  # (epoch, batch index) of the next step's first batch
        self.resumed: Loaded | None = None
        if not self.store.paths():  # the initial weights on disk, not in RAM: what a failed step starts over from
            self.checkpoint()

    def close(self) -> None:
        self.training.close()

    # -- checkpoints ---------------------------------------------------------------
    def restore(self) -> Loaded | None:
        """Continue from the newest readable checkpoint, if any; returns it."""
        self.store.remove_temporaries()
        loaded = self.store.load_latest()
        if loaded is None:
            return None
        state = loaded.state
        started_from = state.get("weights_sha256")
        if started_from != self.prepared.weights_sha256:  # another model's training: never mixed into this one
            configured = describe_weights(self.prepared.weights_sha256)
            raise CheckpointError(f"{loaded.path} continues training that started from "
                                  f"{describe_weights(started_from)}, but this workload starts from {configured}: "
                                  f"move {self.store.directory} aside to train from the configured weights")
        self.training.load_state({"model": state["model"], "optimizer": state["optimizer"]})
        self.steps_done = int(_value(state["steps_done"]))
        self.position = (int(state["position"][0]), int(state["position"][1]))
        torch.set_rng_state(_value(state["rng"]["torch"]))
        random.setstate(_python_rng(state["rng"]["python"]))
        self.resumed = loaded
        return loaded

    def checkpoint(self) -> float:
        """Write a checkpoint of the current state (streamed: no second copy in memory); returns its seconds."""
        started = time.perf_counter()
        self.store.save(self.steps_done, {
            **self.training.state(),
            "steps_done": self.steps_done,
            "position": list(self.position),
            "rng": {"torch": torch.get_rng_state(), "python": _python_rng_state()},
            "schedule_id": self.prepared.schedule.schedule_id,
            "weights_sha256": self.prepared.weights_sha256,  # what training started from
        })
        return time.perf_counter() - started

    # -- steps ------------------------------------------------------------------------
    def step(self, cancel: Callable[[], bool] | None = None) -> StepResult:
        """One training step on the next batches; a cancelled step raises and changes nothing.

        A step whose memory went over its plan was applied (its results are exact): it is counted, then
        :class:`~engine.errors.MemoryBoundError` propagates to stop the window.
        """
        positions = [self.position]
        for _ in range(self.settings.accumulation - 1):
            positions.append(self.data.position_after(*positions[-1]))
        batches = [self.data.batch(*p) for p in positions]
        try:
            report = self.training.step(batches, cancel)
        except UpdateInterrupted:
            self._start_over()
            raise
        except MemoryBoundError as exc:
            self._count(positions, exc.report)
            raise
        return self._count(positions, report)

    def _count(self, positions: list[tuple[int, int]], report: StepReport | None) -> StepResult:
        self.steps_done += 1
        self.position = self.data.position_after(*positions[-1])
        if report is None:
            return StepResult(self.steps_done, float("nan"), 0.0, None, self.prepared.schedule.memory_budget, {}, None)
        return StepResult(self.steps_done, report.loss, report.seconds, report.memory_bytes, report.budget_bytes,
                          report.parts, report.energy_j)

    def _start_over(self) -> None:
        """After a step that updated part of the model: the last checkpoint (step 0 at the least)."""
        if self.restore() is None:
            raise CheckpointError(f"a step failed after updating part of the model, and no checkpoint is left in "
                                  f"{self.store.directory} to restore it from (not even step 0's): the model is "
                                  "between two steps; remove the workload's state to train it from the start")

    def evaluate(self) -> Evaluation | None:
        """Loss and accuracy on the held-out data (``None`` without any); leaves the training state alone."""
        return evaluate(self.model, self.loss_fn, self.data)


def _value(value: Any) -> Any:
    """A value read from a checkpoint: a stored tensor is loaded, anything else is as it is."""
    return value.load() if hasattr(value, "load") else value


def _python_rng_state() -> list[Any]:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _python_rng(saved: list[Any]) -> tuple[Any, ...]:
    return saved[0], tuple(saved[1]), saved[2]
