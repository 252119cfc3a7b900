"""LoRA on the zoo's decoders: a step's whole memory against plain full fine-tuning and plain ``peft`` LoRA.

For GPT-2 and LLaMA (the zoo's, 8x128, AdamW) three configurations, each in a fresh process with glibc's default
allocator at the same thread count, as :mod:`benchmarks.memory` runs them: **plain full fine-tuning** (every
weight trains), **plain peft LoRA** (``peft.get_peft_model``, rank 8, alpha 16, peft's default targets; the base
frozen) and **ours**: the same adapters through the agent's own path (the refined cut the agent profiles,
:class:`engine.training.Training` with its memory check on), planned (least energy) at the tightest budget any schedule fits and at 0.2 of full
fine-tuning's measured memory.  Memory is the peak RSS of the steps above the process with the model built,
everything counted.  Printed per model: each row's memory, its share of full fine-tuning's and of plain LoRA's,
the steps over budget, and whether parameters and optimizer state after three steps equal plain LoRA's.
Targets (issue: personalization a fleet can trust): at most 0.2 of full fine-tuning's memory and at most 0.5 of
plain LoRA's, bit-identical to plain LoRA.

``python -m benchmarks.lora_memory [--models gpt2,llama] [--threads 1] [--json F]`` (about 3 minutes a model).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.memory import MB, MODELS, _child, _row, plans_with_tightest, profile_in_child

DECODERS = ("gpt2", "llama")
FULL_SHARE, LORA_SHARE = 0.2, 0.5  # the targets: ours against full fine-tuning's and plain LoRA's memory
PLAN_TIME = 60.0


def bench(name: str, threads: int, workdir: Path) -> dict[str, Any]:
    """The three configurations of ``name``; ours at the tightest budget and at 0.2 of full fine-tuning's."""
    from engine.training import OptimizerSettings
    from schedules.budgets import store_all_peak

    lora = f"{name}-lora"
    folder = workdir / f"{lora}-t{threads}"
    print(f"\n== {name} 8x128 with LoRA, {threads} thread(s): plain full fine-tuning and plain LoRA ...", flush=True)
    full = _child(name, "plain", folder, threads)
    plain = _child(lora, "plain", folder, threads)
    print(f"   full fine-tuning {full['memory'] / MB:.1f} MB, plain LoRA {plain['memory'] / MB:.1f} MB; "
          "profiling ours ...", flush=True)
    graph, device = profile_in_child(lora, threads, folder, refine=True)  # cut as the agent cuts
    spec = OptimizerSettings(**MODELS[lora]).spec()
    whole = store_all_peak(graph, spec)
    plans = plans_with_tightest(graph, device, spec, PLAN_TIME, whole,
                                {f"{FULL_SHARE} of full": int(FULL_SHARE * full["memory"])})
    rows = [{"label": "plain full fine-tuning", "memory": full["memory"], "over": 0, "same": None},
            {"label": "plain peft LoRA", "memory": plain["memory"], "over": 0, "same": True}]
    for label, (result, missing) in plans.items():
        if result is None:
            print(f"   ours, {label}: {missing}", flush=True)
            continue
        row = _row(f"ours, {label}", result, folder, graph)
        figures = _child(lora, row.run, folder, threads)
        rows.append({"label": f"ours, {label}", "memory": figures["memory"], "budget": row.budget,
                     "over": figures["over"], "same": figures["digest"] == plain["digest"]})
    return {"model": name, "threads": threads, "full": full["memory"], "plain_lora": plain["memory"],
            "trainable_bytes": graph.parameter_bytes, "rows": rows}


def report(results: list[dict[str, Any]]) -> bool:
    """The table and the targets; True when every model meets them."""
    met_all = True
    for r in results:
        print(f"\n{r['model']} 8x128, AdamW, {r['threads']} thread(s); adapters {r['trainable_bytes'] / MB:.2f} MB of "
              "weights")
        print(f"  {'configuration':<24} {'budget':>8} {'memory':>8} {'/full':>6} {'/LoRA':>6} {'over':>5} {'bits':>5}")
        for row in r["rows"]:
            budget = f"{row['budget'] / MB:8.1f}" if row.get("budget") else f"{'-':>8}"
            same = "-" if row["same"] is None else "same" if row["same"] else "DIFF"
            print(f"  {row['label']:<24} {budget} {row['memory'] / MB:8.1f} {row['memory'] / r['full']:6.2f} "
                  f"{row['memory'] / r['plain_lora']:6.2f} {row['over']:>5} {same:>5}")
        ours = [row for row in r["rows"] if row["label"].startswith("ours")]
        best = min(ours, key=lambda row: row["memory"], default=None)
        checks = [(f"memory <= {FULL_SHARE} of full fine-tuning's and <= {LORA_SHARE} of plain LoRA's",
                   best is not None and best["memory"] <= FULL_SHARE * r["full"]
                   and best["memory"] <= LORA_SHARE * r["plain_lora"]),
                  ("bit-identical to plain peft LoRA after 3 steps in every row", all(row["same"] for row in ours)),
                  ("no step over its budget plus tolerance", all(row["over"] == 0 for row in ours))]
        for text, met in checks:
            print(f"  {'met ' if met else 'MISSED'}  {text}"
                  + (f" ({best['label']}: {best['memory'] / r['full']:.2f} and {best['memory'] / r['plain_lora']:.2f})"
                     if best is not None and text.startswith("memory") else ""))
            met_all = met_all and met
    return met_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lora_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(DECODERS), help="comma-separated, of gpt2, llama (default both)")
    parser.add_argument("--threads", type=int, default=1, help="compute threads (default 1)")
    parser.add_argument("--json", metavar="FILE", help="write every figure here")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if any(m not in DECODERS for m in models):
        parser.error(f"choose models from {', '.join(DECODERS)}")
    with tempfile.TemporaryDirectory(prefix="poet-lora-memory-", dir="/var/tmp") as scratch:
        results = [bench(name, args.threads, Path(scratch)) for name in models]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if report(results) else 1


if __name__ == "__main__":
    sys.exit(main())
