"""Hold a schedule's predictions against measurements: run it on its model and compare.

::

    report = validate(workload, graph, segments, schedule, swap_dir="/tmp/swap", steps=5, device=profile)
    print(report.table())
    plot_memory(report, "memory.png")

:func:`predict` says what the planner's cost model expects from one step
(:mod:`schedules.simulate` on the graph, plus paging time where the device
profile says paging does not overlap compute); :func:`validate` runs
``warmup + steps`` real steps through :class:`engine.executor.Executor` and
compares, each with the error in percent (``(measured - predicted) /
predicted``), median over the measured steps:

* step time: :func:`timeline_step_ms`, the schedule replayed with the
  executor's I/O thread and prefetching beside compute; measured: the median
  ``StepStats.step_seconds``;
* planner step: the planner's own model -- the simulated compute time, plus
  all paging time where the profile says paging does not overlap compute,
  none where it does -- against the same measurement;
* ledger peak: the simulated peak of resident activation bytes; measured:
  the largest ``StepStats.ledger_peak_bytes``;
* RSS growth: simulated activations plus the parameter gradients allocated
  so far; measured: the median peak RSS above the step's starting RSS;
* bytes paged: simulated bytes paged out and in; measured: ``StepStats.bytes_paged``;
* energy: the simulated energy above idle, in total and per node class
  (compute, page-in, page-out); measured: the executor's per-class account
  (``StepStats.energy``, see :mod:`engine.executor` for what each class holds)
  minus idle power over each class's time, and the meter over the step minus
  idle power over the step.

Energy is compared wherever a meter exists; each energy row names its source,
and figures from the nominal-power estimate say ``estimate``: they are the
profile's powers times the measured time of each class, so their error is
the time error of that class, not a measurement of power.  The measured
page-in and page-out classes hold only the paging the step waited for (I/O
overlapped with compute is drawn while computing and lands in compute),
while the simulator prices all paging: where paging overlaps, expect the
paging rows below and the compute row above their predictions, the total
comparable.  The RSS prediction adds to the resident activations
the parameter gradients the step allocates (they start each step as
``None``); the RSS growth also holds what no graph counts (the backward
pass's transient working memory, allocator slack), so it is expected somewhat
above the prediction: it shows how far the activation budget is from the
process's real footprint.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from engine.energy import EnergyMeter
from engine.ledger import StepStats
from engine.parity import ParityReport, check_parity
from schedules.device import DeviceProfile, paging_time_ms, price_graph
from schedules.graph import TrainingGraph
from schedules.schedule import Schedule
from schedules.simulate import simulate
from schedules.timeline import timeline_step_ms


@dataclass(frozen=True)
class Prediction:
    """What the cost model expects from one step of a schedule.

    ``step_ms`` is the I/O-timeline model's step time (:func:`timeline_step_ms`;
    the compute time without a device profile); ``planner_step_ms`` the
    planner's own model, compute plus ``paging_ms`` -- all paging time where
    the profile says paging does not overlap compute, else none.
    ``resident[k]`` is the simulated resident bytes after instruction ``k``.
    """

    step_ms: float
    planner_step_ms: float
    compute_ms: float
    paging_ms: float
    peak_bytes: int
    bytes_paged: int
    energy_j: float | None
    resident: tuple[int, ...]
    node_compute_ms: tuple[float, ...]
    rss_peak_bytes: int = 0
    class_energy_j: dict[str, float] | None = None
    """Predicted energy above idle per node class (``compute``, ``page_in``, ``page_out``, the keys
    of :attr:`engine.energy.StepEnergy.joules`); ``None`` where ``energy_j`` is."""


def predict(graph: TrainingGraph, schedule: Schedule, device: DeviceProfile | None = None,
            gradient_bytes: Sequence[int] | None = None, hidden_fraction: float | None = None) -> Prediction:
    """The cost model's prediction for one step of ``schedule`` on ``graph``.

    The step time comes from :func:`timeline_step_ms` with ``device`` and
    ``hidden_fraction`` (the share of paging hidden behind compute; by default
    the device's own), and also from the planner's simpler model; energies come from
    the graph, priced with ``device`` where it has none.  ``gradient_bytes[i]`` (see :func:`gradient_bytes_per_node`)
    is what backward node ``i`` allocates for parameter gradients; the RSS
    prediction is the most, after any instruction, of resident activations
    plus the gradients allocated so far.
    """
    schedule.check_graph(graph)
    priced = price_graph(graph, device) if device is not None else graph
    # Plain instructions: the schedule's own budgets were checked when it was planned and
    # are checked again by the executor; here only the figures are wanted.
    base = simulate(priced, list(schedule.instructions))
    paging = 0.0
    if device is not None and not device.paging_overlaps_compute:
        with_paging = simulate(priced, list(schedule.instructions), paging_time_ms=paging_time_ms(priced, device))
        paging = with_paging.runtime_ms - base.runtime_ms
    counts = [0] * graph.size
    for op, node in schedule.instructions:
        counts[node] += op == "compute"
    rss_peak = _rss_peak(schedule, base.resident_bytes, gradient_bytes or [0] * graph.size)
    step = timeline_step_ms(graph, schedule, device, hidden_fraction) if device is not None else base.runtime_ms
    return Prediction(
        step_ms=step, planner_step_ms=base.runtime_ms + paging, compute_ms=base.runtime_ms, paging_ms=paging,
        peak_bytes=base.peak_bytes, bytes_paged=base.bytes_paged_out + base.bytes_paged_in,
        energy_j=base.energy_j if priced.has_energy else None, resident=base.resident_bytes,
        node_compute_ms=tuple(c * n.compute_ms for c, n in zip(counts, graph.nodes)), rss_peak_bytes=rss_peak,
        class_energy_j={"compute": base.compute_energy_j, "page_in": base.pagein_energy_j,
                        "page_out": base.pageout_energy_j} if priced.has_energy else None,
    )


def _rss_peak(schedule: Schedule, resident: Sequence[int], gradient_bytes: Sequence[int]) -> int:
    grads, peak = 0, 0
    for (op, node), activations in zip(schedule.instructions, resident):
        if op == "compute":
            grads += gradient_bytes[node]  # backward nodes compute once: no double count
        peak = max(peak, activations + grads)
    return peak


def gradient_bytes_per_node(model: Any, segments: Any) -> list[int]:
    """Bytes of parameter gradients each backward node allocates (gradients start the step as ``None``).

    A parameter shared by several units is charged to the backward node that
    runs first (the last unit in forward order), where its ``.grad`` appears.
    """
    modules = dict(model.named_modules())
    out = [0] * segments.size
    seen: set[int] = set()
    for forward in range(len(segments.units), 0, -1):
        for name in segments.units[forward - 1].modules:
            for p in modules[name].parameters():
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    out[segments.backward_of(forward)] += p.nbytes
    return out


@dataclass(frozen=True)
class Figure:
    """One predicted-against-measured row."""

    name: str
    unit: str
    predicted: float | None
    measured: float | None
    note: str = ""

    @property
    def error_pct(self) -> float | None:
        """``100 * (measured - predicted) / predicted``; ``None`` when either is missing or predicted is 0."""
        if self.predicted is None or self.measured is None:
            return None
        if self.predicted == 0:
            return 0.0 if self.measured == 0 else None
        return 100.0 * (self.measured - self.predicted) / self.predicted


@dataclass(frozen=True)
class ValidationReport:
    """The figures, the prediction, every measured step's stats and, with a meter, its ``(joules, seconds)``.

    ``energy_source`` is the meter's source (empty without one) and
    ``energy_is_estimate`` whether it is the nominal-power estimate.
    """

    figures: tuple[Figure, ...]
    prediction: Prediction
    stats: tuple[StepStats, ...]
    energy: tuple[tuple[float, float], ...]
    budget: int | None
    energy_source: str = ""
    warmup: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    energy_is_estimate: bool = False
    parity: ParityReport | None = None

    def figure(self, name: str) -> Figure:
        """The row called ``name``: ``step time``, ``planner step``, ``ledger peak``, ``RSS growth``,
        ``bytes paged``, ``energy`` and, with a meter, ``energy compute``, ``energy page-in``, ``energy page-out``."""
        for f in self.figures:
            if f.name == name:
                return f
        raise KeyError(f"no figure {name!r}; figures: {', '.join(f.name for f in self.figures)}")

    def table(self) -> str:
        """The rows as aligned text: figure, predicted, measured, error, note."""
        width = max(12, *(len(f.name) for f in self.figures))
        lines = [f"{'figure':<{width}} {'predicted':>14} {'measured':>14} {'error':>9}  note"]
        for f in self.figures:
            err = "-" if f.error_pct is None else f"{f.error_pct:+.1f}%"
            lines.append(f"{f.name:<{width}} {_fmt(f.predicted, f.unit):>14} {_fmt(f.measured, f.unit):>14} "
                         f"{err:>9}  {f.note}")
        if self.parity is not None:
            lines.append(f"{'gradients':<{width}} {self.parity.summary()}")
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def node_time_errors(self) -> list[tuple[int, float, float]]:
        """``(node, predicted_ms, measured_ms)`` per node, summed over recomputations, median step."""
        measured = [statistics.median(s.node_seconds[i] for s in self.stats) * 1e3
                    for i in range(len(self.prediction.node_compute_ms))]
        return [(i, p, m) for i, (p, m) in enumerate(zip(self.prediction.node_compute_ms, measured))]


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "B":
        return f"{value / 1e6:,.2f} MB"
    if unit == "ms":
        return f"{value:,.1f} ms"
    return f"{value:.4g} {unit}"


# -- running ------------------------------------------------------------------------------
def validate(
    workload: Any,
    graph: TrainingGraph,
    segments: Any,
    schedule: Schedule,
    *,
    swap_dir: str | Path | None = None,
    steps: int = 3,
    warmup: int = 1,
    device: DeviceProfile | None = None,
    meter: EnergyMeter | None = None,
    hidden_fraction: float | None = None,
    parity: bool = False,
) -> ValidationReport:
    """Run ``warmup + steps`` steps of ``schedule`` on ``workload`` and compare with :func:`predict`.

    Parameters
    ----------
    workload:
        An :class:`engine.workload.Workload` (model, inputs, targets, loss): the
        model the graph and segments were extracted from.
    graph, segments:
        What :func:`engine.extract.extract` returned for it (``graph`` may be
        a profile's, whose fingerprint equals the extraction's).
    swap_dir:
        Where the executor pages; needed when the schedule pages.
    steps, warmup:
        Measured steps, and steps run first and not counted (allocator and
        thread-pool warm-up).
    device:
        The profile the figures are predicted with (paging overlap, powers).
    meter:
        An energy meter (started here if it is not; the caller closes it):
        the executor accounts each step's energy per node class with it.
    hidden_fraction:
        Share of paging time hidden behind compute; by default the device's own
        (``paging_hidden_fraction``, which ``poet-edge profile`` measures; 1 or 0
        from ``paging_overlaps_compute`` where a profile has none).
    parity:
        First run one step against plain autograd on a copy of the model
        (:func:`engine.parity.check_parity`, not a measured step); the report's
        ``parity`` says whether everything was identical bit for bit.

    The process's allocator is left as it is: call
    :func:`engine.rss.return_freed_memory` first (as ``poet-edge`` does, for the
    profile too) for an honest peak RSS.
    """
    with Validator(workload, graph, segments, schedule, swap_dir=swap_dir, device=device, meter=meter,
                   hidden_fraction=hidden_fraction) as v:
        if parity:
            v.check_parity()
        for k in range(warmup + steps):
            v.step(measured=k >= warmup)
        return v.report()


class Validator:
    """One schedule's executor, stepped on demand; :func:`validate` in pieces.

    Benchmarks interleave the steps of several validators, so that a shared
    machine's drift falls on all schedules alike.
    """

    def __init__(self, workload: Any, graph: TrainingGraph, segments: Any, schedule: Schedule, *,
                 swap_dir: str | Path | None = None, device: DeviceProfile | None = None,
                 meter: EnergyMeter | None = None, hidden_fraction: float | None = None) -> None:
        from engine.executor import Executor

        self.workload, self.schedule, self.device, self.meter = workload, schedule, device, meter
        self.prediction = predict(graph, schedule, device, gradient_bytes_per_node(workload.model, segments),
                                  hidden_fraction)
        self.executor = Executor(workload.model, segments, graph, schedule, swap_dir=swap_dir, meter=meter)
        self.records: list[StepStats] = []
        self.warmup = 0
        self.parity: ParityReport | None = None

    def check_parity(self) -> ParityReport:
        """One step through the executor against plain autograd on a copy of the model (not a measured
        step; gradients cleared after it); the report carries the result."""
        self.parity = check_parity(self.executor, self.workload)
        self.workload.model.zero_grad(set_to_none=True)
        return self.parity

    def step(self, measured: bool = True) -> StepStats:
        """Run one step (gradients cleared after it); keep its figures when ``measured``."""
        self.executor.step(self.workload.inputs, self.workload.targets)
        stats = self.executor.last_stats
        self.workload.model.zero_grad(set_to_none=True)
        if measured:
            self.records.append(stats)
        else:
            self.warmup += 1
        return stats

    def report(self) -> ValidationReport:
        """Predicted against measured over the measured steps so far."""
        if not self.records:
            raise ValueError("no measured step yet: call step() first")
        report = _report(self.prediction, self.records, self.schedule, self.device, self.meter, self.warmup)
        return replace(report, parity=self.parity)

    def close(self) -> None:
        """Stop the executor's pager and remove its files."""
        self.executor.close()

    def __enter__(self) -> "Validator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _report(p: Prediction, stats: Sequence[StepStats], schedule: Schedule, device: DeviceProfile | None,
            meter: EnergyMeter | None, warmup: int) -> ValidationReport:
    rss = [s.peak_rss_growth_bytes for s in stats if s.peak_rss_growth_bytes is not None]
    overlap = "paging taken as overlapped" if device is None or device.paging_overlaps_compute else \
        f"+ {p.paging_ms:,.1f} ms paging"
    step_ms = statistics.median(s.step_seconds for s in stats) * 1e3
    figures = [
        Figure("step time", "ms", p.step_ms, step_ms,
               "I/O-thread timeline model" if device is not None else "compute only (no device profile)"),
        Figure("planner step", "ms", p.planner_step_ms, step_ms,
               f"the planner's model: compute {p.compute_ms:,.1f} ms, {overlap}"),
        Figure("ledger peak", "B", p.peak_bytes, max(s.ledger_peak_bytes for s in stats),
               f"budget {schedule.memory_budget / 1e6:,.2f} MB" if schedule.memory_budget else "unconstrained"),
        Figure("RSS growth", "B", p.rss_peak_bytes, statistics.median(rss) if rss else None,
               "peak RSS over the step's start vs activations + parameter gradients allocated so far"
               if rss else "not measurable here"),
        Figure("bytes paged", "B", p.bytes_paged, statistics.median(s.bytes_paged for s in stats),
               f"I/O thread busy {statistics.median(s.io_seconds for s in stats) * 1e3:,.1f} ms, step waited "
               f"{statistics.median(s.io_wait_seconds for s in stats) * 1e3:,.1f} ms"),
        *_energy_figures(p, stats, device, meter),
    ]
    notes = [] if device is not None else ["no device profile given: paging time counted as overlapped"]
    if meter is not None:
        kind = "estimate from nominal powers, not a measurement" if meter.is_estimate else "measured"
        notes.append(f"energy source: {meter.source} ({kind})")
    energy = tuple((s.energy.total_joules, s.energy.total_seconds) for s in stats if s.energy is not None)
    return ValidationReport(tuple(figures), p, tuple(stats), energy, schedule.memory_budget,
                            meter.source if meter is not None else "", warmup, tuple(notes),
                            meter is not None and meter.is_estimate)


_CLASS_ROWS = (("compute", "energy compute"), ("page_in", "energy page-in"), ("page_out", "energy page-out"))


def _energy_figures(p: Prediction, stats: Sequence[StepStats], device: DeviceProfile | None,
                    meter: EnergyMeter | None) -> list[Figure]:
    """The step's energy above idle and each node class's, predicted against the executor's account."""
    energies = [s.energy for s in stats if s.energy is not None]
    if meter is None or not energies:
        return [Figure("energy", "J", p.energy_j, None, "not compared: no energy meter")]
    idle_w = device.idle_power_w if device is not None else 0.0
    source = f"{meter.source} (nominal powers x measured time)" if meter.is_estimate else meter.source
    total = statistics.median(e.total_joules - idle_w * e.total_seconds for e in energies)
    out = [Figure("energy", "J", p.energy_j, total, f"{source}, minus idle {idle_w:.2f} W over the step")]
    for key, name in _CLASS_ROWS:
        predicted = p.class_energy_j[key] if p.class_energy_j is not None else None
        measured = statistics.median(e.joules[key] - idle_w * e.seconds[key] for e in energies)
        seconds = statistics.median(e.seconds[key] for e in energies)
        out.append(Figure(name, "J", predicted, measured, f"{seconds * 1e3:,.1f} ms {_CLASS_NOTES[key]}"))
    return out


# What the executor charges to each class (engine.executor's docstring): the I/O thread overlaps compute.
_CLASS_NOTES = {
    "compute": "computing, and any paging the I/O thread did meanwhile",
    "page_in": "waiting for reads (reads beside compute are in compute)",
    "page_out": "queueing writes and waiting for them (writes beside compute are in compute)",
}


# -- memory honesty ---------------------------------------------------------------------
# -- plot ---------------------------------------------------------------------------------
def plot_memory(report: ValidationReport, path: str | Path, title: str = "") -> Path:
    """Draw predicted and measured memory over one step (see :func:`memory_figure`); write a PNG to ``path``."""
    fig = memory_figure(report, title)
    out = Path(path)
    fig.savefig(out, dpi=120)
    return out


RSS_GROWTH_NOTE = "RSS growth: the process's resident memory\nabove its size at the step's start"


def memory_labels(report: ValidationReport) -> dict[str, str]:
    """The texts of :func:`memory_figure`, by role: ``budget``, ``rss_predicted``, ``rss_measured``, ``gap``.

    Each says what its line holds, so the figure reads without the README: the
    budget with its value; the RSS lines as whole-process growth that also
    holds the parameter gradients allocated during backward (and, measured,
    the backward pass's working memory and allocator slack), none of which the
    activation budget bounds; ``gap`` the distance from the predicted
    activation peak to the predicted RSS peak.  Roles without a line are left out.
    """
    labels: dict[str, str] = {}
    if report.budget is not None:
        labels["budget"] = f"activation budget {report.budget / 1e6:,.2f} MB"
    rss = report.figure("RSS growth")
    if rss is not None and rss.predicted:
        labels["rss_predicted"] = (f"predicted peak RSS growth {rss.predicted / 1e6:,.2f} MB:\n"
                                   "activations + parameter gradients allocated\nso far in backward")
        gap = rss.predicted - report.prediction.peak_bytes
        if gap > 0:
            labels["gap"] = (f"+{gap / 1e6:,.2f} MB above the activation peak: parameter gradients\n"
                             "allocated during backward, outside the activation budget")
    if rss is not None and rss.measured is not None and math.isfinite(rss.measured):
        labels["rss_measured"] = (f"measured peak RSS growth {rss.measured / 1e6:,.2f} MB:\n"
                                  "as predicted, plus the backward pass's\nworking memory and allocator slack")
    return labels


def memory_figure(report: ValidationReport, title: str = ""):
    """A matplotlib ``Figure`` (Agg canvas, no pyplot) of memory over the last measured step.

    Step lines: resident activation bytes after each instruction, predicted
    by the simulator and measured by the executor's ledger; the activation
    budget is a horizontal line labelled with its value.  The predicted and
    measured peak RSS growth are horizontal lines too: they sit above the
    budget because they also hold memory outside it (:func:`memory_labels`),
    which an arrow from the activation peak to the predicted RSS peak spells out.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MplFigure

    labels = memory_labels(report)
    predicted = [b / 1e6 for b in report.prediction.resident]
    measured = [b / 1e6 for b in report.stats[-1].ledger]
    fig = MplFigure(figsize=(12, 5.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.step(range(len(predicted)), predicted, where="post", label="predicted activations (simulator)", linewidth=2.2)
    ax.step(range(len(measured)), measured, where="post", label="measured activations (executor ledger)",
            linestyle="--")
    if "budget" in labels:
        budget = report.budget / 1e6
        ax.axhline(budget, color="black", linewidth=1, label=labels["budget"])
        ax.annotate(labels["budget"], xy=(0.0, budget), xycoords=("axes fraction", "data"), xytext=(4, 3),
                    textcoords="offset points", fontsize=9, va="bottom")
    rss = report.figure("RSS growth")
    if "rss_predicted" in labels:
        ax.axhline(rss.predicted / 1e6, color="tab:gray", linestyle=":", linewidth=1.5, label=labels["rss_predicted"])
    if "rss_measured" in labels:
        ax.axhline(rss.measured / 1e6, color="tab:red", linestyle=":", linewidth=1.5, label=labels["rss_measured"])
    if "rss_predicted" in labels or "rss_measured" in labels:
        ax.plot([], [], linestyle="none", label=RSS_GROWTH_NOTE)
    if "gap" in labels:
        low, high = report.prediction.peak_bytes / 1e6, rss.predicted / 1e6
        ax.axhline(low, xmin=0.93, xmax=1.0, color="tab:gray", linewidth=1)
        ax.annotate("", xy=(0.97, high), xytext=(0.97, low), xycoords=("axes fraction", "data"),
                    arrowprops={"arrowstyle": "<->", "color": "tab:gray"})
        ax.annotate(labels["gap"], xy=(0.96, (low + high) / 2), xycoords=("axes fraction", "data"), ha="right",
                    va="center", fontsize=9, color="0.25",
                    bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "0.8", "alpha": 0.9})
    ax.set_xlabel("instruction of the schedule (one training step)")
    ax.set_ylabel("memory (MB)")
    ax.set_ylim(bottom=0)
    ax.set_title(title or "resident memory over one step: predicted vs measured")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    ax.grid(alpha=0.3)
    return fig
