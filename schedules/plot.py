"""Pictures of schedules: the stage x node timeline (POET paper, Figure 2) and energy-vs-budget curves.

matplotlib is imported inside the drawing functions and used through its
object-oriented API on the Agg canvas (no ``pyplot``, no global backend
switch), so ``import schedules`` stays light and plotting works on a headless
device or CI machine.

Stages are reconstructed from the instruction list alone (see
:func:`stage_timeline`), so any schedule can be drawn, not only the MILP's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from schedules.budgets import SweepPoint
from schedules.graph import TrainingGraph
from schedules.matrices import Instruction
from schedules.schedule import Schedule
from schedules.simulate import simulate
from schedules.units import short_bytes

# Cell states of the timeline, in increasing priority: a cell shows the most
# telling thing that happened to the node during the stage.
EMPTY, ON_FLASH, RESIDENT, PAGE_OUT, PAGE_IN, RECOMPUTE, COMPUTE = range(7)
STATE_LABELS = ("", "on flash", "resident in RAM", "page out", "page in", "recompute", "compute")
STATE_COLOURS = ("#ffffff", "#ddd0ef", "#a6cee3", "#ff7f00", "#33a02c", "#e31a1c", "#1f3f99")


@dataclass(frozen=True)
class StageTimeline:
    """A schedule laid out on POET's stage grid.

    Attributes
    ----------
    states:
        ``states[node, stage]``: one of the state constants above.
    stage_of:
        ``stage_of[k]``: the stage instruction ``k`` belongs to.
    """

    states: np.ndarray
    stage_of: tuple[int, ...]

    @property
    def stages(self) -> int:
        return self.states.shape[1]


def split_stages(instructions: Sequence[Instruction]) -> list[int]:
    """The stage of each instruction.

    A stage is the work that leads up to the first compute of a node not
    computed before (page-outs, frees, recomputes, then the stage's own node),
    followed by its tail: frees of inputs just used, then page-ins made ready
    for the next stage (the order :func:`schedules.matrices.to_instructions`
    writes).  Anything else after the tail opens the next stage, so recomputes
    are drawn in the stage that needed them, as in POET's ``R[t, i]``.
    """
    seen: set[int] = set()
    stage, phase = 0, "work"  # phase: work -> freeing -> paging_in, then a new stage
    out: list[int] = []
    for op, node in instructions:
        in_tail = (phase == "freeing" and op in ("free", "page_in")) or (phase == "paging_in" and op == "page_in")
        if phase != "work" and not in_tail:
            stage, phase = stage + 1, "work"
        if phase == "work" and op == "compute" and node not in seen:
            phase = "freeing"
        elif phase != "work" and op == "page_in":
            phase = "paging_in"
        if op == "compute":
            seen.add(node)
        out.append(stage)
    return out


def stage_timeline(graph: TrainingGraph, instructions: Sequence[Instruction]) -> StageTimeline:
    """Replay ``instructions`` and record what happened to every node in every stage."""
    stage_of = split_stages(instructions)
    stages = (stage_of[-1] + 1) if stage_of else 0
    states = np.full((graph.size, stages), EMPTY, dtype=np.int8)
    resident: set[int] = set()
    on_flash: set[int] = set()
    computed: set[int] = set()
    current = -1
    for (op, node), stage in zip(instructions, stage_of):
        if stage != current:  # what is held at the start of a stage shows in it
            _mark(states[:, stage], resident, on_flash)
            current = stage
        event = _apply(op, node, resident, on_flash, computed)
        states[node, stage] = max(states[node, stage], event)
        _mark(states[:, stage], resident, on_flash)
    return StageTimeline(states, tuple(stage_of))


def _apply(op: str, node: int, resident: set[int], on_flash: set[int], computed: set[int]) -> int:
    """Update the sets for one instruction; return the event's state for the node's cell."""
    if op == "compute":
        event = RECOMPUTE if node in computed else COMPUTE
        computed.add(node)
        resident.add(node)
        return event
    if op == "page_out":
        on_flash.add(node)
        return PAGE_OUT
    if op == "page_in":
        resident.add(node)
        return PAGE_IN
    resident.discard(node)  # free
    return EMPTY


def _mark(column: np.ndarray, resident: set[int], on_flash: set[int]) -> None:
    for i in on_flash - resident:
        column[i] = max(column[i], ON_FLASH)
    for i in resident:
        column[i] = max(column[i], RESIDENT)


def instruction_positions(stage_of: Sequence[int]) -> np.ndarray:
    """x position of each instruction on the stage axis: stage ``s``'s instructions spread over ``(s, s+1]``."""
    counts = np.bincount(np.asarray(stage_of, dtype=int)) if len(stage_of) else np.zeros(0, dtype=int)
    seen = np.zeros_like(counts)
    xs = np.empty(len(stage_of))
    for k, s in enumerate(stage_of):
        seen[s] += 1
        xs[k] = s + seen[s] / counts[s]
    return xs


def plot_timeline(graph: TrainingGraph, schedule: Schedule, path: str | Path, *, title: str | None = None) -> Path:
    """Draw the stage x node timeline above resident memory over the step; write a PNG to ``path``.

    The memory panel replays the schedule in the simulator (which also checks
    it against ``graph`` and its budgets) and draws the budget as a dashed line.
    """
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.patches import Patch

    report = simulate(graph, schedule)
    timeline = stage_timeline(graph, schedule.instructions)
    fig, (grid_ax, mem_ax) = _figure(figsize=(12, 10), nrows=2, sharex=True, height_ratios=(3, 1))
    cmap = ListedColormap(STATE_COLOURS)
    grid_ax.imshow(timeline.states, cmap=cmap, norm=BoundaryNorm(np.arange(-0.5, 7.5), cmap.N), aspect="auto",
                   interpolation="nearest", origin="upper", extent=(0, timeline.stages, graph.size, 0))
    _label_nodes(grid_ax, graph)
    grid_ax.set_title(title or _timeline_title(schedule))
    grid_ax.legend(handles=[Patch(facecolor=STATE_COLOURS[s], edgecolor="0.5", label=STATE_LABELS[s])
                            for s in range(1, 7)], loc="upper center", bbox_to_anchor=(0.5, -0.01),
                   ncol=6, frameon=False, fontsize=9)
    _memory_panel(mem_ax, report.resident_bytes, instruction_positions(timeline.stage_of), schedule.memory_budget)
    mem_ax.set_xlabel("stage (one per node: stage t computes node t, recomputing and paging what it needs)")
    return _save(fig, path)


def _label_nodes(ax, graph: TrainingGraph) -> None:
    """Node axis: tick every few nodes, and a line where the backward pass begins."""
    ax.set_ylabel("node (value)")
    step = next(s for s in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 10**9) if graph.size / s <= 14)
    ax.set_yticks(np.arange(0, graph.size, step) + 0.5, [str(i) for i in range(0, graph.size, step)])
    first_backward = min(graph.backward_nodes, default=None)
    if first_backward is not None:
        for axis_line in (ax.axhline, ax.axvline):
            axis_line(first_backward, color="0.4", linewidth=0.8, linestyle=":")
        ax.text(0.5, first_backward / 2, " forward", va="center", fontsize=9, color="0.3")
        ax.text(0.5, (first_backward + graph.size) / 2, " backward", va="center", fontsize=9, color="0.3")


def _memory_panel(ax, resident: Sequence[int], xs: np.ndarray, budget: int | None) -> None:
    ax.step(np.concatenate(([0.0], xs)), np.concatenate(([0], resident)) / 1e6, where="post",
            color="#1f3f99", linewidth=1.0, label="resident activations")
    if budget is not None:
        ax.axhline(budget / 1e6, color="#e31a1c", linestyle="--", linewidth=1.0, label=f"budget {short_bytes(budget)}")
    peak = max(resident, default=0)
    ax.axhline(peak / 1e6, color="0.5", linestyle=":", linewidth=0.8, label=f"peak {short_bytes(peak)}")
    ax.set_ylabel("RAM (MB)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=9, frameon=False)
    ax.grid(axis="y", alpha=0.3)


def _timeline_title(schedule: Schedule) -> str:
    budget = "unconstrained" if schedule.memory_budget is None else short_bytes(schedule.memory_budget)
    return (f"{schedule.model or 'schedule'} on {schedule.device}: {schedule.solver.method} "
            f"({schedule.solver.status}), budget {budget}, predicted {schedule.predicted_energy_j:.4g} J")


def plot_pareto(points: Sequence[SweepPoint], path: str | Path, *, title: str = "Energy vs memory budget",
                store_all_peak: int | None = None) -> Path:
    """Energy of one training step against the memory budget, one curve per method; write a PNG.

    The upper panel shows joules; the lower one each baseline's extra energy
    over POET at the same budget, where differences too small to see in joules
    show.  Infeasible points are left out.
    """
    fig, (energy_ax, extra_ax) = _figure(figsize=(9, 7.5), nrows=2, sharex=True, height_ratios=(2, 1))
    curves = _curves(points)
    poet = dict(zip(*curves["poet"])) if curves.get("poet") else {}
    for k, (method, curve) in enumerate(curves.items()):
        style = _curve_style(method, k)
        if curve is None:
            energy_ax.plot([], [], linestyle="none", **style, label=f"{method} (never feasible)")
            continue
        xs, ys = np.asarray(curve[0], dtype=float), np.asarray(curve[1])
        energy_ax.plot(xs / 1e6, ys, **style, label=method)
        shared = [(b, 100 * (e / poet[b] - 1)) for b, e in zip(*curve) if b in poet and method != "poet"]
        if shared:
            extra_ax.plot(np.asarray([b for b, _ in shared]) / 1e6, [x for _, x in shared], **style)
    for ax in (energy_ax, extra_ax):
        if store_all_peak is not None:
            ax.axvline(store_all_peak / 1e6, color="0.5", linestyle=":", linewidth=0.8,
                       label="store-all peak" if ax is energy_ax else None)
        ax.grid(alpha=0.3)
    energy_ax.set_ylabel("energy per training step (J)")
    energy_ax.set_title(title)
    energy_ax.legend(fontsize=9, frameon=False)
    extra_ax.axhline(0, color="#1f3f99", linewidth=1.0, alpha=0.5)
    extra_ax.set_ylabel("extra energy vs POET (%)")
    extra_ax.set_xlabel("memory budget for activations (MB)")
    return _save(fig, path)


def _curves(points: Sequence[SweepPoint]) -> dict[str, tuple[list[int], list[float]] | None]:
    """Per method, its feasible (budgets, energies) sorted by budget, or ``None`` when it has none."""
    curves: dict[str, tuple[list[int], list[float]] | None] = {}
    for method in dict.fromkeys(p.method for p in points):
        feasible = sorted((p.budget, p.energy_j) for p in points if p.method == method and p.energy_j is not None)
        curves[method] = (list(next(zip(*feasible))), list(list(zip(*feasible))[1])) if feasible else None
    return curves


def _curve_style(method: str, index: int) -> dict:
    if method == "poet":
        # A wide translucent band underneath, so baselines that match POET stay visible on top of it.
        return {"color": "#1f3f99", "linewidth": 7, "alpha": 0.3, "solid_capstyle": "round", "zorder": 1}
    return {"marker": "osD^vPX*h"[index % 9], "markersize": 7, "fillstyle": "none", "linewidth": 1.2, "zorder": 2}


def _figure(figsize: tuple[float, float], nrows: int, sharex: bool = False, height_ratios=None):
    """A Figure on the Agg canvas, without pyplot's global state."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, 1, sharex=sharex, squeeze=False,
                        gridspec_kw=None if height_ratios is None else {"height_ratios": height_ratios})
    return fig, list(axes[:, 0])


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
