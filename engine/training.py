"""The one training path: a device's model trained under its schedule, whoever asks for the steps.

A daemon's training window (:mod:`agent.daemon.trainer`) and a Flower round
(:mod:`agent.federated.task`) both build a :class:`Training` and call
:meth:`Training.step`.  It holds:

* the optimizer the config names (:class:`OptimizerSettings`: SGD with
  momentum, Nesterov and weight decay, Adam, AdamW; accumulation over
  micro-batches; clipping by global norm), its updates fused into the
  backward pass (:class:`~engine.optim.FusedOptimizer`) so gradients never
  all live at once, its state in RAM or on flash where the schedule says;
* the executor running the schedule, which must have been planned for the
  step's whole memory with this very optimizer (:meth:`Training.check_schedule`);
* the memory check: after every step each part the plan predicted --
  activations, gradients, optimizer state -- and the whole step's memory
  (peak RSS above the process with the model loaded) are held against it
  with a tolerance of fixed bytes (``tolerance_bytes``: not a share of the
  process, which for a large model would hide a whole part); a step over it
  raises :class:`~engine.errors.MemoryBoundError` naming the part.

Results are bit for bit those of plain ``loss.backward(); optimizer.step()``
with the same optimizer run per tensor (``foreach=False``), micro-batch
gradients summed (``clip_grad_norm_(foreach=False)`` before the step where
clipping is on).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from engine import allocator, rss
from engine.errors import MemoryBoundError, OptimizerError, ScheduleRefusedError, UpdateInterrupted
from engine.executor import Executor
from engine.optim import Clip, FusedOptimizer, StatePages
from engine.replay import RngState
from engine.workload import Workload
from schedules.graph import TrainingGraph
from schedules.schedule import Schedule
from schedules.step_memory import OPTIMIZERS, TrainingSpec, updates_by_rows
from common.units import format_bytes

DEFAULT_TOLERANCE_BYTES = 8 << 20
"""How far a measured part may exceed its prediction: page granularity, allocator slack and the interpreter's
own objects, the same for a small model as for a large one."""

Batch = tuple[Any, Any]


@dataclass(frozen=True)
class OptimizerSettings:
    """The optimizer a device trains with, as its config says (``[training]``)."""

    optimizer: str = "sgd"
    learning_rate: float = 0.01
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    accumulation: int = 1
    clip_norm: float = 0.0  # 0: no clipping

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise OptimizerError(f"optimizer {self.optimizer!r} unknown; use one of {', '.join(OPTIMIZERS)}")
        if self.accumulation < 1:
            raise OptimizerError(f"accumulation must be at least 1 micro-batch, got {self.accumulation}")
        if self.nesterov and (self.optimizer != "sgd" or self.momentum <= 0):
            raise OptimizerError("nesterov needs the sgd optimizer with momentum > 0")

    @classmethod
    def from_config(cls, training: Any) -> "OptimizerSettings":
        """From an agent config's ``[training]`` section."""
        return cls(training.optimizer, training.learning_rate, training.momentum, training.nesterov,
                   training.weight_decay, training.accumulation, training.clip_norm)

    def build(self, params: Sequence[torch.Tensor]) -> torch.optim.Optimizer:
        """The torch optimizer over ``params``, run per tensor (``foreach=False``)."""
        params = list(params)
        if self.optimizer == "sgd":
            return torch.optim.SGD(params, lr=self.learning_rate, momentum=self.momentum, nesterov=self.nesterov,
                                   weight_decay=self.weight_decay, foreach=False)
        kind = torch.optim.Adam if self.optimizer == "adam" else torch.optim.AdamW
        return kind(params, lr=self.learning_rate, weight_decay=self.weight_decay, foreach=False)

    @property
    def clip(self) -> Clip | None:
        return Clip(self.clip_norm) if self.clip_norm > 0 else None

    def spec(self, *, chunk_bytes: int = 0, state_paging: bool = True) -> TrainingSpec:
        """What the planner needs to know of this training (:mod:`schedules.step_memory`)."""
        return TrainingSpec.for_optimizer(self.optimizer, momentum=self.momentum, nesterov=self.nesterov,
                                          weight_decay=self.weight_decay, accumulation=self.accumulation,
                                          clip=self.clip_norm > 0, chunk_bytes=chunk_bytes, state_paging=state_paging)


@dataclass(frozen=True)
class StepReport:
    """One committed step: its loss and what it measured against the plan."""

    loss: float
    seconds: float
    memory_bytes: int | None  # peak RSS during the step above the process with the model loaded
    budget_bytes: int
    parts: dict[str, int]  # measured peak of each part the plan predicts (see Schedule.step.parts())
    energy_j: float | None
    peak_rss_bytes: int | None
    runtime_bytes: int = 0  # the plan's, for the tracked sum

    @property
    def tracked_bytes(self) -> int:
        """The parts the executor accounts for itself, summed at their peaks (with the runtime's planned share):
        the step's memory where RSS cannot tell one step from the rest of a shared process."""
        return sum(self.parts.values()) + self.runtime_bytes


class Training:
    """A model's training under its whole-step schedule; see the module docstring.

    Parameters
    ----------
    workload:
        The model (at the weights to train from), its example batch and loss.
    graph, segments:
        The model's training graph and cut (:func:`engine.extract.extract`).
    schedule:
        A schedule planned for ``graph`` for the step's whole memory with this optimizer.
    settings:
        The optimizer and its settings.
    swap_dir:
        Where activation and optimizer-state pages go.
    meter:
        Energy meter for the executor (optional).
    tolerance_bytes:
        How far a measured part may exceed its prediction before the step is refused.
    check_memory:
        Hold every step against the plan (off only for tests of what a violation looks like elsewhere).
    first_run_bytes:
        What the model's first run in this process (cutting it) left in the process's own memory
        (:func:`engine.rss.anonymous_growth_since`, read by the agent around the cut): a cache the model keeps,
        the libraries' caches and thread pools.  It counts in every step's memory, as the profile reserved it
        (``runtime_bytes``); each step's own is what it adds to the process as training is set up.
    """

    def __init__(self, workload: Workload, graph: TrainingGraph, segments: Any, schedule: Schedule,
                 settings: OptimizerSettings, swap_dir: str | Path, *, meter: Any = None,
                 tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES, check_memory: bool = True,
                 first_run_bytes: int = 0) -> None:
        self.check_schedule(schedule, settings)
        self.workload, self.graph, self.schedule, self.settings = workload, graph, schedule, settings
        self.model = workload.model
        self.tolerance_bytes = tolerance_bytes
        self.check_memory = check_memory
        rss.return_freed_memory()
        self.model.zero_grad(set_to_none=True)
        trained = _trained(self.model, graph)
        # built before the baseline: the first optimizer of a process imports PyTorch's compiler machinery
        # (about 100 MB of code and module state, once), which is the process's, not a step's; the optimizer
        # itself holds no state yet
        self.optimizer = settings.build([p for _, p, _, _ in trained])
        allocator.release_cache()  # blocks an earlier step of this process left cached are not this model's
        self.baseline_rss = _settled_rss()  # the process with the model loaded: what training adds is above it
        self.first_run_bytes = first_run_bytes  # ... and what the model's first run left before that counts too
        on_flash = schedule.step.state_on_flash
        self.pages = StatePages(swap_dir) if on_flash else None
        try:
            self.fused = FusedOptimizer(self.optimizer, trained, chunk_bytes=schedule.step.training.chunk_bytes,
                                        accumulation=settings.accumulation, clip=settings.clip, paged=on_flash,
                                        pages=self.pages, tables=_tables(self.model, graph, schedule))
            self.executor = Executor(self.model, segments, graph, schedule, swap_dir, meter=meter,
                                     measure_rss=False, updates=self.fused)
        except BaseException:
            if self.pages is not None:
                self.pages.close()
            raise

    @staticmethod
    def check_schedule(schedule: Schedule, settings: OptimizerSettings) -> None:
        """Refuse a schedule not planned for the step's whole memory with this optimizer."""
        if schedule.step is None or schedule.memory_budget is None:
            raise ScheduleRefusedError(
                f"schedule {schedule.schedule_id} budgets activations only"
                + ("" if schedule.memory_budget is not None else " and has no memory budget")
                + ": a device trains only under a schedule planned for the step's whole memory (activations, "
                  "gradients, optimizer state); plan one with `poet-edge solve --optimizer ...` or let the agent "
                  "solve locally")
        planned, wanted = schedule.step.training, settings.spec()
        differences = [f"{name} {getattr(planned, name)!r} (configured {getattr(wanted, name)!r})"
                       for name in ("optimizer", "state_tensors", "update_temporaries", "accumulation", "clip")
                       if getattr(planned, name) != getattr(wanted, name)]
        if differences:
            raise ScheduleRefusedError(f"schedule {schedule.schedule_id} was planned for other training: "
                                       + ", ".join(differences) + "; plan it again for this optimizer")

    # -- steps -------------------------------------------------------------------------
    def step(self, batches: Sequence[Batch], cancel: Callable[[], bool] | None = None) -> StepReport:
        """One optimizer step over ``batches`` (one per micro-batch); returns what it measured.

        A step cancelled or failing before its first update changes nothing (the error propagates); one
        failing after raises :class:`~engine.errors.UpdateInterrupted`; one whose memory went over the plan
        raises :class:`~engine.errors.MemoryBoundError` after it was applied (its results are exact).
        """
        if len(batches) != self.settings.accumulation:
            raise OptimizerError(f"a step takes {self.settings.accumulation} micro-batches, got {len(batches)}")
        self.model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        before = rss.start_window()
        snapshot = _StepStart(self.model) if len(batches) > 1 else None  # the executor restores one micro-batch
        self.fused.begin_step()
        losses, activations, energy = [], 0, 0.0
        try:
            for i, (inputs, targets) in enumerate(batches):
                self.fused.begin_micro_batch(last=i == len(batches) - 1)
                losses.append(float(self.executor.step(inputs, targets, cancel)))
                stats = self.executor.last_stats
                activations = max(activations, stats.peak_with_inflight_bytes)
                energy += stats.energy.total_joules if stats.energy is not None else float("nan")
            self.fused.finish_step()
        except UpdateInterrupted:
            raise
        except BaseException as exc:
            if self.fused.started:
                raise UpdateInterrupted(f"the step failed while applying its updates ({exc}); the model is "
                                        "between two steps: restore it from the last checkpoint") from exc
            self.fused.discard_step()
            if snapshot is not None:
                snapshot.restore()
            raise
        if self.pages is not None:
            self.pages.flush()  # the step's state is on flash before it counts as done
        peak = rss.peak_since_start()
        memory = None if peak is None or before is None else peak - self.baseline_rss + self.first_run_bytes
        parts = {"activations": activations, "gradients": self.fused.peak_grad_bytes,
                 "optimizer state": self.fused.resident_state_bytes}
        report = StepReport(sum(losses) / len(losses), time.perf_counter() - started, memory,
                            self.schedule.memory_budget, parts, None if energy != energy else energy, peak,
                            self.schedule.step.runtime_bytes)
        if self.check_memory:
            self._check(report)
        return report

    def _check(self, report: StepReport) -> None:
        """Each part and the whole step against the plan; the first over it names itself."""
        predicted, tolerance = self.schedule.step.parts(), self.tolerance_bytes
        over = [(name, value, predicted[name]) for name, value in report.parts.items()
                if value > predicted[name] + tolerance]
        if over:
            name, value, planned = over[0]
            raise MemoryBoundError(
                f"{name} peaked at {format_bytes(value)}, over the {format_bytes(planned)} the schedule planned "
                f"(+ {format_bytes(tolerance)} tolerance): the step was applied, training stops; the model or data "
                "differ from what the graph was profiled with: profile it again", part=name, report=report)
        budget = self.schedule.memory_budget
        if report.memory_bytes is not None and report.memory_bytes > budget + tolerance:
            tracked = sum(report.parts.values()) + self.schedule.step.runtime_bytes
            raise MemoryBoundError(
                f"the step took {format_bytes(report.memory_bytes)} beyond the loaded model, over its budget of "
                f"{format_bytes(budget)} (+ {format_bytes(tolerance)}), while activations, gradients and optimizer "
                f"state stayed within their plan ({format_bytes(tracked)} at most together): the rest is memory "
                "outside them -- the model's own code or a library keeping memory across steps, or another "
                "thread of this process; the step was applied, training stops", part="other", report=report)

    # -- state --------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Model and optimizer state for a checkpoint; optimizer state on flash as chunked sources."""
        groups = self.optimizer.state_dict()["param_groups"]
        return {"model": self.model.state_dict(),
                "optimizer": {"state": self.fused.state_sources(), "param_groups": groups}}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state` saved (tensors in memory, or stored in a checkpoint file: read in place)."""
        own = self.model.state_dict()
        missing = sorted(set(own) - set(state["model"]))
        if missing:
            raise ScheduleRefusedError(f"the checkpoint lacks {missing[:3]}: it is another model's")
        with torch.no_grad():
            for name, target in own.items():
                value = state["model"][name]
                if isinstance(value, torch.Tensor):
                    target.copy_(value)
                else:
                    value.load_into(target)
        self.fused.load_state_dict(state["optimizer"])

    def close(self) -> None:
        self.executor.close()
        self.fused.close()
        if self.pages is not None:
            self.pages.close()


class _StepStart:
    """Buffers and RNG at the start of a step of several micro-batches: a failure rolls back to here."""

    def __init__(self, model: torch.nn.Module) -> None:
        with torch.no_grad():
            self.buffers = [(b, b.clone()) for b in model.buffers()]
        self.rng = RngState.capture()

    def restore(self) -> None:
        with torch.no_grad():
            for buffer, saved in self.buffers:
                buffer.copy_(saved)
        self.rng.restore()


def _trained(model: torch.nn.Module, graph: TrainingGraph) -> list[tuple[str, torch.Tensor, int, bool]]:
    """The graph's parameter layout matched to the model's parameters."""
    named = dict(model.named_parameters())
    layout = []
    for p in graph.parameters:
        param = named.get(p.name)
        if param is None or param.nbytes != p.bytes:
            raise ScheduleRefusedError(f"the graph's parameter {p.name!r} ({p.bytes:,} B) is not this model's: "
                                       "profile the model again")
        layout.append((p.name, param, len(p.nodes), p.streamed))
    trained = {name for name, p in named.items() if p.requires_grad}
    untracked = sorted(trained - {p.name for p in graph.parameters})
    if untracked:
        raise ScheduleRefusedError(f"parameters {untracked[:3]} are trained but not in the graph's parameter "
                                   "layout (they get no gradient in the profiled step): freeze them "
                                   "(requires_grad=False) or profile the model again")
    return layout


def _tables(model: torch.nn.Module, graph: TrainingGraph, schedule: Schedule) -> dict[int, torch.nn.Module]:
    """The embedding tables the plan updates by rows (:func:`schedules.step_memory.updates_by_rows`), each with
    the module that looks it up."""
    spec, on_flash = schedule.step.training, set(schedule.step.state_on_flash)
    owners = {id(m.weight): m for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    named = dict(model.named_parameters())
    tables = {}
    for index, p in enumerate(graph.parameters):
        if index in on_flash and updates_by_rows(p, spec):
            module = owners.get(id(named[p.name]))
            if module is None:
                raise ScheduleRefusedError(f"the graph updates {p.name!r} by rows as an embedding table, but no "
                                           "nn.Embedding of this model owns it: profile the model again")
            tables[index] = module
    return tables


def _settled_rss() -> int:
    """The process's resident set with freed heap given back: the baseline training memory is measured from."""
    rss.trim_heap()
    current = rss.current()
    return current if current is not None else 0
