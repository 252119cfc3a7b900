"""Replay a schedule on its graph, check every rule, and measure what it predicts.

Rules (each broken rule raises :class:`ScheduleViolation` naming the instruction):

* ``compute i`` needs every predecessor of ``i`` resident and ``i`` not resident;
* ``free i`` and ``page_out i`` need ``i`` resident; ``page_out`` of a value
  already on flash is refused (it would write it twice);
* ``page_in i`` needs a flash copy and ``i`` not resident;
* resident bytes, plus the workspace of a node while it computes, never
  exceed the memory budget -- for a whole-step plan (:mod:`schedules.step_memory`)
  together with what the step holds beside activations at that stage
  (runtime, gradients, resident optimizer state);
* every backward node is computed exactly once (gradients are accumulated);
* the total runtime stays within the runtime budget, and so does the I/O
  thread's busy time when paging runs beside compute (``io_time_ms``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from schedules.errors import ScheduleViolation
from schedules.graph import TrainingGraph
from schedules.matrices import Instruction
from schedules.schedule import Schedule
from schedules.step_memory import StepLayout

# Floating-point slack for budget comparisons made on sums of measured times.
_RUNTIME_RTOL = 1e-9


@dataclass(frozen=True)
class SimulationReport:
    """What replaying a schedule predicts.

    ``resident_bytes[k]`` is the activation bytes in RAM after instruction ``k``
    (what the executor's ledger measures); ``working_bytes[k]`` adds the
    workspace of the node instruction ``k`` computes, the most memory the
    instruction needs at once.  ``peak_bytes`` is the peak of the first,
    ``peak_memory_bytes`` of the second: what the memory budget bounds.
    """

    peak_bytes: int
    runtime_ms: float
    energy_j: float
    compute_energy_j: float
    pagein_energy_j: float
    pageout_energy_j: float
    bytes_paged_out: int
    bytes_paged_in: int
    recomputed_nodes: int
    resident_bytes: tuple[int, ...]
    working_bytes: tuple[int, ...]
    peak_memory_bytes: int
    io_ms: float = 0.0
    """Busy time of the I/O thread (all paging, one transfer at a time), ms; 0 without ``io_time_ms``."""
    fixed_bytes: tuple[int, ...] = ()
    """Per instruction, what a whole-step plan holds beside activations and workspace (included in
    ``working_bytes``); empty for an activation-only replay."""
    activation_peak_bytes: int = 0
    """The most activation and workspace bytes at once (``peak_memory_bytes`` less what the step holds beside)."""


def simulate(
    graph: TrainingGraph,
    schedule: Schedule | Sequence[Instruction],
    *,
    memory_budget: float | None = None,
    runtime_budget_ms: float | None = None,
    paging_time_ms: tuple[Sequence[float], Sequence[float]] | None = None,
    io_time_ms: tuple[Sequence[float], Sequence[float]] | None = None,
    step: StepLayout | None = None,
) -> SimulationReport:
    """Replay ``schedule`` on ``graph`` and return its predicted peak, runtime and energy.

    A :class:`Schedule` is checked against the graph's fingerprint and its own
    budgets; explicit ``memory_budget`` / ``runtime_budget_ms`` override them.
    ``paging_time_ms`` (page-in, page-out milliseconds per node) adds paging
    time to the runtime, for devices whose paging does not overlap compute.
    ``io_time_ms`` (the same columns) is for devices where it does: paging
    adds nothing to the compute thread's runtime, but the one I/O thread does
    every transfer in turn, so its busy time (``io_ms``) must fit the runtime
    budget too -- a step cannot end before its last write does.

    ``step`` replays a whole-step plan: every instruction also holds
    ``step.fixed_at(stage)``, and a computation its node's update transient
    beside its workspace; the optimizer state's paging adds its energy, and
    its I/O time to the I/O thread's and, where the next node's computation
    does not cover it, to the runtime.  A :class:`Schedule` planned
    for the whole step brings its own.
    """
    if isinstance(schedule, Schedule):
        schedule.check_graph(graph)
        memory_budget = schedule.memory_budget if memory_budget is None else memory_budget
        if runtime_budget_ms is None and schedule.runtime_budget_ms is not None:
            # the replay times the nodes; the optimizer's updates have their share of the schedule's budget
            runtime_budget_ms = schedule.runtime_budget_ms - (schedule.step.update_ms if schedule.step else 0.0)
        instructions: Sequence[Instruction] = schedule.instructions
        if step is None and schedule.step is not None:
            step = schedule.step_layout(graph)
    else:
        instructions = schedule
    replay = _Replay(graph, memory_budget, paging_time_ms, io_time_ms, step)
    for position, (op, node) in enumerate(instructions):
        replay.step(position, op, node)
    replay.finish(runtime_budget_ms)
    return replay.report()


class _Replay:
    """The state of one replay: resident set, flash set, counters."""

    def __init__(self, graph: TrainingGraph, budget: float | None, paging_time_ms, io_time_ms,
                 step: StepLayout | None = None) -> None:
        self.g = graph
        self.budget = budget
        self.layout = step
        self.stage = 0  # the first node not computed yet: the stage of the next computation
        self.compute_stage = 0  # the stage of the last computation
        self.fixed: list[int] = []
        self.activation_peak = 0
        self.paging_time_ms = paging_time_ms
        self.io_time_ms = io_time_ms
        self.io_ms = 0.0
        self.resident: set[int] = set()
        self.on_flash: set[int] = set()
        self.computed = [0] * graph.size
        self.current = self.peak = self.peak_memory = 0
        self.runtime_ms = 0.0
        self.energy = {"compute": 0.0, "page_in": 0.0, "page_out": 0.0}
        self.paged = {"page_in": 0, "page_out": 0}
        self.trace: list[int] = []
        self.working: list[int] = []

    def step(self, position: int, op: str, node: int) -> None:
        if not 0 <= node < self.g.size:
            raise ScheduleViolation(f"instruction {position}: node {node} is not in the graph", position)
        handler = getattr(self, f"_{op}", None)
        if handler is None:
            raise ScheduleViolation(f"instruction {position}: unknown op {op!r}", position)
        # a computation belongs to the stage of the first node not computed yet, and so does a page-in: it reads
        # a value in for a computation still to come, after the last one's background updates were waited for
        # (the executor waits for node t-1's at the end of node t), as the MILP counts it; frees and page-outs
        # stay with the stage of the computation before them: the MILP checks memory at computations, and what
        # its next stage holds beside activations (a background update's gradients) is in the workspace of the
        # computation that makes it
        stage = self.stage if op in ("compute", "page_in") else self.compute_stage
        if op == "compute":
            self.compute_stage = stage
        handler(position, node)
        while self.stage < self.g.size and self.computed[self.stage]:
            self.stage += 1
        workspace = self.g.nodes[node].workspace_bytes if op == "compute" else 0
        if op == "compute" and self.layout is not None:
            workspace += self.layout.memory.update_bytes[node]
        fixed = self.layout.fixed_at(stage) if self.layout is not None else 0
        working = self.current + workspace + fixed
        self.trace.append(self.current)
        self.working.append(working)
        self.fixed.append(fixed)
        if self.budget is not None and working > self.budget:
            held = f"{self.current} resident bytes" + (f" and {workspace} of workspace" if workspace else "")
            if fixed:
                held += f" beside {fixed} the step holds at stage {stage} (runtime, gradients, optimizer state)"
            raise ScheduleViolation(
                f"instruction {position} ({op} {node}): {held} exceed the budget of {int(self.budget)}", position)
        self.peak = max(self.peak, self.current)
        self.peak_memory = max(self.peak_memory, working)
        self.activation_peak = max(self.activation_peak, self.current + workspace)

    def _compute(self, position: int, node: int) -> None:
        missing = [p for p in self.g.predecessors[node] if p not in self.resident]
        if missing:
            raise ScheduleViolation(
                f"instruction {position} (compute {node}): inputs {missing} are not resident", position)
        self._need(node not in self.resident, position, f"compute {node}: value is already resident")
        if self.g.is_backward(node) and self.computed[node]:
            raise ScheduleViolation(
                f"instruction {position} (compute {node}): backward node computed a second time "
                "(its gradient would be accumulated twice)", position)
        n = self.g.nodes[node]
        self.computed[node] += 1
        self.runtime_ms += n.compute_ms
        self.energy["compute"] += n.compute_j or 0.0
        self._add(node)

    def _free(self, position: int, node: int) -> None:
        self._need(node in self.resident, position, f"free {node}: value is not resident")
        self.resident.discard(node)
        self.current -= self.g.nodes[node].bytes

    def _page_out(self, position: int, node: int) -> None:
        self._need(node in self.resident, position, f"page_out {node}: value is not resident")
        self._need(node not in self.on_flash, position, f"page_out {node}: value is already on flash")
        self.on_flash.add(node)
        self._count_paging("page_out", node, 1)

    def _page_in(self, position: int, node: int) -> None:
        self._need(node in self.on_flash, position, f"page_in {node}: value was never paged out")
        self._need(node not in self.resident, position, f"page_in {node}: value is already resident")
        self._count_paging("page_in", node, 0)
        self._add(node)

    def _count_paging(self, op: str, node: int, column: int) -> None:
        n = self.g.nodes[node]
        self.paged[op] += n.bytes
        self.energy[op] += (n.pagein_j if op == "page_in" else n.pageout_j) or 0.0
        if self.paging_time_ms is not None:
            self.runtime_ms += self.paging_time_ms[column][node]
        if self.io_time_ms is not None:
            self.io_ms += self.io_time_ms[column][node]

    def _add(self, node: int) -> None:
        self.resident.add(node)
        self.current += self.g.nodes[node].bytes

    @staticmethod
    def _need(condition: bool, position: int, message: str) -> None:
        if not condition:
            raise ScheduleViolation(f"instruction {position} ({message})", position)

    def finish(self, runtime_budget_ms: float | None) -> None:
        layout = self.layout
        if layout is not None:  # the optimizer state on flash is read and written once a step
            self.energy["page_in"] += layout.pagein_energy_j
            self.energy["page_out"] += layout.pageout_energy_j
            self.paged["page_in"] += layout.paged_state_bytes
            self.paged["page_out"] += layout.paged_state_bytes
            self.runtime_ms += layout.exposed_paging_ms  # what the next node's computation does not cover
            if self.io_time_ms is not None:
                self.io_ms += layout.paging_io_ms
        never = sorted(b for b in self.g.backward_nodes if self.computed[b] == 0)
        if never:
            raise ScheduleViolation(f"backward nodes {never[:10]} are never computed: the gradients are incomplete")
        if runtime_budget_ms is not None and self.runtime_ms > runtime_budget_ms * (1 + _RUNTIME_RTOL):
            raise ScheduleViolation(
                f"runtime {self.runtime_ms:.6g} ms exceeds the runtime budget of {runtime_budget_ms:.6g} ms")
        if runtime_budget_ms is not None and self.io_ms > runtime_budget_ms * (1 + _RUNTIME_RTOL):
            raise ScheduleViolation(
                f"paging keeps the I/O thread busy {self.io_ms:.6g} ms, longer than the runtime budget of "
                f"{runtime_budget_ms:.6g} ms: the step would wait for flash")

    def report(self) -> SimulationReport:
        return SimulationReport(
            peak_bytes=self.peak,
            runtime_ms=self.runtime_ms,
            energy_j=sum(self.energy.values()),
            compute_energy_j=self.energy["compute"],
            pagein_energy_j=self.energy["page_in"],
            pageout_energy_j=self.energy["page_out"],
            bytes_paged_out=self.paged["page_out"],
            bytes_paged_in=self.paged["page_in"],
            recomputed_nodes=sum(c - 1 for c in self.computed if c > 1),
            resident_bytes=tuple(self.trace),
            working_bytes=tuple(self.working),
            peak_memory_bytes=self.peak_memory,
            io_ms=self.io_ms,
            fixed_bytes=tuple(self.fixed) if self.layout is not None else (),
            activation_peak_bytes=self.activation_peak,
        )
