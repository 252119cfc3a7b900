"""The planner and executor step by step: ``poet-edge walkthrough`` (or ``python -m demo.walkthrough``).

1. Load the POET reference graph ``resnet18_cifar_a72`` (ResNet-18 on CIFAR-10
   priced for a Raspberry Pi 4) from ``../shared/bench/poet_graphs``, or build
   a synthetic 16-layer chain when the reference graphs are not beside this
   checkout.
2. Solve POET's MILP at a memory budget well below plain backpropagation's
   peak (1,500,000 bytes and 1.5x the plain step's time on the reference
   graph, whose plain peak is 2,453,760 bytes) to a 0.5% gap, and print the
   result next to the reference formulation's published objective.
3. Make a signing key, sign the schedule, write it, and load it back through
   signature verification and a replay in the simulator.
4. Draw the schedule's stage x node timeline and a small energy-vs-budget
   sweep of POET against every baseline.
5. On this machine, as a device would: profile a real PyTorch model
   (``resnet18`` at 16x3x64x64 by default: its training graph and this
   machine's compute and swap-path costs), plan it at half the memory plain
   backpropagation needs and 1.3x its time, sign the schedule, and run
   training steps through the executor, paging to real files in
   ``out/swap``: predicted against measured step time, memory and paging,
   and one step checked bit for bit against plain ``loss.backward()``.

Everything goes into the output folder (``./out`` by default).  It takes about
a minute on a laptop.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

from schedules.graph import Node, TrainingGraph

REFERENCE_GRAPH = "resnet18_cifar_a72.json"
# (memory bytes, runtime multiple, objective J) the reference formulation reaches on this graph, from
# ../shared/bench/poet_graphs/README.md.  The demo solves the second: at 3,000,000 bytes plain
# backpropagation (peak 2,453,760) already fits, so only the tighter budget makes POET work.
PUBLISHED = {(3_000_000, 7.6): 7.8895102, (1_500_000, 1.5): 7.9258490}
REFERENCE_CASE = (1_500_000, 1.5)


def reference_graph_path() -> Path | None:
    """``resnet18_cifar_a72.json`` from the shared bench folder beside (or inside) this checkout, if present."""
    repo = Path(__file__).resolve().parents[1]
    for folder in (repo.parent / "shared", repo / "shared", Path.cwd().parent / "shared", Path.cwd() / "shared"):
        candidate = folder / "bench" / "poet_graphs" / REFERENCE_GRAPH
        if candidate.is_file():
            return candidate
    return None


def synthetic_graph(layers: int = 16) -> TrainingGraph:
    """A chain network like Checkmate's linear graphs: ``layers`` forward nodes, a loss, their gradients.

    Costs are invented but shaped like a CNN: early layers hold large
    activations and are cheap to compute, late layers the opposite, so
    recomputing early values and paging late ones both pay off.  Energies are
    left for a device profile to price.
    """
    nodes = [Node(f"layer{i}", "forward", f"layer{i}", compute_ms=2.0 + 1.5 * i,
                  bytes=int(400_000 * 0.85**i)) for i in range(layers)]
    nodes.append(Node("loss", "loss", "loss", compute_ms=0.5, bytes=4))
    nodes += [Node(f"grad_layer{i}", "backward", f"layer{i}", compute_ms=2 * (2.0 + 1.5 * i),
                   bytes=int(400_000 * 0.85**i)) for i in reversed(range(layers))]
    grad = {i: layers + 1 + (layers - 1 - i) for i in range(layers)}  # layer -> its gradient node
    edges = [(i, i + 1) for i in range(layers)]  # the forward chain into the loss
    edges.append((layers, grad[layers - 1]))  # loss -> last layer's gradient
    for i in range(layers):
        edges.append((i, grad[i]))  # a layer's gradient needs its output...
        if i > 0:
            edges += [(i - 1, grad[i]), (grad[i], grad[i - 1])]  # ...its input, and flows to the layer before
    return TrainingGraph(nodes=tuple(nodes), edges=tuple(sorted(set(edges))), model=f"synthetic-chain-{layers}",
                         source="demo.walkthrough")


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m demo.walkthrough", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return p.parse_args(argv)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The walkthrough's options, for ``python -m demo.walkthrough`` and ``poet-edge walkthrough``."""
    p.add_argument("--out", default="out", help="output folder (default ./out)")
    p.add_argument("--graph", help="graph file (default: the reference resnet18_cifar_a72, else a synthetic chain)")
    p.add_argument("--synthetic", action="store_true", help="use the built-in synthetic chain graph")
    p.add_argument("--device", default="rpi4", help="device profile for graphs without energies (default rpi4)")
    p.add_argument("--points", type=int, default=4, help="budgets in the energy-vs-budget sweep (default 4)")
    p.add_argument("--time-limit", type=float, default=60.0, help="time limit of the main solve, seconds")
    p.add_argument("--gap", type=float, default=0.005, help="relative MIP gap of the main solve (default 0.005)")
    p.add_argument("--model", default="resnet18", help="zoo model trained on this machine in step 5 (default resnet18)")
    p.add_argument("--input", help="its batch shape (default 16x3x64x64 for resnet18, else the zoo's own)")
    p.add_argument("--no-device", action="store_true", help="skip step 5 (planning only)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the walkthrough; returns 0 on success, like the CLI's exit codes otherwise."""
    return run(_parse(argv))


def run(args: argparse.Namespace) -> int:
    """The walkthrough with parsed options (:func:`add_arguments`)."""
    from common.cli import main as cli_main

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    graph_path, memory, runtime = _choose_graph(args.graph, args.synthetic, out)
    keys = _ensure_keys(out, cli_main)
    steps = [
        ("solve", ["solve", str(graph_path), "--device", args.device, "--memory", str(memory), "--runtime",
                   f"{runtime:g}", "--time-limit", f"{args.time_limit:g}", "--gap", f"{args.gap:g}", "--sign", str(keys[0]),
                   "-o", str(out / "schedule.json")]),
        ("verify", ["verify", str(out / "schedule.json"), "--key", str(keys[1]), "--graph", str(graph_path)]),
        ("plot", ["plot", str(out / "schedule.json"), "--graph", str(graph_path), "--key", str(keys[1]),
                  "-o", str(out / "timeline.png")]),
        ("pareto", ["pareto", str(graph_path), "--device", args.device, "--runtime", f"{runtime:g}",
                    "--points", str(args.points), "--time-limit", "4", "--gap", "0.01", "--search-time", "20",
                    "-o", str(out / "pareto.png")]),
    ]
    for title, command in steps:
        code = _run(cli_main, title, command)
        if code != 0:
            return code
        if title == "solve" and graph_path.name == REFERENCE_GRAPH and (memory, runtime) in PUBLISHED:
            print(f"(the reference formulation's published objective at these budgets: "
                  f"{PUBLISHED[memory, runtime]} J)")
    if not args.no_device:
        code = _train_on_this_machine(args.model, args.input, out, keys, cli_main)
        if code != 0:
            return code
    print(f"\ndemo finished in {time.perf_counter() - started:.0f} s; files in {out}/: "
          + ", ".join(sorted(p.name for p in out.iterdir() if p.is_file())))
    return 0


def _run(cli_main, title: str, command: list[str]) -> int:
    """One ``poet-edge`` command, echoed; its exit code (said on standard error when it failed)."""
    print(f"\n== poet-edge {' '.join(command)}", flush=True)
    code = cli_main(command)
    if code != 0:
        print(f"demo: step {title!r} failed with exit code {code}", file=sys.stderr)
    return code


def _train_on_this_machine(model: str, shape: str | None, out: Path, keys: tuple[Path, Path], cli_main) -> int:
    """Step 5: profile ``model`` here, plan it at half of plain backpropagation's memory, and run it."""
    from schedules.budgets import memory_lower_bound, store_all_peak
    from common.exit_codes import ExitCode

    graph, device, schedule = out / f"{model}_graph.json", out / "this_machine.json", out / f"{model}_schedule.json"
    shape = shape or ("16x3x64x64" if model == "resnet18" else None)  # half the zoo's 32: a quicker demo
    model_options = ["--model", model, *(["--input", shape] if shape else [])]
    code = _run(cli_main, "profile", ["profile", *model_options, "--swap-dir", str(out / "swap"), "--repeats", "3",
                                      "-o", str(graph), "--device-out", str(device)])
    if code != 0:
        return code
    measured = TrainingGraph.load(graph)
    # half of what plain backpropagation needs, unless that is below the least any schedule needs
    budget = max(store_all_peak(measured) // 2, int(1.1 * memory_lower_bound(measured)))
    solve = ["solve", str(graph), "--device", str(device), "--memory", str(budget), "--time-limit", "60",
             "--sign", str(keys[0]), "-o", str(schedule)]
    code = _run(cli_main, "solve", [*solve, "--runtime", "1.3"])
    if code == ExitCode.INFEASIBLE:  # a slow swap path here: no 1.3x plan fits; the least-energy one at any time still does
        print("no plan within 1.3x at this budget on this machine's swap path; planning without a runtime budget")
        code = _run(cli_main, "solve", solve)
    if code != 0:
        return code
    return _run(cli_main, "validate", ["validate", *model_options, "--schedule", str(schedule), "--graph", str(graph),
                                       "--device", str(device), "--key", str(keys[1]), "--swap-dir", str(out / "swap"),
                                       "--steps", "3", "--check-exact", "--plot", str(out / "memory.png")])


def _choose_graph(explicit: str | None, synthetic: bool, out: Path) -> tuple[Path, int, float]:
    """The graph to solve and its budgets: the reference case, or a third of the way from the
    least any schedule needs to plain backprop's peak, at 1.5x."""
    from schedules.budgets import memory_lower_bound, store_all_peak

    if explicit is None:
        reference = None if synthetic else reference_graph_path()
        if reference is not None:
            return reference, *REFERENCE_CASE
        if not synthetic:
            print("reference graphs not found beside this checkout; using a synthetic chain graph")
        graph = synthetic_graph()
        path = out / "synthetic_graph.json"
        graph.save(path)
    else:
        path = Path(explicit)
        graph = TrainingGraph.load(path)
    low, high = memory_lower_bound(graph), store_all_peak(graph)
    return path, low + (high - low) // 3, 1.5


def _ensure_keys(out: Path, cli_main) -> tuple[Path, Path]:
    """The demo's signing key pair in ``out/keys``, made on the first run and reused after."""
    private, public = out / "keys" / "demo.key", out / "keys" / "demo.pub"
    if not (private.exists() and public.exists()):
        if cli_main(["keys", "--dir", str(out / "keys"), "--name", "demo"]) != 0:
            raise SystemExit("demo: could not create a signing key pair")
    return private, public


if __name__ == "__main__":
    sys.exit(main())
