"""Planning time: does ``plan()`` return within its time limit on every case of the executor benchmark?

``time_limit`` is the budget of the whole ``plan()`` call: the warm start's
heuristics, the MILP's phases and every replanning after an overlapped plan
misses its runtime budget in the executor's I/O timeline.  For each model and
memory budget of ``benchmarks.executor`` (the same zoo models and shapes, the
same fractions of M, M profiled on this machine the same way), this plans
exactly as that benchmark does (:func:`benchmarks.executor.plan_within_time`:
the tightest runtime budget first, looser ones while the timeline misses) and
times every ``plan()`` call on the wall clock.

Printed per call: model, budget (fraction of M), runtime budget, time limit,
wall seconds, wall / limit, status, the stop reason, and how many replanning
solves ran; then the worst wall / limit against the target of
:data:`TARGET`.  ``--quick`` runs smaller inputs and three budgets.

Run ``python -m benchmarks.plan_time [--time-limit 30] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.executor import BUDGETS, MODELS, parse_budgets, parse_models, plan_within_time, profile_model
from schedules.plan import PlanResult, plan

TARGET = 1.05  # plan() returns within its time limit plus 5%
QUICK_MODELS = "resnet18:8x3x32x32,bert:2x64"
QUICK_BUDGETS = "1.0,0.5,0.3"


@dataclass(frozen=True)
class Call:
    """One timed ``plan()`` call."""

    model: str
    fraction: float
    runtime_budget: float | None
    time_limit: float
    wall_s: float
    status: str
    stop_reason: str
    replans: int

    @property
    def ratio(self) -> float:
        return self.wall_s / self.time_limit


def time_model(name: str, shape: tuple[int, ...], fractions: list[float], swap: Path, time_limit: float,
               default_cut: bool) -> list[Call]:
    """Profile ``name`` as the executor benchmark does, then time every ``plan()`` call of each budget."""
    profiled = profile_model(name, shape, swap, default_cut)
    print(f"   {profiled.graph.size} nodes, M = {profiled.M / 1e6:.1f} MB", flush=True)
    calls: list[Call] = []
    for fraction in fractions:

        def timed(*args: Any, **kwargs: Any) -> PlanResult:
            started = time.monotonic()
            result = plan(*args, **kwargs)
            wall = time.monotonic() - started
            calls.append(Call(name, fraction, kwargs.get("runtime_budget"), time_limit, wall, result.status,
                              result.stop_reason, result.replans))
            print_call(calls[-1])
            return result

        plan_within_time(profiled.graph, profiled.device, int(fraction * profiled.M), time_limit, planner=timed)
    return calls


HEADER = (f"{'model':>10} {'budget':>7} {'rt':>5} {'limit s':>8} {'wall s':>8} {'wall/limit':>10} "
          f"{'status':>11} {'stop reason':>29} {'replans':>7}")


def print_call(c: Call) -> None:
    rt = f"{c.runtime_budget:g}" if c.runtime_budget else "-"
    flag = "" if c.ratio <= TARGET else "  over"
    print(f"{c.model[:10]:>10} {c.fraction:>7.0%} {rt:>5} {c.time_limit:>8.1f} {c.wall_s:>8.2f} {c.ratio:>10.3f} "
          f"{c.status[:11]:>11} {c.stop_reason[:29]:>29} {c.replans:>7}{flag}", flush=True)


def print_summary(calls: list[Call]) -> bool:
    """The worst call against the target; True when every call met it."""
    print(f"\n{HEADER}")
    for c in calls:
        print_call(c)
    worst = max(calls, key=lambda c: c.ratio)
    met = worst.ratio <= TARGET
    print(f"\nworst wall/limit {worst.ratio:.3f} ({worst.model} at {worst.fraction:.0%}, runtime budget "
          f"{worst.runtime_budget or 'none'}) against the target {TARGET:.2f}: {'met' if met else 'MISSED'}; "
          f"{sum(c.replans > 0 for c in calls)} of {len(calls)} calls replanned")
    return met


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=30.0, help="plan()'s time_limit, seconds")
    parser.add_argument("--quick", action="store_true",
                        help=f"smaller inputs ({QUICK_MODELS}) at three budgets ({QUICK_BUDGETS})")
    parser.add_argument("--models", default=None, help=f"name:shape pairs from agent.zoo (default {MODELS})")
    parser.add_argument("--budgets", default=None, help=f"fractions of M (default {BUDGETS})")
    parser.add_argument("--default-cut", action="store_true", help="as benchmarks.executor --default-cut")
    parser.add_argument("--threads", type=int, default=1, help="torch threads while profiling")
    parser.add_argument("--json", type=Path, default=None, help="write every call's figures here")
    args = parser.parse_args(argv)
    models = args.models or (QUICK_MODELS if args.quick else MODELS)
    fractions = parse_budgets(args.budgets or (QUICK_BUDGETS if args.quick else BUDGETS))
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    calls: list[Call] = []
    print(HEADER)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as swap:
        for name, shape in parse_models(models):
            calls += time_model(name, shape, fractions, Path(swap), args.time_limit, args.default_cut)
    print_summary(calls)
    if args.json:
        args.json.write_text(json.dumps([{**asdict(c), "ratio": c.ratio} for c in calls], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
