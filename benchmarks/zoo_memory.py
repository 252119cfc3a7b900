"""Every zoo model at budgets the planner accepts: the agent's step memory over 20 steps against budget.

For each model (the zoo's, at the benchmarks' inputs, cut as ``poet-edge profile`` cuts: refined), this machine
is profiled at the thread count and whole-step schedules are planned (least energy) at the tightest budget any
schedule fits and at half of a plain step's planned memory.  Each schedule then trains ``--steps`` steps (default
20) in a fresh process through the agent's own path (:class:`engine.training.Training`, its memory check on
with the agent's tolerance, its allocator), as :mod:`benchmarks.memory` runs ``ours``.  Printed per row: the
budget, the largest step memory the agent's check measured (the step's RSS above training's start, plus what
the model's first run left in the process's own memory), its share of the budget, the whole RSS growth above
the process with the model built (which also holds the libraries' code the kernels faulted in: file-backed,
not budgeted), and the steps the check stopped.  The target: no step over its budget plus tolerance.

``python -m benchmarks.zoo_memory [--models resnet18,mobilenet_v2,...] [--threads 1] [--steps 20] [--json F]``
(about 3 minutes a model on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.memory import MB, MODELS, _child, _row, plans_with_tightest, profile_in_child
from benchmarks.workloads import BENCH_MODELS

ZOO_MODELS = ("resnet18", "mobilenet_v2", "vgg11_bn", "unet", "bert", "gpt2", "llama", "vit", "swin_t")  # agent.zoo's
STEPS = 20
PLAN_TIME = 60.0  # seconds for the search of the smallest feasible budget


def check_model(name: str, threads: int, workdir: Path, steps: int) -> dict[str, Any]:
    """Profile ``name`` (refined cut), plan its tightest and half-of-plain schedules, train each ``steps`` steps."""
    from engine.training import DEFAULT_TOLERANCE_BYTES, OptimizerSettings
    from schedules.budgets import store_all_peak

    folder = workdir / f"{name}-t{threads}"
    print(f"\n== {name} {BENCH_MODELS[name].input}, {threads} thread(s): profiling (refined cut) ...", flush=True)
    graph, device = profile_in_child(name, threads, folder, refine=True)
    spec = OptimizerSettings(**MODELS[name]).spec()
    whole = store_all_peak(graph, spec)
    rows = []
    plans = plans_with_tightest(graph, device, spec, PLAN_TIME, whole, {"0.5 of plain": whole // 2})
    for label, (result, missing) in plans.items():
        if result is None:
            print(f"   {label}: {missing}", flush=True)
            continue
        row = _row(f"ours, {label}", result, folder, graph)
        figures = _child(name, row.run, folder, threads, steps=steps)
        rows.append({"label": label, "budget": row.budget, "agent_memory": figures["agent_memory"],
                     "rss_growth": figures["memory"], "over": figures["over"], "steps": steps})
        print(f"   {label}: budget {row.budget / MB:.1f} MB, the agent's figure "
              f"{(figures['agent_memory'] or 0) / MB:.1f} MB, over {figures['over']}", flush=True)
    return {"model": name, "input": BENCH_MODELS[name].input, "threads": threads, "plain_planned": whole,
            "runtime_bytes": graph.runtime_bytes, "tolerance": DEFAULT_TOLERANCE_BYTES, "rows": rows}


def report(results: list[dict[str, Any]]) -> bool:
    """The table; True when no step of any row went over its budget plus tolerance."""
    print(f"\n{'model':<14} {'threads':>7} {'row':<13} {'budget':>8} {'agent':>8} {'/budget':>8} {'RSS':>8} "
          f"{'over':>5}   (MB; agent: the largest step memory the agent's check measured, RSS: whole RSS growth)")
    met = True
    for result in results:
        for row in result["rows"]:
            agent = row["agent_memory"] or 0
            print(f"{result['model']:<14} {result['threads']:>7} {row['label']:<13} {row['budget'] / MB:8.1f} "
                  f"{agent / MB:8.1f} {agent / row['budget']:8.2f} {row['rss_growth'] / MB:8.1f} {row['over']:>5}")
            met = met and row["over"] == 0
    print(f"\n{'met ' if met else 'MISSED'}  no step over its budget plus the agent's tolerance "
          f"({results[0]['tolerance'] / MB:.1f} MB)" if results else "no models")
    return met


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.zoo_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(ZOO_MODELS),
                        help=f"comma-separated, of {', '.join(ZOO_MODELS)} (default all)")
    parser.add_argument("--threads", default="1", help="thread counts, comma-separated (default 1)")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"steps per schedule (default {STEPS})")
    parser.add_argument("--json", metavar="FILE", help="write every figure here")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in ZOO_MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {', '.join(ZOO_MODELS)}")
    with tempfile.TemporaryDirectory(prefix="poet-zoo-memory-", dir="/var/tmp") as scratch:
        results = [check_model(name, int(threads), Path(scratch), args.steps)
                   for name in models for threads in args.threads.split(",")]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if report(results) else 1


if __name__ == "__main__":
    sys.exit(main())
