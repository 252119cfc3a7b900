"""A training step's whole memory: what a plan budgets beside the activations.

POET's MILP bounds the activations a step keeps in RAM.  A device has one
budget for everything its training adds to the loaded model, so a plan for a
device (``plan(..., training=TrainingSpec(...))``) also fits, beside the
activations:

* **the runtime's own memory** (``graph.runtime_bytes``, measured at
  profiling): the same at every stage;
* **gradients**.  With the optimizer update fused into the backward pass, a
  parameter's gradient lives only while the backward node that makes it final
  runs, and is applied and freed there: it is part of that node's measured
  workspace.  Beyond that, a tied parameter's gradient lives from its first
  contribution to its last; with clipping by global norm every gradient lives
  from its last contribution to the end of the backward pass (the norm needs
  them all before any update); with accumulation over micro-batches every
  gradient lives through the whole step.  The gradients a node makes are held
  beside its workspace while it computes (a streamed weight's a column block
  at a time);
* **the update's transient memory**: updates run chunk by chunk
  (``chunk_bytes`` of a parameter at a time: the update is elementwise), each
  making ``update_temporaries`` chunk-sized temporaries, and, for state on
  flash, :data:`READ_AHEAD_CHUNKS` chunks being read ahead, one being updated
  and :data:`WRITE_BEHIND_CHUNKS` being written behind.  It is added to the workspace of the node where the update
  runs;
* **optimizer state** (momentum, Adam's moments): each :class:`StateGroup`
  either stays in RAM for the whole step or lives in page files on flash and
  is read and written chunk by chunk at its update, which costs the paging's
  energy and I/O time every step.  The update of state on flash runs in the
  background (the agent's :mod:`engine.optim.background`) while the next
  backward node computes, so its gradients and its transient are held one
  stage longer (``StateGroup.behind_bytes``); a streamed weight's update runs
  in the background from its node to the end of the backward pass, holding the
  gradient's two factors (``Parameter.stream_bytes``) and one block at a time
  (``StateGroup.late``).  An embedding table whose gradient is zero outside
  the rows a step looks up (``Parameter.rows``, :func:`updates_by_rows`)
  has the update of every other row run in the background from its lookup
  on (their gradient is known to be zero then), holding a pass's chunks
  from the lookup's forward node to the end of the step, and the rows it
  looked up updated last; their state is kept in RAM until the next step's
  pass writes it to flash (``StateGroup.overlay_bytes``, resident at every
  stage).  The MILP decides group by group
  (:mod:`schedules.milp.formulation`); the schedule records which parameters'
  state is on flash.

:class:`StepMemory` is that accounting for one graph and spec;
:class:`StepLayout` adds the decision of which groups are on flash and is
what the simulator replays.  Nothing here imports torch: the fleet server
plans whole steps too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Iterable

from common.canonical import finite_number
from schedules.errors import FormatError, PlannerError
from schedules.graph import Parameter, TrainingGraph

OPTIMIZERS = ("sgd", "adam", "adamw")

MIN_CHUNK_BYTES = 64 << 10
MAX_CHUNK_BYTES = 4 << 20
CHUNKS_PER_BUDGET = 256
"""Without an explicit ``chunk_bytes`` a plan updates in chunks of about 1/256 of its budget (within
64 KiB..4 MiB): small enough that the update's transient stays a few percent of the budget, large
enough that per-chunk overheads (a page read and written, a few kernel calls) stay small."""

READ_AHEAD_CHUNKS = 2
WRITE_BEHIND_CHUNKS = 2
"""Optimizer-state chunks on flash in RAM beside the one being updated: read ahead of their update, and
written behind it (the agent's :mod:`engine.optim.state_pages` keeps to these)."""

GROUP_MIN_BYTES = 1 << 20
"""Optimizer state of a parameter at least this large is paged (or kept) on its own; smaller ones are
decided together with the others updated at the same node."""


@dataclass(frozen=True)
class TrainingSpec:
    """How a step trains, as far as its memory is concerned.

    ``state_tensors`` is the optimizer's parameter-sized state per parameter
    (SGD 0, with momentum 1, Adam and AdamW 2, AMSGrad 3); ``update_temporaries``
    the chunk-sized temporaries one update of one chunk holds at once
    (:meth:`for_optimizer` knows PyTorch's).  ``chunk_bytes`` 0 lets the plan
    choose (:func:`chunk_for`).  ``state_paging`` False keeps all optimizer
    state in RAM.
    """

    optimizer: str = "sgd"
    state_tensors: int = 0
    update_temporaries: int = 0
    accumulation: int = 1
    clip: bool = False
    chunk_bytes: int = 0
    state_paging: bool = True

    def __post_init__(self) -> None:
        problems = []
        if self.optimizer not in OPTIMIZERS:
            problems.append(f"optimizer {self.optimizer!r} unknown (one of {', '.join(OPTIMIZERS)})")
        if not 0 <= self.state_tensors <= 8 or not 0 <= self.update_temporaries <= 8:
            problems.append("state_tensors and update_temporaries must be between 0 and 8")
        if self.accumulation < 1:
            problems.append(f"accumulation must be at least 1 micro-batch, got {self.accumulation}")
        if self.chunk_bytes < 0:
            problems.append(f"chunk_bytes must be >= 0, got {self.chunk_bytes}")
        if problems:
            raise PlannerError("training spec: " + "; ".join(problems))

    @classmethod
    def for_optimizer(cls, optimizer: str, *, momentum: float = 0.0, nesterov: bool = False,
                      weight_decay: float = 0.0, amsgrad: bool = False, accumulation: int = 1, clip: bool = False,
                      chunk_bytes: int = 0, state_paging: bool = True) -> "TrainingSpec":
        """The spec for one of PyTorch's optimizers run per tensor (``foreach=False``).

        Temporaries of one update, from PyTorch's single-tensor code: SGD makes
        one for weight decay (``grad + wd * param``) and one for Nesterov;
        Adam's ``exp_avg_sq.sqrt() / bias_correction`` holds two at once, and
        Adam (not AdamW) one more for weight decay.
        """
        if optimizer == "sgd":
            state, temporaries = (1 if momentum else 0), int(weight_decay != 0) + int(bool(nesterov))
        elif optimizer in ("adam", "adamw"):
            state = 3 if amsgrad else 2
            temporaries = 2 + int(optimizer == "adam" and weight_decay != 0)
        else:
            raise PlannerError(f"optimizer {optimizer!r} unknown; use one of {', '.join(OPTIMIZERS)}")
        return cls(optimizer, state, temporaries, accumulation, clip, chunk_bytes, state_paging)

    @property
    def update_kind(self) -> str:
        """What an update's cost depends on, as a device profile's ``update_costs`` keys it:
        ``optimizer:state_tensors:update_temporaries`` (``sgd:1:0`` is SGD with momentum)."""
        return f"{self.optimizer}:{self.state_tensors}:{self.update_temporaries}"

    def with_chunk_for(self, budget: float | None) -> "TrainingSpec":
        """This spec with ``chunk_bytes`` chosen for ``budget`` where it was left to the plan."""
        return self if self.chunk_bytes else replace(self, chunk_bytes=chunk_for(budget))

    def describe(self) -> str:
        """One line for people: ``adamw (2 state tensors), 4 micro-batches, clipped, chunks of 256 KiB``."""
        parts = [f"{self.optimizer} ({self.state_tensors} state tensor{'s' if self.state_tensors != 1 else ''})"]
        if self.accumulation > 1:
            parts.append(f"{self.accumulation} micro-batches")
        if self.clip:
            parts.append("gradients clipped by global norm")
        if self.chunk_bytes:
            parts.append(f"updates in chunks of {self.chunk_bytes:,} B")
        if not self.state_paging:
            parts.append("optimizer state kept in RAM")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer, "state_tensors": self.state_tensors,
                "update_temporaries": self.update_temporaries, "accumulation": self.accumulation,
                "clip": self.clip, "chunk_bytes": self.chunk_bytes, "state_paging": self.state_paging}

    @classmethod
    def from_dict(cls, d: Any) -> "TrainingSpec":
        if not isinstance(d, dict):
            raise FormatError("training must be an object")
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise FormatError(f"training has unknown field(s) {', '.join(unknown)}")
        for flag in ("clip", "state_paging"):
            if not isinstance(d.get(flag, False), bool):
                raise FormatError(f"training.{flag} must be true or false")
        if not isinstance(d.get("optimizer"), str):
            raise FormatError("training.optimizer must be a string")
        try:
            return cls(optimizer=d["optimizer"], state_tensors=_whole(d, "state_tensors"),
                       update_temporaries=_whole(d, "update_temporaries"), accumulation=_whole(d, "accumulation", 1),
                       clip=d.get("clip", False), chunk_bytes=_whole(d, "chunk_bytes"),
                       state_paging=d.get("state_paging", True))
        except PlannerError as exc:
            raise FormatError(str(exc)) from exc


def _whole(d: dict[str, Any], key: str, default: int = 0) -> int:
    value = finite_number(d.get(key, default), f"training.{key}")
    if value != int(value):
        raise FormatError(f"training.{key} must be a whole number, got {value!r}")
    return int(value)


def chunk_for(budget: float | None) -> int:
    """The update chunk for a step budget: about 1/256 of it, within 64 KiB..4 MiB, a multiple of 4 KiB."""
    if budget is None:
        return MAX_CHUNK_BYTES
    chunk = min(max(int(budget) // CHUNKS_PER_BUDGET, MIN_CHUNK_BYTES), MAX_CHUNK_BYTES)
    return chunk - chunk % 4096


@dataclass(frozen=True)
class StateGroup:
    """Optimizer state decided together: resident for the whole step, or on flash.

    On flash, its update runs in the background during the stage after ``node``: its gradients
    (``grad_bytes``) and the update's transient wait into that stage (``behind_bytes`` in all).  A ``late``
    group (a streamed weight's) is updated in the background any time from ``node`` to the end of the step:
    what it holds is held over all those stages.  A table updated by rows (:func:`updates_by_rows`) is late,
    and also holds ``lookup_bytes`` from its ``lookup`` forward node on (the pass over the rows not looked
    up) and ``overlay_bytes`` at every stage (the looked-up rows' state between two steps).
    """

    parameters: tuple[int, ...]  # indices into graph.parameters
    bytes: int
    node: int  # the backward node whose computation updates them
    grad_bytes: int = 0
    behind_bytes: int = 0
    late: bool = False
    lookup: int = -1  # a table updated by rows: the forward node its update starts at
    lookup_bytes: int = 0
    overlay_bytes: int = 0

    def holds_at(self, stage: int) -> bool:
        """Whether this group's background update (once on flash) holds ``behind_bytes`` at ``stage``."""
        if self.lookup >= 0:  # a table's gradient is whole from its node on (made there: its workspace)
            return self.node < stage
        return self.node <= stage if self.late else stage == self.node + 1

    def held_at(self, stage: int) -> int:
        """What its background updates hold at ``stage`` once it is on flash, its overlay left out."""
        held = self.behind_bytes if self.holds_at(stage) else 0
        return held + (self.lookup_bytes if 0 <= self.lookup <= stage else 0)

    @property
    def start(self) -> int:
        """The first stage whose computation its background update may run beside."""
        return self.lookup if self.lookup >= 0 else self.node + 1


def updates_by_rows(p: Parameter, spec: TrainingSpec) -> bool:
    """Whether ``p``'s update, with its state on flash, runs by rows (:mod:`engine.optim.rows`): an embedding
    table looked up by fewer rows than it has, alone in its state group, with updates in the backward pass."""
    return (p.rows > 0 and p.row_bytes > 0 and p.rows * p.row_bytes < p.bytes and spec.accumulation == 1
            and not spec.clip and spec.state_paging and p.bytes * spec.state_tensors >= GROUP_MIN_BYTES)


@dataclass(frozen=True)
class StepMemory:
    """What one graph's step holds beside activations under one :class:`TrainingSpec`.

    ``constant_bytes`` is held at every stage (runtime, plus every gradient
    under accumulation); ``stage_bytes[t]`` is gradient memory held at stage
    ``t`` beyond that; ``update_bytes[i]`` is what node ``i`` holds beside its
    (measured, activation-only) workspace while it computes: the parameter
    gradients it makes, and the largest update's transient; optimizer state is
    in ``groups``.
    """

    graph: TrainingGraph
    spec: TrainingSpec
    runtime_bytes: int
    gradient_bytes: int  # of constant_bytes: gradients held through the whole step (accumulation)
    stage_bytes: tuple[int, ...]
    update_bytes: tuple[int, ...]  # per node: the update transient added to its workspace
    gradient_peaks: tuple[int, ...]  # per node: the most gradient bytes live while it computes
    groups: tuple[StateGroup, ...]

    @classmethod
    def build(cls, graph: TrainingGraph, spec: TrainingSpec) -> "StepMemory":
        """The accounting of ``graph``'s step under ``spec`` (``spec.chunk_bytes`` must be set)."""
        if not graph.parameters:
            raise PlannerError(
                f"graph of {graph.model or 'this model'} has no parameter layout, so a plan cannot budget the "
                "step's gradients and optimizer state: extract it again with this release "
                "(`poet-edge profile`), or plan its activations alone (no training spec)")
        if spec.chunk_bytes <= 0:
            raise PlannerError("the training spec's chunk_bytes is not set: call spec.with_chunk_for(budget)")
        T = graph.size
        fused = spec.accumulation == 1 and not spec.clip
        stage = [0] * T
        update = [0] * T
        peaks = [0] * T
        held_all = spec.accumulation > 1
        last_backward = max(graph.backward_nodes, default=T - 1)
        made = [0] * T  # per node: the gradients it makes (measured workspaces leave parameter gradients out)
        for p in graph.parameters:
            chunk = p.chunk_bytes(spec.chunk_bytes)
            in_flight = READ_AHEAD_CHUNKS + 1 + WRITE_BEHIND_CHUNKS if spec.state_paging else 0
            transient = chunk * (spec.update_temporaries + in_flight * spec.state_tensors)
            streamed = p.streamed and fused and len(p.nodes) == 1
            for node in p.nodes:  # a streamed weight's gradient exists a column block at a time
                made[node] += chunk if streamed else p.bytes
            update[p.last] = max(update[p.last], transient)
            if held_all:
                continue
            if spec.clip:  # held from its first contribution to the end of backward, where updates run
                for t in range(p.first + 1, T):
                    stage[t] += p.bytes
                update[last_backward] = max(update[last_backward], transient)
            elif len(p.nodes) > 1:  # tied: held from its first contribution to its last
                for t in range(p.first + 1, p.last + 1):
                    stage[t] += p.bytes
        gradient_bytes = graph.parameter_bytes if held_all else 0
        for t in range(T):
            peaks[t] = gradient_bytes + stage[t] + made[t]
            update[t] += made[t]
        return cls(graph, spec, graph.runtime_bytes, gradient_bytes, tuple(stage), tuple(update), tuple(peaks),
                   _groups(graph, spec))

    @property
    def constant_bytes(self) -> int:
        """Held at every stage: the runtime's own memory, and gradients held through the whole step."""
        return self.runtime_bytes + self.gradient_bytes

    @cached_property
    def state_bytes(self) -> int:
        """All optimizer state, resident or not."""
        return sum(g.bytes for g in self.groups)

    def layout(self, state_on_flash: Iterable[int] = (), costs: "StateCosts | None" = None) -> "StepLayout":
        """This accounting with the groups ``state_on_flash`` (indices into ``groups``) paged; ``costs`` price
        the paging for the simulator's energy and I/O time."""
        return StepLayout(self, frozenset(state_on_flash), costs)

    def layout_for_parameters(self, parameters: Iterable[int], costs: "StateCosts | None" = None) -> "StepLayout":
        """The layout whose paged groups are exactly the ones holding ``parameters`` (a schedule's list).

        Raises :class:`PlannerError` when the list splits a group or names state the spec has none of.
        """
        wanted = set(parameters)
        on_flash = {k for k, g in enumerate(self.groups) if wanted & set(g.parameters)}
        covered = {p for k in on_flash for p in self.groups[k].parameters}
        if covered != wanted:
            raise PlannerError(f"optimizer state on flash names parameters {sorted(wanted - covered)[:5] or sorted(covered - wanted)[:5]} "
                               "that do not make whole state groups of this graph and optimizer")
        return self.layout(on_flash, costs)

    def all_on_flash(self, costs: "StateCosts | None" = None) -> "StepLayout":
        """Every group paged (the least memory, where paging is allowed)."""
        return self.layout(range(len(self.groups)) if self.spec.state_paging else (), costs)


@dataclass(frozen=True)
class StepLayout:
    """A :class:`StepMemory` with its optimizer-state residency decided: what the simulator replays."""

    memory: StepMemory
    state_on_flash: frozenset[int]
    costs: "StateCosts | None" = None

    @property
    def pagein_energy_j(self) -> float:
        """Energy of reading the optimizer state on flash, per step (0 when unpriced)."""
        return self.costs.pagein_of(self.state_on_flash) if self.costs is not None else 0.0

    @property
    def pageout_energy_j(self) -> float:
        """Energy of writing the optimizer state on flash, per step (0 when unpriced)."""
        return self.costs.pageout_of(self.state_on_flash) if self.costs is not None else 0.0

    @property
    def paging_io_ms(self) -> float:
        """The I/O thread's time for the optimizer state's paging per step (0 when unpriced)."""
        return self.costs.io_ms_of(self.state_on_flash) if self.costs is not None else 0.0

    @property
    def exposed_paging_ms(self) -> float:
        """What of that time the step waits for (0 when unpriced): see :func:`background_waits`, plus the
        device's exposed share of all of it."""
        if self.costs is None:
            return 0.0
        waits = background_waits(self.memory, self.state_on_flash, self.costs)
        return waits.total_ms + self.costs.exposed_fraction * self.paging_io_ms

    @cached_property
    def resident_state_bytes(self) -> int:
        """Optimizer state in RAM: the groups kept there, and the overlays of the tables on flash."""
        return sum(g.overlay_bytes if k in self.state_on_flash else g.bytes for k, g in enumerate(self.memory.groups))

    @cached_property
    def paged_state_bytes(self) -> int:
        return sum(g.bytes for k, g in enumerate(self.memory.groups) if k in self.state_on_flash)

    @cached_property
    def parameters_on_flash(self) -> tuple[int, ...]:
        """Indices into ``graph.parameters`` whose optimizer state lives on flash, ascending."""
        return tuple(sorted(p for k in self.state_on_flash for p in self.memory.groups[k].parameters))

    def fixed_at(self, stage: int) -> int:
        """Bytes beside activations and workspace held at ``stage`` (``stage == T``: after the last)."""
        inside = self.memory.stage_bytes[stage] if stage < len(self.memory.stage_bytes) else 0
        return self.memory.constant_bytes + self.resident_state_bytes + inside + self.behind_at(stage)

    def behind_at(self, stage: int) -> int:
        """What the background updates of the state on flash hold at ``stage``."""
        return sum(self.memory.groups[k].held_at(stage) for k in self.state_on_flash)

    @cached_property
    def gradient_peak_bytes(self) -> int:
        """The most gradient bytes the step holds at once (the part the agent checks as ``gradients``)."""
        memory, peaks = self.memory, list(self.memory.gradient_peaks)
        for k in self.state_on_flash:
            group = memory.groups[k]
            for stage in range(len(peaks)):
                if group.holds_at(stage):
                    peaks[stage] += group.grad_bytes
        return max(peaks, default=0)


@dataclass(frozen=True)
class BackgroundWaits:
    """How long a step waits for the background updates of its state on flash, beyond the computation they
    run beside (:func:`background_waits`)."""

    by_node: dict[int, float]  # backward node -> ms its updates run past the next node's computation
    tail_ms: float  # ms the late groups' updates run past the end of the backward pass

    @property
    def total_ms(self) -> float:
        return sum(self.by_node.values()) + self.tail_ms


def background_waits(memory: StepMemory, on_flash: Iterable[int], costs: StateCosts) -> BackgroundWaits:
    """The step's waits for one update thread running the paged groups' I/O, earliest deadline first.

    A group updated at node ``b`` must be done by the end of node ``b + 1``: the step waits for what of its
    node's groups' I/O that computation does not cover.  Late groups must be done by the end of the backward
    pass: for each stage ``s`` a late group's update may start at, the I/O due from ``s`` on, less the
    computation from ``s`` on and the waits there already, is what the end of the step waits for.  The MILP
    holds the same rows (:mod:`schedules.milp.formulation`).
    """
    nodes = memory.graph.nodes
    groups = [(memory.groups[k], costs.io_ms[k]) for k in on_flash]
    by_node: dict[int, float] = {}
    for group, ms in groups:
        if not group.late:
            by_node[group.node] = by_node.get(group.node, 0.0) + ms
    for b, ms in by_node.items():
        by_node[b] = max(0.0, ms - (nodes[b + 1].compute_ms if b + 1 < len(nodes) else 0.0))
    tail = 0.0
    for start in sorted({g.start for g, _ in groups if g.late}):
        work = sum(ms for g, ms in groups if g.start >= start)
        covered = sum(n.compute_ms for n in nodes[start:]) + sum(w for b, w in by_node.items() if b + 1 >= start)
        tail = max(tail, work - covered)
    return BackgroundWaits(by_node, tail)


def update_ms(memory: StepMemory, device: Any) -> float:
    """Milliseconds the step's optimizer updates take on ``device`` (a :class:`schedules.device.DeviceProfile`):
    every parameter once, in chunks of ``spec.chunk_bytes``, at the device's measured cost of this kind of
    update; 0 where it has none (or no device).  No node's time holds them: extraction times the forward and
    backward computation alone (AdamW's update is about a seventh of BERT's step, SGD with momentum's a
    thirtieth of resnet18's)."""
    if device is None:
        return 0.0
    spec = memory.spec
    chunks = sum(-(-p.bytes // max(1, p.chunk_bytes(spec.chunk_bytes))) for p in memory.graph.parameters)
    seconds = device.update_seconds(spec.update_kind, chunks, memory.graph.parameter_bytes)
    return 0.0 if seconds is None else seconds * 1000.0


def _groups(graph: TrainingGraph, spec: TrainingSpec) -> tuple[StateGroup, ...]:
    """Large parameters' state alone, the rest by the node that updates them, in update order."""
    if spec.state_tensors == 0:
        return ()
    members: list[tuple[int, ...]] = []
    small: dict[int, list[int]] = {}
    for index, p in enumerate(graph.parameters):
        state = p.bytes * spec.state_tensors
        if state >= GROUP_MIN_BYTES:
            members.append((index,))
        elif state:
            small.setdefault(p.last, []).append(index)
    members += [tuple(indices) for indices in small.values()]
    groups = [_group(graph, spec, indices) for indices in members]
    return tuple(sorted(groups, key=lambda g: (g.node, g.parameters)))


@dataclass(frozen=True)
class StateCosts:
    """What keeping each :class:`StateGroup` on flash costs a step: reading and writing it once, chunk by chunk."""

    pagein_j: tuple[float, ...]
    pageout_j: tuple[float, ...]
    io_ms: tuple[float, ...]  # the I/O thread's time for both transfers
    exposed_fraction: float = 0.0  # of paging beside compute, the share that slows it anyway (the device's)

    @property
    def energy_j(self) -> tuple[float, ...]:
        """Per group, reading and writing it."""
        return tuple(a + b for a, b in zip(self.pagein_j, self.pageout_j))

    def pagein_of(self, on_flash: Iterable[int]) -> float:
        return sum(self.pagein_j[k] for k in on_flash)

    def pageout_of(self, on_flash: Iterable[int]) -> float:
        return sum(self.pageout_j[k] for k in on_flash)

    def io_ms_of(self, on_flash: Iterable[int]) -> float:
        return sum(self.io_ms[k] for k in on_flash)


def state_costs(memory: StepMemory, device: Any) -> StateCosts:
    """Price each group's paging on ``device`` (a :class:`schedules.device.DeviceProfile`): every chunk is one
    read and one write, each paying the device's latency."""
    pagein, pageout, io_ms = [], [], []
    for group in memory.groups:
        read = write = 0.0
        for index in group.parameters:
            p = memory.graph.parameters[index]
            chunk = p.chunk_bytes(memory.spec.chunk_bytes)
            full, rest = divmod(p.bytes, chunk)  # per state tensor
            tensors = memory.spec.state_tensors
            for size, count in ((chunk, full * tensors), (rest, tensors if rest else 0)):
                read += count * device.pagein_seconds(size)
                write += count * device.pageout_seconds(size)
        pagein.append(read * device.memory_power_w)
        pageout.append(write * device.memory_power_w)
        io_ms.append((read + write) * 1000.0)
    exposed = device.exposed_paging_fraction if device.paging_overlaps_compute else 1.0
    return StateCosts(tuple(pagein), tuple(pageout), tuple(io_ms), exposed)


def _group(graph: TrainingGraph, spec: TrainingSpec, indices: tuple[int, ...]) -> StateGroup:
    """One group, with what its background update holds into the next stage (in fused mode; accumulation and
    clipping update at the end of the step, in the foreground)."""
    params = [graph.parameters[i] for i in indices]
    state = sum(p.bytes for p in params) * spec.state_tensors
    if spec.accumulation > 1 or spec.clip:
        return StateGroup(indices, state, params[0].last)
    in_flight = READ_AHEAD_CHUNKS + 1 + WRITE_BEHIND_CHUNKS
    if len(params) == 1 and updates_by_rows(params[0], spec):
        p = params[0]
        chunk = p.chunk_bytes(spec.chunk_bytes)
        looked_up = p.rows * p.row_bytes  # the rows updated last: their parameter rows and gradient rows gathered
        overlay = looked_up * spec.state_tensors
        # the pass over the other rows: chunks in flight, its gathered rows (parameter, zero gradient, state) and
        # temporaries, and the looked-up rows' state it takes out while the last step's goes back
        passing = chunk * (spec.update_temporaries + in_flight * spec.state_tensors + 2 + spec.state_tensors)
        return StateGroup(indices, state, p.last, p.bytes, p.bytes + looked_up * (2 + spec.update_temporaries),
                          True, graph.lookup_node(p), passing + overlay, overlay)
    grads, transient, late = 0, 0, False
    for p in params:
        chunk = p.chunk_bytes(spec.chunk_bytes)
        streamed = p.streamed and len(p.nodes) == 1
        late = late or streamed
        grads += p.stream_bytes + chunk if streamed else p.bytes  # the factors, and the block being applied
        transient = max(transient, chunk * (spec.update_temporaries + in_flight * spec.state_tensors))
    return StateGroup(indices, state, params[0].last, grads, grads + transient, late)
