"""Benchmark: our POET MILP against the dense published formulation, side by side, in one run.

For each reference graph and budget (the budgets of the graphs' README and the
planner issue's 50 %-of-activations / 1.5x budgets) it solves

* **ours**: :func:`schedules.milp.solve_poet_milp`, warm-started as
  :func:`schedules.plan` does (the least-energy heuristic baseline that fits;
  its time is included), one solver thread;
* **reference**: :mod:`benchmarks.reference_milp`, the dense formulation as published,
  PuLP + HiGHS, one thread (build time included),

and prints seconds, status, objective and proven gap of each, the speed-up and
the objectives' relative difference.  ``agree`` is ``yes`` when the objectives
match within 1e-6, ``in-gap`` when ours lies inside the interval the
reference proved (its bound to its incumbent), ``better`` when ours is below
the reference's incumbent, ``NO`` when ours lies below the reference's proven
bound (that would be a bug: the reductions must keep the optimum).

Run ``python -m benchmarks.solver`` (everything: the dense reference needs up
to its time limit per row, plus minutes to build resnet50), or e.g.
``python -m benchmarks.solver --quick --graphs vgg16_cifar_m4``.
This is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass


from benchmarks import reference_graph_dir
from benchmarks.reference_milp import solve_reference
from schedules.baselines import HEURISTIC_BASELINES, BaselineProblem, compute_ms, milp_peak_bytes
from schedules.graph import TrainingGraph
from schedules.matrices import Matrices
from schedules.milp import plan_energy, solve_poet_milp

HALF = "50%"  # memory budget: half the graph's forward activation bytes

# (graph, memory budget in bytes or HALF, runtime budget as a multiple of one plain step)
CASES: list[tuple[str, float | str, float]] = [
    ("linear_a72", 6_000, 1.2),
    ("vgg16_cifar_m4", 1_500_000, 1.5),
    ("resnet18_cifar_a72", 3_000_000, 7.6),
    ("resnet18_cifar_a72", 1_500_000, 1.5),
    ("resnet18_a72", 20_000_000, 1.5),
    ("resnet18_a72", HALF, 1.5),
    ("vgg16_a72", HALF, 1.5),
    ("resnet50_a72", HALF, 1.5),
    ("bert_a72", 200_000_000, 1.5),
    ("bert_a72", HALF, 1.5),
]

# The cases our solver proves optimal in seconds, and the budget of exactly one plain step (no recomputation
# time at all), which once made HiGHS refuse the model: ``--quick`` runs these, and the test suite solves them.
QUICK_CASES: list[tuple[str, float | str, float]] = [
    ("linear_a72", 6_000, 1.2),
    ("vgg16_cifar_m4", 1_500_000, 1.5),
    ("vgg16_cifar_m4", 1_500_000, 1.0),
    ("resnet18_cifar_a72", 3_000_000, 7.6),
]


def case_budgets(graph: TrainingGraph, memory: float | str, factor: float) -> tuple[float, float]:
    """(memory budget in bytes, runtime budget in ms) of a case on its graph."""
    budget = 0.5 * graph.forward_activation_bytes if memory == HALF else float(memory)
    return budget, factor * graph.total_compute_ms


@dataclass(frozen=True)
class Row:
    """One solve's figures for the table."""

    seconds: float
    status: str
    objective: float | None
    bound: float | None
    gap: float | None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", nargs="+", metavar="NAME",
                        help="graph names (file stems in the reference graph folder); default: every case")
    parser.add_argument("--time-limit", type=float, default=600.0,
                        help="seconds allowed to the dense reference per case (default 600)")
    parser.add_argument("--quick", action="store_true",
                        help="only the quick cases (QUICK_CASES), the reference limited to 60 s per case")
    parser.add_argument("--our-time-limit", type=float, default=60.0,
                        help="seconds allowed to our solver per case (default 60)")
    parser.add_argument("--gap", type=float, default=1e-6,
                        help="relative MIP gap our solver must prove (default 1e-6: optima comparable to 1e-6)")
    parser.add_argument("--reference-gap", type=float, default=None,
                        help="relative MIP gap for the reference (default: HiGHS' 1e-4, as published)")
    parser.add_argument("--no-warm-start", action="store_true", help="do not warm-start ours from the baselines")
    parser.add_argument("--no-reference", action="store_true", help="solve ours only")
    return parser.parse_args(argv)


def best_baseline(graph: TrainingGraph, memory: float, runtime_ms: float) -> Matrices | None:
    """The least-energy heuristic plan that fits both budgets in the MILP's accounting (as plan() picks)."""
    problem = BaselineProblem(graph, memory, runtime_ms)
    best: tuple[float, Matrices] | None = None
    for baseline in HEURISTIC_BASELINES.values():
        m = baseline(problem)
        if m is None or milp_peak_bytes(graph, m) > memory or compute_ms(graph, m.R) > runtime_ms * (1 + 1e-9):
            continue
        energy = plan_energy(graph, m)
        if best is None or energy < best[0]:
            best = (energy, m)
    return None if best is None else best[1]


def solve_ours(graph: TrainingGraph, memory: float, runtime_ms: float, args: argparse.Namespace) -> Row:
    started = time.perf_counter()
    start = None if args.no_warm_start else best_baseline(graph, memory, runtime_ms)
    outcome = solve_poet_milp(graph, memory_budget=memory, runtime_budget_ms=runtime_ms, gap=args.gap,
                              time_limit=args.our_time_limit, warm_start=start, threads=1)
    return Row(time.perf_counter() - started, outcome.status, outcome.objective_j, outcome.bound_j, outcome.gap)


def solve_dense(graph: TrainingGraph, memory: float, runtime_ms: float, args: argparse.Namespace) -> Row:
    limit = 60.0 if args.quick else args.time_limit
    outcome = solve_reference(graph, memory_budget=memory, runtime_budget_ms=runtime_ms, time_limit=limit,
                              threads=1, gap=args.reference_gap)
    seconds = outcome.build_seconds + outcome.solve_seconds
    return Row(seconds, outcome.status, outcome.objective_j, outcome.bound_j, outcome.gap)


def agreement(ours: Row, ref: Row | None) -> tuple[str, str]:
    """(relative difference, verdict) of the two objectives; see the module docstring."""
    if ref is None or ours.objective is None or ref.objective is None:
        return "-", "-"
    diff = (ours.objective - ref.objective) / ref.objective
    if abs(diff) <= 1e-6:
        return f"{diff:+.1e}", "yes"
    if ref.bound is not None and ours.objective < ref.bound * (1 - 1e-6):
        return f"{diff:+.1e}", "NO"
    if diff < 0:
        return f"{diff:+.1e}", "better"
    return f"{diff:+.1e}", "in-gap" if ref.bound is not None and ours.objective <= ref.objective else "worse"


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


COLUMNS = [  # (title, width); negative width: left-aligned
    ("graph", -19), ("memory (B)", 13), ("rt", 4),
    ("ours s", 7), ("status", -9), ("objective (J)", 14), ("gap", 8),
    ("ref s", 7), ("status", -9), ("objective (J)", 14), ("gap", 8),
    ("speed-up", 8), ("rel diff", 9), ("agree", -6),
]


def table_line(cells: list[str]) -> str:
    """Cells padded to the column widths, two spaces apart."""
    return "  ".join(c.ljust(-w) if w < 0 else c.rjust(w) for c, (_, w) in zip(cells, COLUMNS))


def print_row(name: str, memory: float, factor: float, ours: Row, ref: Row | None) -> None:
    diff, verdict = agreement(ours, ref)
    ratio = "-" if ref is None else f"{ref.seconds / max(ours.seconds, 1e-9):.0f}x"
    print(table_line([
        name, f"{memory:,.0f}", f"{factor:g}",
        f"{ours.seconds:.2f}", ours.status, fmt(ours.objective, ".7f"), fmt(ours.gap, ".1e"),
        fmt(ref and ref.seconds, ".1f"), ref.status if ref else "-", fmt(ref and ref.objective, ".7f"),
        fmt(ref and ref.gap, ".1e"), ratio, diff, verdict,
    ]), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    graphs = reference_graph_dir()
    if graphs is None:
        print("no POET reference graphs: put shared/bench/poet_graphs beside the checkout or set POET_GRAPHS",
              file=sys.stderr)
        return 2
    cases = [c for c in (QUICK_CASES if args.quick else CASES) if args.graphs is None or c[0] in args.graphs]
    if not cases:
        print(f"no case matches {args.graphs}; graphs: {sorted({c[0] for c in CASES})}", file=sys.stderr)
        return 2
    print(f"one solver thread; ours: gap {args.gap:g}, limit {args.our_time_limit:g} s, "
          f"{'no warm start' if args.no_warm_start else 'warm start from the best baseline'}; "
          f"reference: gap {args.reference_gap or 'HiGHS default (1e-4)'}, "
          f"limit {60 if args.quick else args.time_limit:g} s")
    print(table_line([title for title, _ in COLUMNS]))
    for name, memory, factor in cases:
        graph = TrainingGraph.load(graphs / f"{name}.json")
        budget, runtime_ms = case_budgets(graph, memory, factor)
        ours = solve_ours(graph, budget, runtime_ms, args)
        ref = None if args.no_reference else solve_dense(graph, budget, runtime_ms, args)
        print_row(name, budget, factor, ours, ref)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
