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
from typing import Iterable, Sequence

import numpy as np

from schedules.budgets import SweepPoint
from schedules.graph import TrainingGraph
from schedules.matrices import Instruction
from schedules.plan import METHODS
from schedules.schedule import Schedule
from schedules.simulate import simulate
from common.units import short_bytes

# Cell states of the timeline, in increasing priority: a cell shows the most
# telling thing that happened to the node during the stage.
EMPTY, ON_FLASH, RESIDENT, PAGE_OUT, PAGE_IN, RECOMPUTE, COMPUTE = range(7)
STATE_LABELS = ("", "on flash, until paged in", "resident in RAM", "page out", "page in", "recompute", "compute")
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
    """Replay ``instructions`` and record what happened to every node in every stage.

    A cell shows the most telling thing that happened to the node during the
    stage; the "on flash" band comes from :func:`flash_intervals`.
    """
    stage_of = split_stages(instructions)
    stages = (stage_of[-1] + 1) if stage_of else 0
    states = np.full((graph.size, stages), EMPTY, dtype=np.int8)
    for node, intervals in flash_intervals(instructions, stage_of).items():
        for first, last in intervals:
            states[node, first:last + 1] = ON_FLASH
    resident: set[int] = set()
    computed: set[int] = set()
    current = -1
    for (op, node), stage in zip(instructions, stage_of):
        if stage != current:  # what is held at the start of a stage shows in it
            _mark_resident(states[:, stage], resident)
            current = stage
        event = _apply(op, node, resident, computed)
        states[node, stage] = max(states[node, stage], event)
        _mark_resident(states[:, stage], resident)
    return StageTimeline(states, tuple(stage_of))


def flash_intervals(instructions: Sequence[Instruction], stage_of: Sequence[int]) -> dict[int, list[tuple[int, int]]]:
    """Per node, the stages in which its value waits on flash for a page-in: ``(first, last)``, both included.

    An interval opens at the stage of a ``page_out`` (or, for a flash copy
    that is read more than once, at the ``free`` after a page-in) and closes
    at the stage of the ``page_in`` that brings the value back, so the band
    stops where the value is in RAM again and starts over if it leaves RAM
    again.  A flash copy that no later ``page_in`` reads draws no interval.
    Stages where the value is also resident are drawn as resident
    (:func:`stage_timeline` paints the stronger state over the band).
    """
    has_copy: set[int] = set()
    opened: dict[int, int] = {}  # node -> stage where it began waiting on flash
    out: dict[int, list[tuple[int, int]]] = {}
    for (op, node), stage in zip(instructions, stage_of):
        if op == "page_out":
            has_copy.add(node)
            opened.setdefault(node, stage)
        elif op == "free" and node in has_copy:
            opened.setdefault(node, stage)
        elif op == "page_in" and node in opened:
            out.setdefault(node, []).append((opened.pop(node), stage))
    return out


def _apply(op: str, node: int, resident: set[int], computed: set[int]) -> int:
    """Update the sets for one instruction; return the event's state for the node's cell."""
    if op == "compute":
        event = RECOMPUTE if node in computed else COMPUTE
        computed.add(node)
        resident.add(node)
        return event
    if op == "page_out":
        return PAGE_OUT
    if op == "page_in":
        resident.add(node)
        return PAGE_IN
    resident.discard(node)  # free
    return EMPTY


def _mark_resident(column: np.ndarray, resident: set[int]) -> None:
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
            color="#1f3f99", linewidth=1.0, label="activations resident in RAM after each instruction")
    if budget is not None:
        ax.axhline(budget / 1e6, color="#e31a1c", linestyle="--", linewidth=1.0,
                   label=f"memory budget {short_bytes(budget)} (activations + workspace)")
    peak = max(resident, default=0)
    ax.axhline(peak / 1e6, color="0.5", linestyle=":", linewidth=0.8, label=f"peak {short_bytes(peak)}")
    ax.set_ylabel("activations in RAM (MB)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower center", fontsize=9, frameon=False)
    ax.grid(axis="y", alpha=0.3)


def _timeline_title(schedule: Schedule) -> str:
    budget = "unconstrained" if schedule.memory_budget is None else short_bytes(schedule.memory_budget)
    return (f"{schedule.model or 'schedule'} on {schedule.device}: {schedule.solver.method} "
            f"({schedule.solver.status}), memory budget {budget}, "
            f"predicted {schedule.predicted_energy_j:.4g} J per step")


# How the Pareto plot marks a (method, budget) without a schedule, by the sweep's status.
MISSING_MARKS = {
    "no_solution": ("x", "time-out: the solver hit its time limit\nbefore finding a schedule"),
    "infeasible": ("_", "infeasible: the method has no schedule\nwithin this budget"),
}
_OTHER_MISSING = ("$?$", "no schedule")
# Points closer than this share of the energy axis's span are drawn on top of each other.
_COINCIDE = 0.01
# Sideways shift (points, i.e. 1/72 inch) between curves that would cover each other.
_DODGE_PT = 5.0


@dataclass(frozen=True)
class MissingPoint:
    """A (method, budget) of a sweep that has no energy to plot, with the mark that stands for it."""

    method: str
    budget: int
    status: str
    marker: str
    reason: str


def missing_points(points: Sequence[SweepPoint]) -> list[MissingPoint]:
    """The sweep's points without an energy, each with its marker and a reason a reader can follow."""
    out = []
    for p in points:
        if p.energy_j is None:
            marker, reason = MISSING_MARKS.get(p.status, _OTHER_MISSING)
            out.append(MissingPoint(p.method, p.budget, p.status, marker,
                                    reason if p.status in MISSING_MARKS else f"{reason} ({p.status})"))
    return out


def identical_to(points: Sequence[SweepPoint], rel: float = 1e-6) -> dict[str, str]:
    """Legend notes for methods whose energies equal an earlier method's at the same budgets.

    ``{"paging-only": "same as poet"}`` when every feasible point of
    ``paging-only`` equals ``poet``'s within ``rel``; ``"same as poet at
    2.45 MB"`` (or ``"at 3 of 5 budgets"``) when only some do.  Earlier means
    earlier in ``points``: the method drawn first keeps its plain label.
    """
    curves = {m: dict(zip(*c)) for m, c in _curves(points).items() if c is not None}
    notes: dict[str, str] = {}
    for k, (method, mine) in enumerate(curves.items()):
        best: tuple[int, str, list[int]] = (0, "", [])
        for other, theirs in list(curves.items())[:k]:
            same = [b for b, e in mine.items() if b in theirs and abs(e - theirs[b]) <= rel * max(abs(e), 1e-12)]
            if len(same) > best[0]:
                best = (len(same), other, same)
        count, other, same = best
        if count == len(mine):
            notes[method] = f"same as {other}"
        elif count:
            where = ", ".join(short_bytes(b) for b in same) if count <= 2 else f"{count} of {len(mine)} budgets"
            notes[method] = f"same as {other} at {where}"
    return notes


def dodge_offsets(points: Sequence[SweepPoint]) -> dict[str, float]:
    """Sideways shift, in points, for each method's curve so that coinciding curves stay visible.

    Two methods coincide when, at some budget, their energies lie within
    ``_COINCIDE`` of the energy axis's span.  Each method takes the first slot
    (0, +1, -1, +2, -2, ... times ``_DODGE_PT``) that no earlier method it
    coincides with holds, so the first method (POET, drawn as a wide band)
    stays in place and unrelated curves are not moved.
    """
    curves = {m: dict(zip(*c)) for m, c in _curves(points).items() if c is not None}
    energies = [e for c in curves.values() for e in c.values()]
    span = (max(energies) - min(energies)) if energies else 0.0
    tolerance = _COINCIDE * span if span > 0 else 1e-9 * max(map(abs, energies), default=1.0)
    slots: dict[str, int] = {}
    for method, mine in curves.items():
        taken = {slots[other] for other, theirs in curves.items() if other in slots
                 and any(b in theirs and abs(e - theirs[b]) <= tolerance for b, e in mine.items())}
        slots[method] = next(s for s in (0, *(k * sign for k in range(1, len(curves) + 1) for sign in (1, -1)))
                             if s not in taken)
    return {method: _DODGE_PT * slot for method, slot in slots.items()}


def plot_pareto(points: Sequence[SweepPoint], path: str | Path, *, title: str = "Energy vs memory budget",
                store_all_peak: int | None = None) -> Path:
    """Energy of one training step against the memory budget, one curve per method; write a PNG.

    The upper panel shows joules; the middle one each baseline's extra energy
    over POET at the same budget, where differences too small to see in joules
    show.  Curves that would cover each other are shifted a few points
    sideways (:func:`dodge_offsets`) and methods identical to an earlier one
    say so in the legend (:func:`identical_to`).  Budgets without a schedule
    are marked in a strip underneath, one row per method, with the reason in
    the legend (:func:`missing_points`); plain backpropagation's peak
    (``store_all_peak``) is drawn as a line, or, when it lies beyond the swept
    budgets, named in the legend and at the end of store-all's row in the strip.
    """
    curves = _curves(points)
    missing = missing_points(points)
    rows = [m for m in curves if any(p.method == m for p in missing)]
    ratios = (3, 1.5) + ((0.45 + 0.28 * len(rows),) if rows else ())
    fig, axes = _figure(figsize=(12, 8 + 0.3 * len(rows)), nrows=len(ratios), sharex=True, height_ratios=ratios)
    energy_ax, extra_ax = axes[:2]
    poet = dict(zip(*curves["poet"])) if curves.get("poet") else {}
    notes, offsets = identical_to(points), dodge_offsets(points)
    styles = curve_styles(curves)
    for method, curve in curves.items():
        style = styles[method]
        if curve is None:
            energy_ax.plot([], [], **style, label=f"{method} (no schedule at any budget)")
            continue
        label = f"{method} ({notes[method]})" if method in notes else method
        xs, ys = np.asarray(curve[0], dtype=float) / 1e6, np.asarray(curve[1])
        _shifted(energy_ax.plot(xs, ys, **style, label=label), offsets[method])
        shared = [(b / 1e6, 100 * (e / poet[b] - 1)) for b, e in zip(*curve) if b in poet and method != "poet"]
        if shared:
            _shifted(extra_ax.plot(*zip(*shared), **style), offsets[method])
    budgets = sorted({p.budget for p in points})
    beyond = _store_all_mark(energy_ax, extra_ax, store_all_peak, budgets)
    if any(offsets.values()):
        energy_ax.plot([], [], linestyle="none", label=f"(coinciding points are drawn up to\n"
                                                         f"{max(map(abs, offsets.values())):g} pt apart sideways)")
    if rows:
        _missing_strip(axes[2], rows, missing, styles, {"store-all": beyond} if beyond else {})
        for marker, reason in dict.fromkeys((m.marker, m.reason) for m in missing):
            energy_ax.plot([], [], linestyle="none", marker=marker, color="0.2", markersize=8,
                           markeredgewidth=2, label=reason)
    for ax in axes[:2]:
        ax.grid(alpha=0.3)
    energy_ax.set_ylabel("energy per training step (J)")
    energy_ax.set_title(title)
    energy_ax.legend(fontsize=9, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    extra_ax.axhline(0, color="#1f3f99", linewidth=1.0, alpha=0.5)
    extra_ax.set_ylabel("extra energy vs POET\nat the same budget (%)")
    axes[-1].set_xlabel("memory budget for activations (MB)")
    return _save(fig, path)


def _store_all_mark(energy_ax, extra_ax, peak: int | None, budgets: Sequence[int]) -> str | None:
    """Plain backpropagation's peak: a line inside the swept budgets, a legend entry beyond them.

    Returns the short note for the store-all row of the strip when the peak lies beyond the axis.
    """
    if peak is None:
        return None
    text = f"store-all needs {short_bytes(peak)}\n(plain backpropagation's peak)"
    if not budgets or peak <= budgets[-1] * 1.001:
        for ax in (energy_ax, extra_ax):
            ax.axvline(peak / 1e6, color="0.5", linestyle=":", linewidth=0.8, label=text if ax is energy_ax else None)
        return None
    energy_ax.plot([], [], linestyle="none", marker="$\\rightarrow$", color="0.3", markersize=10,
                   label=f"{text},\nbeyond the axis")
    return f"needs {short_bytes(peak)} \u2192"


def _shifted(lines, dx_points: float) -> None:
    """Move drawn lines ``dx_points`` sideways on the page; the axes' data limits keep the true positions."""
    from matplotlib.transforms import offset_copy

    for line in lines:
        if dx_points:
            line.set_transform(offset_copy(line.axes.transData, fig=line.figure, x=dx_points, units="points"))


def _missing_strip(ax, rows: Sequence[str], missing: Sequence[MissingPoint], styles: dict,
                   row_notes: dict[str, str]) -> None:
    """One row per method with budgets it has no schedule for, each marked by why; ``row_notes`` at a row's end."""
    for y, method in enumerate(rows):
        colour = styles[method].get("color")
        if method in row_notes:
            ax.annotate(row_notes[method], xy=(1.0, y), xycoords=("axes fraction", "data"), xytext=(-4, 0),
                        textcoords="offset points", ha="right", va="center", fontsize=9, color=colour)
        for m in (m for m in missing if m.method == method):
            ax.plot(m.budget / 1e6, y, linestyle="none", marker=m.marker, color=colour, markersize=9,
                    markeredgewidth=2)
    ax.set_yticks(range(len(rows)), rows, fontsize=9)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_title("budgets without a schedule (not plotted above; marks explained in the legend)", fontsize=9,
                 loc="left")
    ax.grid(axis="x", alpha=0.3)


def _curves(points: Sequence[SweepPoint]) -> dict[str, tuple[list[int], list[float]] | None]:
    """Per method, its feasible (budgets, energies) sorted by budget, or ``None`` when it has none."""
    curves: dict[str, tuple[list[int], list[float]] | None] = {}
    for method in dict.fromkeys(p.method for p in points):
        feasible = sorted((p.budget, p.energy_j) for p in points if p.method == method and p.energy_j is not None)
        curves[method] = (list(next(zip(*feasible))), list(list(zip(*feasible))[1])) if feasible else None
    return curves


# Baseline curves: default colour cycle, each with its own marker and dash pattern.
_COLOURS = ("#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
_MARKERS = "osD^vP<*h"
_DASHES = ("-", "--", "-.", ":")


def curve_styles(methods: Iterable[str]) -> dict[str, dict]:
    """matplotlib styles for each method's curve (POET's a wide band underneath the others).

    A method's place in :data:`METHODS` picks its colour, marker and dash, so that it looks the same in
    every plot whichever other methods are drawn; methods not in it come after, in the order given.
    """
    methods = list(methods)
    unknown = [m for m in methods if m not in METHODS]
    return {m: _curve_style(m, METHODS.index(m) if m in METHODS else len(METHODS) + unknown.index(m))
            for m in methods}


def _curve_style(method: str, index: int) -> dict:
    if method == "poet":
        # A wide translucent band underneath, so baselines that match POET stay visible on top of it.
        return {"color": "#1f3f99", "linewidth": 7, "alpha": 0.3, "solid_capstyle": "round", "zorder": 1}
    return {"color": _COLOURS[index % len(_COLOURS)], "marker": _MARKERS[index % len(_MARKERS)], "markersize": 7,
            "fillstyle": "none", "markeredgewidth": 1.4, "linewidth": 1.2,
            "linestyle": _DASHES[index % len(_DASHES)], "zorder": 2 + index}


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
