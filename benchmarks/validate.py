"""Validation benchmark: the planner's predictions held against the executor's measurements, here.

For each model (resnet18 at 32x3x64x64, the BERT encoder at 8x128 by default)
and each memory budget as a fraction of M, the unconstrained activation peak
(store-all's):

1. profile this machine with the model (:func:`engine.profile.profile_workload`:
   node times and bytes, swap path, overlap, powers);
2. plan with POET at the budget (a budget below the graph's lower bound --
   the largest node plus its inputs -- is infeasible for every schedule; it is
   reported and raised to that bound, so the cost model is still checked there);
3. run the schedules through :class:`engine.validate.Validator`, their steps
   interleaved round-robin so that a shared machine's drift falls on all alike;
4. print predicted against measured step time, ledger peak, RSS growth and bytes
   paged, each with its error, against the targets: step time within 15%,
   ledger peak within 5%.  The 100% row pages and recomputes nothing, so its
   step-time error is the machine's drift between profiling and validating;
   ``rel err`` divides that drift out of the other rows.

Two step-time predictions are printed: the cost model validation holds to
the target (:func:`schedules.timeline.timeline_step_ms`: the schedule replayed
with the executor's single I/O thread, its prefetching and the profile's
measured overlap), and the planner's own, coarser one (compute, plus all
paging time when the profile says paging does not overlap compute, none when
it does), to show where the planner's runtime model goes wrong.  With ``--diagnose`` the nodes whose measured time
strays furthest from the graph's are listed.

With ``--meter`` (``auto``, or a meter kind; default ``none``) each step's
energy is accounted per node class by the executor and held against the
simulator's, the source named and the nominal-power estimate (the fallback
when no sensor answers) labelled as such; the default leaves the per-instruction
meter reads out of the timed steps.

Run ``python -m benchmarks.validate`` (``--help`` for the options).  The
defaults suit the shared 2-vCPU machine this project is developed on: one
compute thread (a pool of two stalls for whole scheduler slices when other
processes compete for the cores) and the load average printed beside the
figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from engine.energy import EnergyMeter, MeterConfig, detect_meter
from engine.rss import return_freed_memory
from engine.validate import ValidationReport, Validator
from agent.zoo import load_workload, parse_shape
from schedules.budgets import memory_lower_bound, store_all_peak
from schedules.plan import plan
from engine.profile import device_estimate, profile_workload

TARGETS = {"step time": 15.0, "ledger peak": 5.0}
DEFAULT_MODELS = ("resnet18:32x3x64x64", "bert:8x128")


@dataclass
class Row:
    """One model at one budget: what was planned and how the prediction held."""

    model: str
    fraction: float
    budget: int
    note: str
    status: str
    step_pred_ms: float | None = None
    step_timeline_ms: float | None = None
    step_meas_ms: float | None = None
    step_err: float | None = None
    timeline_err: float | None = None
    relative_err: float | None = None
    ledger_err: float | None = None
    rss_err: float | None = None
    paged_pred: int | None = None
    paged_meas: int | None = None
    io_wait_ms: float | None = None
    load: float | None = None
    energy: dict[str, list[float | None]] | None = None  # row name -> [predicted J, measured J, error %]
    energy_source: str = ""


def bench_model(spec: str, fractions: list[float], args: argparse.Namespace, swap: Path) -> list[Row]:
    """Profile, plan each budget and validate the schedules with interleaved steps."""
    name, _, shape = spec.partition(":")
    work = load_workload(name, parse_shape(shape) if shape else None)
    print(f"\n== {name} {shape}: profiling (load {os.getloadavg()[0]:.1f}) ...", file=sys.stderr, flush=True)
    profile, segments = profile_workload(work.model, work.example, work.loss_fn, swap, name=name,
                                         repeats=args.repeats, segments=work.segments)
    graph, device = profile.graph, profile.device
    peak, floor = store_all_peak(graph), memory_lower_bound(graph)
    print(_profile_line(name, profile, peak, floor), flush=True)
    meter = _open_meter(args.meter, device)
    rows, validators, planned = [], [], set()
    for fraction in fractions:
        budget, note = int(fraction * peak), ""
        if budget < floor:
            budget, note = floor, f"{100 * fraction:.0f}% infeasible (< lower bound {floor / peak:.0%}): raised"
        if budget in planned:
            rows.append(Row(name, fraction, budget, note + "; same budget as above, not run again", "same"))
            continue
        planned.add(budget)
        result = plan(graph, device, memory_budget=budget, time_limit=args.time_limit, gap=args.gap)
        rows.append(Row(name, fraction, budget, note, result.status))
        if result.feasible:
            validators.append((rows[-1], Validator(work, graph, segments, result.schedule, swap_dir=swap,
                                                   device=device, meter=meter)))
    try:
        _interleave([v for _, v in validators], args.warmup, args.steps)
    finally:
        if meter is not None:
            meter.close()
    for row, v in validators:
        _fill(row, v.report())
        v.close()
        if args.diagnose:
            _diagnose(v.report(), graph)
    _relative_to_plain(rows, peak)
    return rows


def _open_meter(kind: str, device: Any) -> EnergyMeter | None:
    """The meter ``--meter`` asks for (the profile's nominal powers as the estimate), or ``None``."""
    if kind == "none":
        return None
    detection = detect_meter(MeterConfig(kind=kind), powers=device_estimate(device).powers)
    print(detection.describe(), file=sys.stderr, flush=True)
    return detection.meter


def _relative_to_plain(rows: list[Row], peak: int) -> None:
    """Error of the predicted slowdown over the unconstrained row measured in the same run.

    The unconstrained schedule pages and recomputes nothing, so its error is
    the drift of the machine between profiling and validating; dividing it out
    leaves the error of the cost model's paging and recomputation terms.
    """
    plain = next((r for r in rows if r.budget >= peak and r.step_meas_ms), None)
    if plain is None:
        return
    for r in rows:
        if r.step_meas_ms:
            predicted = r.step_timeline_ms / plain.step_timeline_ms
            r.relative_err = 100.0 * ((r.step_meas_ms / plain.step_meas_ms) / predicted - 1.0)


def _interleave(validators: list[Validator], warmup: int, steps: int) -> None:
    for k in range(warmup + steps):
        for v in validators:
            v.step(measured=k >= warmup)


def _fill(row: Row, report: ValidationReport) -> None:
    planner, timeline = report.figure("planner step"), report.figure("step time")
    row.step_pred_ms, row.step_meas_ms, row.step_err = planner.predicted, planner.measured, planner.error_pct
    row.step_timeline_ms, row.timeline_err = timeline.predicted, timeline.error_pct
    row.ledger_err = report.figure("ledger peak").error_pct
    row.rss_err = report.figure("RSS growth").error_pct
    paged = report.figure("bytes paged")
    row.paged_pred, row.paged_meas = int(paged.predicted), int(paged.measured)
    row.io_wait_ms = statistics.median(s.io_wait_seconds for s in report.stats) * 1e3
    row.load = os.getloadavg()[0]
    if report.energy:
        row.energy = {f.name: [f.predicted, f.measured, f.error_pct] for f in report.figures
                      if f.name.startswith("energy")}
        row.energy_source = report.energy_source + (" (estimate)" if report.energy_is_estimate else "")


def _profile_line(name: str, profile: Any, peak: int, floor: int) -> str:
    d = profile.device
    return (f"{name}: {profile.graph.size} nodes, plain step {profile.graph.total_compute_ms:,.1f} ms, "
            f"M = {peak / 1e6:.2f} MB, lower bound {floor / 1e6:.2f} MB ({floor / peak:.0%} of M); "
            f"page-out {d.pageout_bandwidth_bps / 1e6:,.0f} MB/s + {d.pageout_latency_s * 1e3:.2f} ms, "
            f"page-in {d.pagein_bandwidth_bps / 1e6:,.0f} MB/s + {d.pagein_latency_s * 1e3:.2f} ms, "
            f"overlap {profile.overlap.hidden_fraction:.0%} hidden")


def _diagnose(report: ValidationReport, graph: Any, worst: int = 6) -> None:
    rows = sorted(report.node_time_errors(), key=lambda r: -abs(r[2] - r[1]))[:worst]
    for node, predicted, measured in rows:
        print(f"    node {node:3d} {graph.nodes[node].name:<24} predicted {predicted:8.2f} ms  "
              f"measured {measured:8.2f} ms")


def print_table(rows: list[Row]) -> None:
    """The figures, one row per model and budget, with the targets' verdicts."""
    head = (f"{'model':<9} {'budget':>16} {'status':>9} {'planner':>9} {'timeline':>9} {'measured':>9} "
            f"{'pl err':>7} {'tl err':>7} {'rel err':>7} {'ledger':>7} {'RSS':>7} {'paged MB':>13} "
            f"{'I/O wait':>9} {'load':>5}")
    print("\n" + head)
    for r in rows:
        budget = f"{100 * r.fraction:.0f}% {r.budget / 1e6:.2f}MB"
        if r.step_meas_ms is None:
            print(f"{r.model:<9} {budget:>16} {r.status:>9}  {r.note}")
            continue
        paged = f"{r.paged_pred / 1e6:.1f}/{r.paged_meas / 1e6:.1f}"
        print(f"{r.model:<9} {budget:>16} {r.status:>9} {r.step_pred_ms:9.1f} {r.step_timeline_ms:9.1f} "
              f"{r.step_meas_ms:9.1f} {_pct(r.step_err):>7} {_pct(r.timeline_err):>7} {_pct(r.relative_err):>7} "
              f"{_pct(r.ledger_err):>7} "
              f"{_pct(r.rss_err):>7} {paged:>13} {r.io_wait_ms:8.1f}ms {r.load:5.1f}  {r.note}")
    print(f"targets: |step time error| <= {TARGETS['step time']:.0f}%, |ledger peak error| <= "
          f"{TARGETS['ledger peak']:.0f}%.  pl err: the planner's model; tl err: the I/O-timeline model; "
          "rel err: the timeline's predicted slowdown over the 100% row against the measured one (machine "
          "drift between profile and validation divided out)")
    for r in rows:
        if r.step_err is None:
            continue
        verdict = ["step time (timeline) " + ("ok" if abs(r.timeline_err) <= TARGETS["step time"] else "MISSED"),
                   "ledger peak " + ("ok" if abs(r.ledger_err) <= TARGETS["ledger peak"] else "MISSED"),
                   "planner's own model " + ("within" if abs(r.step_err) <= TARGETS["step time"] else "outside")
                   + " 15%"]
        print(f"  {r.model} at {100 * r.fraction:.0f}%: " + ", ".join(verdict))
    for r in rows:
        if r.energy:
            figures = ", ".join(f"{name} {_joules(p)} / {_joules(m)} ({_pct(e)})"
                                for name, (p, m, e) in r.energy.items())
            print(f"  {r.model} at {100 * r.fraction:.0f}%: predicted / measured above idle: {figures}; "
                  f"source {r.energy_source}")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def _joules(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g} J"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help="comma-separated NAME:SHAPE (default resnet18:32x3x64x64,bert:8x128)")
    parser.add_argument("--budgets", default="1.0,0.5,0.3", help="fractions of M (default 1.0,0.5,0.3)")
    parser.add_argument("--steps", type=int, default=8, help="measured steps per schedule (default 8)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps first (default 1)")
    parser.add_argument("--repeats", type=int, default=7, help="profile: timed runs per node (default 7)")
    parser.add_argument("--threads", type=int, default=1, help="torch compute threads (default 1)")
    parser.add_argument("--time-limit", type=float, default=120.0, help="MILP time limit per budget, s")
    parser.add_argument("--gap", type=float, default=0.01, help="MILP relative gap (default 0.01)")
    parser.add_argument("--swap-dir", help="where to page (default a temporary directory under the repo)")
    parser.add_argument("--meter", default="none", choices=("none", "auto", "ina3221", "rapl", "estimate"),
                        help="energy meter for the energy figures (default none; auto falls back to the profile's "
                             "nominal-power estimate)")
    parser.add_argument("--diagnose", action="store_true", help="list the nodes whose times stray most")
    parser.add_argument("--json", help="write every figure to this file")
    args = parser.parse_args()
    return_freed_memory()  # the profile and the steps under one allocator; honest RSS
    torch.set_num_threads(args.threads)
    fractions = [float(f) for f in args.budgets.split(",")]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="poet-validate-", dir=args.swap_dir or Path.cwd()) as swap:
        rows = [row for spec in args.models.split(",") for row in bench_model(spec, fractions, args, Path(swap))]
    print_table(rows)
    print(f"({time.perf_counter() - started:.0f} s, {args.threads} thread(s), torch {torch.__version__})")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
