"""The activation floor: the smallest activation budget a schedule reaches, against plain backpropagation's peak
and against the operator-level bound, for every architecture family, in one run.

For each model each figure is measured in this process, one model after the other:

* ``M``: plain backpropagation's activation peak with workspaces (store-all on the default cut, every value
  kept until its last reader, as the executor measures them);
* ``coarse floor``: the smallest budget POET's MILP finds a schedule for on the default cut (the segments a
  user would get without refinement);
* ``floor``: the same on the refined cut (:func:`engine.extract.extract` with ``refine=True``), with its node
  count;
* ``bound``: the operator-level bound (:mod:`engine.operator_bound`): the largest working set one autograd
  operator's backward needs, kernel scratch left out.

Printed: floor / M and floor / bound beside the targets (floor at most 0.35 of M for resnet18 and 0.25 for the
others, within 1.15x of the bound on all).  Where a language model's logits set the floor, the row says so.

``gpt2-32k-chunked`` is the 32,768-token GPT-2 with the opt-in chunked loss (:mod:`engine.chunked_loss`: not
bit-identical to plain cross-entropy); its M is the plain loss's.

``swin_t`` (torchvision's shifted-window transformer) is measured with ``--models swin_t``; ``--max-nodes N``
refines up to ``N`` nodes instead of extraction's default cap (:data:`engine.extract.REFINE_MAX_NODES`), to show
what the cap costs.

``python -m benchmarks.floor [--models resnet18,bert,gpt2,gpt2-32k,gpt2-32k-chunked,llama,vit] [--search-time S]
[--max-nodes N] [--json F]``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.workloads import BENCH_MODELS

FLOOR_MODELS = ("resnet18", "bert", "gpt2", "gpt2-32k", "gpt2-32k-chunked", "llama", "vit")  # of BENCH_MODELS
FLOOR_TARGET = {"resnet18": 0.35}  # floor over M; every other model 0.25
DEFAULT_FLOOR_TARGET = 0.25
BOUND_TARGET = 1.15


def smallest_budget(graph: Any, search_time: float) -> tuple[int | None, bool]:
    """POET's smallest feasible activation budget on ``graph`` (the Raspberry Pi 4 profile prices it: the floor
    does not depend on the prices), and whether the search proved it."""
    from schedules.budgets import smallest_feasible_budget
    from schedules.plan import plan

    search = smallest_feasible_budget(
        graph, lambda budget, limit: plan(graph, "rpi4", memory_budget=budget, time_limit=limit, gap=0.05),
        time_budget_s=search_time, probe_time_limit_s=min(60.0, search_time), rel_tolerance=0.01)
    return search.budget, search.exact


def measure(name: str, search_time: float, max_nodes: int | None = None) -> dict[str, Any]:
    """Every figure of one model's row."""
    import torch

    from engine.extract import extract
    from schedules.budgets import store_all_peak
    from schedules.floors import node_lower_bounds

    torch.set_num_threads(1)
    model = BENCH_MODELS[name]
    work = model.plain.build()  # M is plain training's, with or without a chunked loss
    plain, _ = extract(work.model, work.example, work.loss_fn, segments=work.segments, repeats=2, refine=False)
    coarse = plain
    if model.chunked_loss:
        work = model.build()
        coarse, _ = extract(work.model, work.example, work.loss_fn, segments=work.segments, repeats=2,
                            refine=False)
    work = model.build()
    started = time.perf_counter()
    refined, _ = extract(work.model, work.example, work.loss_fn, max_nodes, segments=work.segments, repeats=2,
                         refine=True)
    extract_s = time.perf_counter() - started
    peak = store_all_peak(plain)
    coarse_floor, _ = smallest_budget(coarse, search_time)
    started = time.perf_counter()
    floor, exact = smallest_budget(refined, search_time)
    needs = node_lower_bounds(refined)
    setting = refined.nodes[max(range(refined.size), key=needs.__getitem__)]
    return {"model": name, "input": model.input, "chunked_loss": model.chunked_loss, "M": peak,
            "coarse_nodes": coarse.size, "coarse_floor": coarse_floor, "nodes": refined.size, "floor": floor,
            "floor_exact": exact,
            "bound": refined.operator_bound_bytes, "setting_node": setting.name, "extract_s": extract_s,
            "search_s": time.perf_counter() - started}


def report(rows: list[dict[str, Any]]) -> bool:
    """Print the table and the targets; whether every target was met."""
    print(f"\n{'model':<16} {'input':<11} {'M MB':>7} {'coarse':>13} {'floor MB':>9} {'nodes':>5} "
          f"{'floor/M':>7} {'target':>6} {'bound MB':>8} {'floor/bound':>11}  floor set by")
    met = True
    for r in rows:
        target = FLOOR_TARGET.get(r["model"], DEFAULT_FLOOR_TARGET)
        coarse = f"{r['coarse_floor'] / r['M']:.2f} ({r['coarse_nodes']})" if r["coarse_floor"] else "none"
        if r["floor"] is None:
            print(f"{r['model']:<16} {r['input']:<11} {r['M'] / 1e6:>7.1f} {coarse:>13}  no schedule found")
            met = False
            continue
        over_m, over_bound = r["floor"] / r["M"], r["floor"] / r["bound"]
        ok = over_m <= target and over_bound <= BOUND_TARGET
        met &= ok
        at_loss = "loss" in r["setting_node"] or "lm_head" in r["setting_node"]
        logits = (" (the chunked loss)" if r.get("chunked_loss") else " (the logits)") if at_loss else ""
        print(f"{r['model']:<16} {r['input']:<11} {r['M'] / 1e6:>7.1f} {coarse:>13} {r['floor'] / 1e6:>9.2f} "
              f"{r['nodes']:>5} {over_m:>7.2f} {target:>6.2f} {r['bound'] / 1e6:>8.2f} {over_bound:>10.2f}x  "
              f"{r['setting_node']}{logits}{'' if r['floor_exact'] else ' (search not proved)'}"
              f"{'' if ok else '  <- misses a target'}")
    print(f"targets: floor/M at most {FLOOR_TARGET['resnet18']} for resnet18 and {DEFAULT_FLOOR_TARGET} for the "
          f"others; floor within {BOUND_TARGET}x of the operator-level bound.  'coarse': floor/M on the default "
          "cut (its node count).  '-chunked': the opt-in chunked loss, NOT bit-identical to plain cross-entropy "
          "(M is the plain loss's)")
    return met


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.floor", description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(FLOOR_MODELS), help=f"comma-separated, of {', '.join(BENCH_MODELS)}")
    parser.add_argument("--search-time", type=float, default=240.0,
                        help="seconds for each search of the smallest feasible budget (default 240)")
    parser.add_argument("--max-nodes", type=int, default=None,
                        help="refine up to this many graph nodes (default: extraction's own cap)")
    parser.add_argument("--json", metavar="FILE", help="write every figure here")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in BENCH_MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {', '.join(BENCH_MODELS)}")
    rows = []
    for name in models:
        print(f"== {name} {BENCH_MODELS[name].input}: extracting (default and refined cuts), searching the floors ...",
              flush=True)
        rows.append(measure(name, args.search_time, args.max_nodes))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if report(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
