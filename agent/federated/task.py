"""What a federated round asks of a device, with no Flower in it: train under the device's schedule, evaluate.

:class:`Task` holds one model, its training graph and segments (extracted once
per process), the optimizer it trains with (:class:`engine.training.OptimizerSettings`:
a device agent's configured one, else SGD with momentum 0.9) and the POET
schedules planned for the step's whole memory, one per device profile and
memory budget (planned once, then cached).  :meth:`Task.train` loads the
weights it is given and runs ``steps`` optimizer steps through the one
training path (:class:`engine.training.Training`: updates in the backward
pass, every step checked against the plan part by part) on the device's
:class:`agent.data.LocalDataset`, and returns the new weights with what the
steps measured.  The schedule changes where memory goes, never the
arithmetic: with the same weights, data and seed the trained weights are
bit-identical under every budget (the executor's parity guarantee).

What a device keeps or trains for itself is its personalization strategy's
(:mod:`agent.personalization`); :mod:`agent.federated.clientapp` applies it.

Every report carries the same keys (:data:`METRIC_KEYS`, -1 where unknown):
FedAvg refuses a round whose replies differ in keys.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from agent.data import LocalDataset
from agent.errors import FederationError
from agent.holdout import evaluate
from engine.training import DEFAULT_TOLERANCE_BYTES, OptimizerSettings, Training
from agent.zoo import Workload
from schedules.device import DeviceProfile
from schedules.graph import TrainingGraph
from schedules.schedule import Schedule

UNKNOWN = -1
METRIC_KEYS = ("num-examples", "train-loss", "eval-loss", "accuracy", "steps", "peak-bytes", "budget-bytes",
               "energy-j", "seconds", "startup-seconds")
PLAN_TIME_LIMIT = 30.0  # seconds for one schedule; the digits model's MILP takes well under one
ROUND_OPTIMIZER = OptimizerSettings("sgd", learning_rate=0.05, momentum=0.9)
"""What a simulated device trains with; a device agent's rounds use its own ``[training]`` settings."""


def _keep_on_disk(weights: dict[str, torch.Tensor], folder: Path) -> Path:
    """``weights`` saved in ``folder``, named by their content: a forked ClientApp (which leaves without running
    exit handlers) finds the same file again instead of leaving one more behind, and two models never share one."""
    digest = hashlib.sha256()
    for name, tensor in weights.items():  # torch.save's bytes differ run to run (a serialization id): hash these
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())  # no copy
    path = folder / f"initial-{digest.hexdigest()[:16]}.pt"
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=".initial-", suffix=".pt", dir=folder)
    os.close(handle)
    written = Path(name)
    try:
        torch.save(weights, written)
        os.replace(written, path)  # atomic: a process reading the same file keeps its own mapping
    finally:
        written.unlink(missing_ok=True)
    return path


def metric_values(**known: float) -> dict[str, float]:
    """Every key of :data:`METRIC_KEYS`, ``-1`` where not given; unknown keys are refused."""
    extra = set(known) - set(METRIC_KEYS)
    if extra:
        raise FederationError(f"unknown metric keys {sorted(extra)}; every device must send exactly {METRIC_KEYS}")
    return {key: float(known.get(key, UNKNOWN)) for key in METRIC_KEYS}


@dataclass(frozen=True)
class DevicePlan:
    """A device's schedule and what it was planned for: the step's whole memory within ``budget_bytes``."""

    profile: str
    budget_bytes: int | None  # None: no limit (the plain step's whole memory)
    schedule: Schedule


@dataclass(frozen=True)
class TrainOutcome:
    """What :meth:`Task.train` did: the new weights and the measured figures."""

    weights: dict[str, torch.Tensor]
    loss: float
    steps: int
    examples: int
    peak_bytes: int  # the largest step memory: peak RSS beyond the process with the model loaded (or, where RSS
    #                  cannot tell, the parts the executor accounted for)
    seconds: float
    energy_j: float
    position: tuple[int, int]


@dataclass
class Task:
    """One model's graph, segments and schedules in this process; see the module docstring.

    Without ``graph`` (and ``segments``) the workload is extracted here, timing each node once; with a
    ``graph`` alone (a simulation's, profiled once for the whole fleet) the model is cut as it says, timing
    nothing; a device agent passes the graph it profiled and cut (:func:`agent.prepare.prepare`) and
    adopts the schedule it already holds.
    """

    workload: Workload
    swap_dir: Path | None = None
    graph: TrainingGraph | None = None
    segments: Any = None
    settings: OptimizerSettings = ROUND_OPTIMIZER
    tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES
    _plans: dict[tuple[str, int | None], DevicePlan] = field(default_factory=dict, init=False, repr=False)
    _warmed_in: int = field(default=0, init=False, repr=False)  # the process that ran the warm-up step

    def __post_init__(self) -> None:
        self.model = self.workload.model
        if self.swap_dir is None:
            self.swap_dir = Path(tempfile.mkdtemp(prefix="poet-fed-swap-"))
            atexit.register(shutil.rmtree, self.swap_dir, True)  # ours: gone with the process
        self._initial_file = _keep_on_disk(self.model.state_dict(), Path(self.swap_dir))
        if self.graph is None:
            from engine.extract import extract

            # one timing repeat: the planner needs node times, which barely move a model this small; the fleet's
            # digits CNN keeps the default cut, as simulations profile it (simulation/profile.py)
            self.graph, self.segments = extract(self.model, self.workload.example, self.workload.loss_fn,
                                                repeats=1, segments=self.workload.segments, refine=False)
            self.model.load_state_dict(self.initial)  # extraction ran the model: start from the seeded weights
        elif self.segments is None:
            from engine.extract import segments_matching

            self.segments = segments_matching(self.workload, self.graph)
            self.model.load_state_dict(self.initial)

    @property
    def initial(self) -> dict[str, torch.Tensor]:
        """The model's seeded initial weights, mapped from their copy on disk: the process holds one model in
        RAM, and these pages only while they are read (file-backed, so the kernel can drop them)."""
        return torch.load(self._initial_file, mmap=True, weights_only=True)

    @property
    def plain_peak_bytes(self) -> int:
        """The whole memory of a plain step (store-all, optimizer state in RAM): what budget fractions are
        fractions of."""
        from schedules.budgets import store_all_peak

        return store_all_peak(self.graph, self.settings.spec())

    def budget_for(self, fraction: float | None) -> int | None:
        """``fraction`` of the plain peak in bytes; ``None`` or 1 or more means no limit."""
        return None if fraction is None or fraction >= 1 else int(fraction * self.plain_peak_bytes)

    def adopt(self, plan: DevicePlan) -> DevicePlan:
        """Use ``plan`` (a schedule obtained elsewhere, for this model's graph) for its profile and budget."""
        plan.schedule.check_graph(self.graph)
        Training.check_schedule(plan.schedule, self.settings)
        self._plans[(plan.profile, plan.budget_bytes)] = plan
        return plan

    def plan(self, profile: str, budget_bytes: int | None) -> DevicePlan:
        """The POET schedule for a step of ``profile`` (a built-in device name) within ``budget_bytes`` of
        whole memory (``None``: the plain step's), cached."""
        from schedules.plan import plan

        key = (profile, budget_bytes)
        if key not in self._plans:
            device = DeviceProfile.builtin(profile)
            spec = self.settings.spec()
            budget = budget_bytes if budget_bytes is not None else self.plain_peak_bytes
            result = plan(self.graph, device, memory_budget=budget, method="poet" if budget_bytes else "store-all",
                          time_limit=PLAN_TIME_LIMIT, training=spec)
            if not result.feasible or result.schedule is None:
                from schedules.budgets import memory_lower_bound

                raise FederationError(
                    f"no schedule fits a step of this model in {budget_bytes:,} B on {profile} (a plain step takes "
                    f"{self.plain_peak_bytes:,} B, none fits below {memory_lower_bound(self.graph, spec):,} B): "
                    "raise the device's budget")
            self._plans[key] = DevicePlan(profile, budget_bytes, result.schedule)
        return self._plans[key]

    def train(self, weights: dict[str, torch.Tensor], data: LocalDataset, device: DevicePlan, *, steps: int,
              lr: float | None = None, position: tuple[int, int] = (0, 0), check_memory: bool = True,
              anchor: dict[str, torch.Tensor] | None = None, prox: float = 0.0) -> TrainOutcome:
        """``steps`` optimizer steps from ``weights`` on ``data`` through the one training path under
        ``device.schedule``; ``lr`` (the round's) replaces the settings' learning rate.  A fresh optimizer each
        round: its state does not carry over between rounds.

        With an ``anchor`` (Ditto's global model) each step is followed by a proximal step pulling every trained
        parameter towards it, ``p -= lr * prox * (p - anchor)``: the gradient of ``prox / 2 * ||p - anchor||^2``
        applied decoupled from the data term's update, as AdamW decouples weight decay, so the data term's
        gradients stay exactly the executor's."""
        if check_memory:
            self._warm_up(device, data)
        self.model.load_state_dict(weights)
        self.model.train()
        settings = self.settings if lr is None else replace(self.settings, learning_rate=lr)
        started, losses, peak, energy = time.perf_counter(), [], 0, 0.0
        training = Training(self.workload, self.graph, self.segments, device.schedule, settings, self.swap_dir,
                            tolerance_bytes=self.tolerance_bytes, check_memory=check_memory)
        try:
            for _ in range(steps):
                batches = []
                for _ in range(settings.accumulation):
                    batches.append(data.batch(*position))
                    position = data.position_after(*position)
                report = training.step(batches)
                if anchor is not None and prox:
                    self._pull_towards(anchor, settings.learning_rate * prox)
                losses.append(report.loss)
                # what RSS says the step took; where it cannot tell (no /proc, or a process shared with other
                # virtual devices whose memory came and went), what the executor accounted for
                measured = report.memory_bytes if report.memory_bytes and report.memory_bytes > 0 else None
                peak = max(peak, measured or report.tracked_bytes)
                energy += report.energy_j if report.energy_j is not None else device.schedule.predicted_energy_j
        finally:
            training.close()
        self.model.zero_grad(set_to_none=True)
        weights_out = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return TrainOutcome(weights_out, sum(losses) / max(len(losses), 1), steps,
                            steps * settings.accumulation * data.batch_size, peak, time.perf_counter() - started,
                            energy, position)

    @torch.no_grad()
    def _pull_towards(self, anchor: dict[str, torch.Tensor], rate: float) -> None:
        for name, param in self.model.named_parameters():
            if param.requires_grad:
                param.lerp_(anchor[name], rate)  # p + rate * (anchor - p): no temporary as big as p

    def _warm_up(self, device: DevicePlan, data: LocalDataset) -> None:
        """Once per process, one training step unchecked and undone (the RNG restored; the caller loads its
        weights).  A process's first step maps in the code it runs and allocates caches once: memory of the
        process, not of a step.  A ClientApp forked from the warm runner faults its shared libraries' pages in
        anew, about 20 MB of RSS that its first step's memory check would count."""
        if self._warmed_in == os.getpid():
            return
        self._warmed_in = os.getpid()
        rng = torch.get_rng_state()
        self.train(self.initial, data, device, steps=1, check_memory=False)
        torch.set_rng_state(rng)

    def evaluate(self, weights: dict[str, torch.Tensor], data: LocalDataset) -> tuple[float, float, int]:
        """``(loss, accuracy, samples)`` of ``weights`` on ``data``'s held-out samples (eval mode); accuracy
        is -1 for regression targets, and both are -1 without held-out samples."""
        self.model.load_state_dict(weights)
        result = evaluate(self.model, self.workload.loss_fn, data)
        if result is None:
            return float(UNKNOWN), float(UNKNOWN), 0
        return result.loss, float(UNKNOWN) if result.accuracy is None else result.accuracy, result.samples
