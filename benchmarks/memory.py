"""Whole-step memory: what a training step costs a device in RAM, against PyTorch's own ways, in one run.

For each model (resnet18 at 32x3x64x64 with SGD and momentum, ``vgg11_bn`` at
16x3x64x64 with SGD and momentum, the BERT encoder at 8x128 with AdamW by
default), this machine is profiled and the model's whole-step schedules are
planned (:func:`schedules.plan` with a :class:`~schedules.step_memory.TrainingSpec`):
at the tightest budget any schedule fits (no runtime limit), and at the
tightest whose step time is within 1.05x, 1.15x and 1.5x of plain's.  Then
each configuration runs in a fresh process (``MALLOC_MMAP_THRESHOLD_=65536``,
one compute thread), four steps on the same seeded batches:

* ``plain``: ``loss.backward(); optimizer.step(); optimizer.zero_grad()``;
* ``checkpoint N``: the same with ``torch.utils.checkpoint`` -- every segment
  count of ``checkpoint_sequential`` over the model's blocks (per layer for
  the transformer); the one with the least memory is the baseline row;
* ``ours``: :class:`engine.training.Training` under the schedule (updates in
  the backward pass, optimizer state on flash where the plan says).

Training memory is the peak RSS over the steps minus the RSS of the same
process with the model loaded (everything a step adds: activations,
gradients, optimizer state, workspaces, the runtime).  Step times come from
one more process per configuration that runs it and plain, a step of each in
turn (``--rounds`` times, after a warm-up step each): a slow minute of a
shared machine then slows both alike; a row's time is its median over
plain's beside it, in seconds of plain's median over all the pairs.  Plain's step is also timed alone with
glibc's default allocator, as its users run it (freed memory kept for reuse, no page fault to map it again),
and printed on the model's line.  The rows
"within 1.05x", "1.15x" and "1.5x" are found by measurement: the smallest budget whose
schedule runs within that time beside plain (the tightest budget first, then a
bisection towards plain's memory; each candidate planned within the runtime
budget, or at least energy where the planner's time model, which pages at the
bandwidth measured through ``fsync``, predicts none).  After three steps each process hashes its parameters
and optimizer state: every row must equal plain's bit for bit.  Printed: the
rows side by side with their ratios to plain, and the targets (at most 0.33 of
plain's memory at no more than 1.5x its time, at most 0.5 at no more than
1.15x, below ``torch.utils.checkpoint``'s memory at equal or lower time).

``python -m benchmarks.memory [--models resnet18,vgg11_bn,bert,gpt2,gpt2-32k,gpt2-32k-chunked,llama,vit] [--json F]``
(the first three by default; ``gpt2-32k`` is GPT-2 at a 32,768-token vocabulary, ``-chunked`` with the opt-in
chunked loss in every row, plain included: :mod:`engine.chunked_loss`, not bit-identical to plain cross-entropy).
Each model is profiled on its default cut (a step's whole memory is mostly gradients and optimizer state);
``--refine`` cuts it finer where its activation floor is set, as ``poet-edge profile`` does.  The
floor and the operator-level bound are printed; ``python -m benchmarks.floor`` measures them on both cuts for
every family.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.default_allocator import default_allocator_environment, returned_memory_environment
from benchmarks.workloads import BENCH_MODELS

SGD = {"optimizer": "sgd", "learning_rate": 0.01, "momentum": 0.9}
ADAMW = {"optimizer": "adamw", "learning_rate": 1e-4, "weight_decay": 0.01}
MODELS = {"resnet18": SGD, "vgg11_bn": SGD, "bert": ADAMW, "gpt2": ADAMW, "gpt2-32k": ADAMW,  # name: optimizer
          "gpt2-32k-chunked": ADAMW, "llama": ADAMW, "vit": ADAMW}  # (the input: BENCH_MODELS')
DEFAULT_MODELS = ("resnet18", "vgg11_bn", "bert")
LAYER_CHECKPOINTS = {"bert": "checkpoint:layers", "gpt2": "checkpoint:layers", "gpt2-32k": "checkpoint:layers",
                     "gpt2-32k-chunked": "checkpoint:layers", "llama": "checkpoint:layers",
                     "vit": "checkpoint:vit-layers"}  # per-layer torch.utils.checkpoint for the transformers
STEPS = 5
HASH_AFTER = 3
SEARCH_ROUNDS = 6  # interleaved steps of plain and a candidate while searching a time target's budget
SEARCH_STEPS = 4  # bisection steps over the budget
SEARCH_MARGIN = 0.97  # a candidate counts as within a time target only this far below it: the search's
#                       measurement is shorter than the final one
RUNTIME_TARGETS = (1.05, 1.15, 1.5)  # 1.05x: where torch.utils.checkpoint's fastest rows are
MB = 1e6


# -- the child: one configuration in a process of its own ------------------------------------
def run_child(args: argparse.Namespace) -> dict[str, Any]:
    """Build the model, measure the RSS with it loaded, run the steps; report memory, time and the hash."""
    import torch

    from engine import rss
    from engine.training import OptimizerSettings
    from agent.zoo import parse_shape

    torch.set_num_threads(1)
    rss.return_freed_memory()
    shape = parse_shape(args.input or BENCH_MODELS[args.model].input)
    settings = OptimizerSettings(**MODELS[args.model])
    work = BENCH_MODELS[args.model].build(shape)
    batches = [_batch(work, shape, step) for step in range(STEPS)]
    step, optimizer_state = _method(args, work, settings)
    times, peaks, digest = [], [], ""
    baseline = _baseline(args)
    for k, batch in enumerate(batches):
        rss.start_window()
        started = time.perf_counter()
        step(batch)
        times.append(time.perf_counter() - started)
        peaks.append(rss.peak_since_start())
        if k + 1 == HASH_AFTER:
            digest = _digest(work.model, optimizer_state())
    return {"memory": max(peaks) - baseline, "seconds": statistics.median(times[1:]), "digest": digest,
            "first_step": times[0]}


def run_timing_child(args: argparse.Namespace) -> dict[str, list[float]]:
    """Every configuration in ``args.runs`` in this one process, one step each in turn, ``args.rounds`` times:
    a slow minute of a shared machine slows every configuration alike.  Seconds per step, per configuration."""
    import torch

    from engine import rss
    from engine.training import OptimizerSettings
    from agent.zoo import parse_shape

    torch.set_num_threads(1)
    if not args.default_allocator:
        rss.return_freed_memory()
    shape = parse_shape(BENCH_MODELS[args.model].input)
    settings = OptimizerSettings(**MODELS[args.model])
    steps, batches = {}, None
    for run in args.runs.split(","):
        work = BENCH_MODELS[args.model].build(shape)
        batches = batches or [_batch(work, shape, step) for step in range(STEPS)]
        args.run = run
        steps[run], _ = _method(args, work, settings)
        steps[run](batches[0])  # warm-up: lazily made state, first-touch page faults
    times: dict[str, list[float]] = {run: [] for run in steps}
    for k in range(args.rounds):
        for run, step in steps.items():
            started = time.perf_counter()
            step(batches[(k + 1) % len(batches)])
            times[run].append(time.perf_counter() - started)
    return times


def plain_training_memory(model: str, input: str) -> int:
    """Plain PyTorch's training memory for zoo ``model`` at batch ``input`` with the benchmark's optimizer for it:
    the peak RSS of its steps above the same process with the model loaded, measured in a fresh process."""
    env = returned_memory_environment(OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as scratch:
        out = subprocess.run([sys.executable, "-m", "benchmarks.memory", "--child", "--model", model, "--input", input,
                              "--run", "plain", "--workdir", scratch, "--baseline-out", f"{scratch}/baseline.txt"],
                             capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"measuring plain training failed:\n{out.stderr[-3000:]}")
    return int(json.loads(out.stdout.strip().splitlines()[-1])["memory"])


def _baseline(args: argparse.Namespace) -> int:
    from engine import rss

    if args.baseline_file:  # Training measured it before building its optimizer and executor
        return int(Path(args.baseline_file).read_text())
    rss.trim_heap()
    return rss.current()


def _method(args: argparse.Namespace, work: Any, settings: Any) -> tuple[Any, Any]:
    """``(step(batch), optimizer_state())`` for the configuration ``args.run`` names."""
    from engine import rss

    if args.run.startswith("ours:"):
        return _ours(args, work, settings)
    model = work.model
    optimizer = settings.build(model.parameters())  # no state yet; the first one imports torch's compiler code
    forward = _forward(args.run, work)
    rss.trim_heap()
    Path(args.baseline_out).write_text(str(rss.current()))

    def step(batch: Any) -> None:
        inputs, targets = batch
        work.loss_fn(forward(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, lambda: optimizer.state_dict()


def _forward(run: str, work: Any) -> Any:
    """The model's forward: as it is (plain), or under ``torch.utils.checkpoint``."""
    model = work.model
    if run == "plain":
        return lambda x: model(*(x if isinstance(x, tuple) else (x,)))
    if run == "checkpoint:layers":  # transformers' own per-layer checkpointing
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return lambda x: model(x)
    if run == "checkpoint:vit-layers":  # torchvision's ViT: each encoder layer under torch.utils.checkpoint
        from torch.utils.checkpoint import checkpoint

        for layer in model.encoder.layers:
            layer.forward = lambda x, _forward=layer.forward: checkpoint(_forward, x, use_reentrant=False)
        return lambda x: model(x)
    from torch.utils.checkpoint import checkpoint_sequential
    import torch.nn as nn

    blocks = _blocks(model)
    count = run.split(":")[1]
    segments = len(blocks) if count == "all" else int(count)
    sequential = nn.Sequential(*blocks)
    return lambda x: checkpoint_sequential(sequential, segments, x, use_reentrant=False)


def _blocks(model: Any) -> list[Any]:
    """A torchvision model as its blocks in order (its own modules), ReLUs out of place: a segment boundary after
    an in-place ReLU breaks ``checkpoint_sequential`` (same values either way)."""
    import torch.nn as nn

    for module in model.modules():
        if isinstance(module, nn.ReLU):
            module.inplace = False
    if hasattr(model, "layer1"):  # ResNet
        blocks = [model.conv1, model.bn1, model.relu, model.maxpool]
        for name in ("layer1", "layer2", "layer3", "layer4"):
            blocks.extend(getattr(model, name))
        return [*blocks, model.avgpool, nn.Flatten(1), model.fc]
    return [*model.features, model.avgpool, nn.Flatten(1), *model.classifier]  # VGG


def _ours(args: argparse.Namespace, work: Any, settings: Any) -> tuple[Any, Any]:
    from engine.extract import segments_matching
    from engine.training import Training
    from schedules.graph import TrainingGraph
    from schedules.schedule import Schedule

    folder = Path(args.workdir)
    graph = TrainingGraph.load(folder / "graph.json")
    schedule = Schedule.load(args.run.removeprefix("ours:"))
    segments = segments_matching(work, graph)
    training = Training(work, graph, segments, schedule, settings, folder / "swap", check_memory=False)
    Path(args.baseline_out).write_text(str(training.baseline_rss))
    args.baseline_file = args.baseline_out

    def step(batch: Any) -> None:
        training.step([batch])

    return step, training.fused.state_dict


def _batch(work: Any, shape: tuple[int, ...], step: int) -> tuple[Any, Any]:
    import torch

    generator = torch.Generator().manual_seed(1000 + step)
    if work.inputs.is_floating_point():
        inputs = torch.randn(shape, generator=generator)
    else:
        inputs = torch.randint(0, int(work.inputs.max()) + 1, shape, generator=generator)
    classes = int(work.targets.max()) + 1
    return inputs, torch.randint(0, max(classes, 2), tuple(work.targets.shape), generator=generator)


def _digest(model: Any, state: dict[str, Any]) -> str:
    """SHA-256 over every parameter and every optimizer state tensor, in order, as raw bytes."""
    import torch

    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes())
    for index in sorted(state["state"]):
        for key in sorted(state["state"][index]):
            t = state["state"][index][key]
            h.update(f"{index}.{key}".encode())
            h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# -- the parent: profile, plan, run every configuration, report -----------------------------
@dataclass
class Row:
    label: str
    memory: int
    seconds: float
    digest: str
    budget: int | None = None
    planned_runtime: float | None = None
    paged_state: int = 0


def bench_model(name: str, workdir: Path, plan_time: float, rounds: int, refine: bool = False) -> dict[str, Any]:
    """Profile ``name``, plan its budgets, measure every configuration's memory in a process of its own and
    their step times interleaved in one."""
    import torch

    from engine.profile import profile_workload
    from engine.training import OptimizerSettings
    from agent.zoo import parse_shape
    from schedules.budgets import floor_text, store_all_peak

    shape_text, optimizer = BENCH_MODELS[name].input, MODELS[name]
    folder = workdir / name
    folder.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    work = BENCH_MODELS[name].build(parse_shape(shape_text))
    print(f"\n== {name} {shape_text}, {optimizer['optimizer']}: profiling this machine ...", flush=True)
    profile, _ = profile_workload(work.model, work.example, work.loss_fn, folder / "swap", name=name, repeats=3,
                                  segments=work.segments, refine=refine)
    graph, device = profile.graph, profile.device
    print(f"   {graph.size} nodes; activation floor {floor_text(graph)} (python -m benchmarks.floor: the "
          "floor against the default cut)", flush=True)
    graph.save(folder / "graph.json")
    device.save(folder / "device.json")
    del work
    spec = OptimizerSettings(**optimizer).spec()
    whole = store_all_peak(graph, spec)
    configs: dict[str, str] = {"plain": "plain"}
    runs = [LAYER_CHECKPOINTS[name]] if name in LAYER_CHECKPOINTS else [
        f"checkpoint:{n}" for n in (2, 3, 4, 6, 8, "all")]
    configs.update({f"checkpoint {run.split(':')[1]}": run for run in runs})
    planned: dict[str, Any] = {}
    tightest = _plan_tightest(graph, device, spec, None, plan_time, whole)
    if tightest is not None:
        planned["ours, tightest"] = _save(tightest, folder / "schedule-tightest.json", graph)
    for target in RUNTIME_TARGETS:
        found = _plan_for_time(name, graph, device, spec, target, folder, plan_time, whole,
                               tightest.schedule.memory_budget if tightest is not None else None)
        if found is not None:
            planned[f"ours, <= {target}x"] = found
    configs.update({label: f"ours:{entry['path']}" for label, entry in planned.items()})
    print("   memory, each configuration in a fresh process ...", flush=True)
    memory = {label: _child(name, run, folder) for label, run in configs.items()}
    print(f"   step times, each configuration beside plain, {rounds} rounds interleaved in a process ...", flush=True)
    seconds = _paired_seconds(name, [run for run in configs.values() if run != "plain"], folder, rounds)
    default_plain = statistics.median(_times(name, ["plain"], folder, rounds, default_allocator=True)["plain"])
    rows = []
    for label, run in configs.items():
        row = Row(label, memory[label]["memory"], seconds[run], memory[label]["digest"])
        if label in planned:
            row.budget, row.planned_runtime, row.paged_state = (planned[label][key] for key in
                                                                ("budget", "planned_runtime", "paged_state"))
        rows.append(row)
    return {"model": name, "input": shape_text, "optimizer": optimizer["optimizer"],
            "parameters": graph.parameter_bytes, "whole_step_store_all": whole, "rows": [asdict(r) for r in rows],
            "default_allocator_plain_seconds": default_plain}


def _plan_tightest(graph: Any, device: Any, spec: Any, runtime: float | None, plan_time: float, whole: int) -> Any:
    """The plan at the smallest budget with a schedule within the (planner's) runtime budget, or ``None``."""
    from schedules.budgets import smallest_feasible_budget
    from schedules.plan import plan

    def probe(budget: int, limit: float | None) -> Any:
        return plan(graph, device, memory_budget=budget, runtime_budget=runtime, training=spec, time_limit=limit,
                    gap=0.05, check_timeline=False)

    search = smallest_feasible_budget(graph, probe, time_budget_s=plan_time, probe_time_limit_s=20, upper=whole,
                                      training=spec)
    if search.budget is None:
        return None
    result = plan(graph, device, memory_budget=search.budget, runtime_budget=runtime, training=spec, time_limit=30)
    return result if result.feasible else None


def _plan_for_time(name: str, graph: Any, device: Any, spec: Any, target: float, folder: Path,
                   plan_time: float, whole: int, tightest: int | None) -> dict[str, Any] | None:
    """The smallest budget whose schedule *measures* within ``target`` times the plain step beside plain
    (interleaved in one process): the tightest budget first, then a bisection between the largest budget
    measured over the target and the whole step's plain memory.  Each candidate is planned within ``target``
    or, where the planner predicts no schedule that fast, at the least energy: the measurement decides."""
    from schedules.plan import plan

    def measured(budget: int, attempt: str) -> tuple[dict[str, Any] | None, float]:
        result = plan(graph, device, memory_budget=budget, runtime_budget=target, training=spec, time_limit=30)
        if not result.feasible:
            # The planner's time model takes paging at the bandwidth measured through fsync; the OS's page
            # cache often does better.  The least-energy schedule at this budget is measured instead.
            result = plan(graph, device, memory_budget=budget, runtime_budget=None, training=spec, time_limit=30)
        if not result.feasible:
            return None, float("inf")
        entry = _save(result, folder / f"schedule-{target}-{attempt}.json", graph)
        times = _times(name, ["plain", f"ours:{entry['path']}"], folder, SEARCH_ROUNDS)
        ratio = statistics.median(times[f"ours:{entry['path']}"]) / statistics.median(times["plain"])
        print(f"   within {target}x: {budget / MB:.1f} MB measures {ratio:.2f}x plain", flush=True)
        return entry, ratio

    low = tightest or _plan_tightest(graph, device, spec, target, plan_time, whole)
    if low is None:
        return None
    low_budget = low if isinstance(low, int) else low.schedule.memory_budget
    entry, ratio = measured(low_budget, "tightest")
    if entry is not None and ratio <= target * SEARCH_MARGIN:
        return entry
    best, high = None, whole
    for k in range(SEARCH_STEPS):
        middle = (low_budget + high) // 2
        entry, ratio = measured(middle, str(k))
        if entry is not None and ratio <= target * SEARCH_MARGIN:
            best, high = entry, middle
        else:
            low_budget = middle
    return best


def _save(result: Any, path: Path, graph: Any) -> dict[str, Any]:
    result.schedule.save(path)
    return {"path": str(path), "budget": result.schedule.memory_budget,
            "planned_runtime": result.schedule.predicted_runtime_ms / graph.total_compute_ms,
            "paged_state": result.schedule.step.paged_state_bytes}


def _paired_seconds(model: str, runs: list[str], folder: Path, rounds: int) -> dict[str, float]:
    """Each run's step time as its ratio to plain's beside it (the two interleaved in a fresh process, as the
    search measures), in seconds of plain's median over all pairs; ``plain`` itself is that median.  A process
    holding every configuration at once (a model and optimizer state each) slows them unevenly."""
    ratios, plain = {}, []
    for run in runs:
        times = _times(model, ["plain", run], folder, rounds)
        plain.append(statistics.median(times["plain"]))
        ratios[run] = statistics.median(times[run]) / plain[-1]
    reference = statistics.median(plain) if plain else float("nan")
    return {"plain": reference, **{run: ratio * reference for run, ratio in ratios.items()}}


def _times(model: str, runs: list[str], folder: Path, rounds: int,
           default_allocator: bool = False) -> dict[str, list[float]]:
    """Step times of ``runs`` interleaved in one fresh process; with ``default_allocator``, glibc's as plain
    PyTorch's users run it (freed memory kept for reuse) instead of large tensors on mmap."""
    if default_allocator:
        env, flags = default_allocator_environment(OMP_NUM_THREADS="1"), ["--default-allocator"]
    else:
        env, flags = returned_memory_environment(OMP_NUM_THREADS="1"), []
    out = subprocess.run([sys.executable, "-m", "benchmarks.memory", "--child-times", "--model", model,
                          "--runs", ",".join(runs), "--rounds", str(rounds), "--workdir", str(folder),
                          "--baseline-out", str(folder / "baseline-times.txt"), *flags],
                         capture_output=True, text=True, env=env, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"timing {runs} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _child(model: str, run: str, folder: Path) -> dict[str, Any]:
    """One configuration in a fresh process."""
    env = returned_memory_environment(OMP_NUM_THREADS="1")
    baseline = folder / "baseline.txt"
    out = subprocess.run([sys.executable, "-m", "benchmarks.memory", "--child", "--model", model, "--run", run,
                          "--workdir", str(folder), "--baseline-out", str(baseline)],
                         capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{run} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(results: list[dict[str, Any]]) -> bool:
    """The side-by-side table of every model and whether each target holds; True when all do."""
    met = True
    for result in results:
        rows = [Row(**r) for r in result["rows"]]
        plain = rows[0]
        checkpoints = [r for r in rows if r.label.startswith("checkpoint")]
        best_checkpoint = min(checkpoints, key=lambda r: r.memory) if checkpoints else None
        ours = [r for r in rows if r.label.startswith("ours")]
        chunked = " (the chunked loss in every row, NOT bit-identical to plain cross-entropy)" \
            if BENCH_MODELS[result["model"]].chunked_loss else ""
        print(f"\n{result['model']}{chunked} {result['input']}, {result['optimizer']}: parameters "
              f"{result['parameters'] / MB:.1f} MB; plain step {plain.seconds:.3f} s, training memory "
              f"{plain.memory / MB:.1f} MB")
        default = result.get("default_allocator_plain_seconds")
        if default:  # every time below is beside plain with freed memory returned to the system, as ours runs
            print(f"  plain with glibc's default allocator (freed memory kept for reuse), in a process of its own: "
                  f"{default:.3f} s, {plain.seconds / default:.2f}x faster than the plain step below")
        print(f"  {'configuration':<22} {'budget':>9} {'memory':>9} {'/plain':>7} {'time':>8} {'/plain':>7} "
              f"{'state on flash':>15} {'bits':>6}")
        for r in rows:
            budget = f"{r.budget / MB:.1f}" if r.budget else "-"
            flash = f"{r.paged_state / MB:.1f} MB" if r.label.startswith("ours") else "-"
            mark = " <" if r is best_checkpoint else ""
            print(f"  {r.label + mark:<22} {budget:>9} {r.memory / MB:9.1f} {r.memory / plain.memory:7.2f} "
                  f"{r.seconds:8.3f} {r.seconds / plain.seconds:7.2f} {flash:>15} "
                  f"{'same' if r.digest == plain.digest else 'DIFF':>6}")
        checks = _targets(plain, best_checkpoint, ours)
        for text, ok in checks:
            print(f"  {'met ' if ok else 'MISSED'}  {text}")
        met = met and all(ok for _, ok in checks)
    return met


def _targets(plain: Row, checkpoint: Row | None, ours: list[Row]) -> list[tuple[str, bool]]:
    def best(limit: float) -> Row | None:
        fitting = [r for r in ours if r.seconds <= limit * plain.seconds]
        return min(fitting, key=lambda r: r.memory) if fitting else None

    checks = []
    for share, limit in ((0.33, 1.5), (0.5, 1.15)):
        row = best(limit)
        text = (f"memory <= {share} of plain's at <= {limit}x its time: "
                + (f"{row.memory / plain.memory:.2f} at {row.seconds / plain.seconds:.2f}x ({row.label})" if row
                   else "no row of ours within that time"))
        checks.append((text, row is not None and row.memory <= share * plain.memory))
    if checkpoint is not None:
        row = next((r for r in sorted(ours, key=lambda r: r.memory)
                    if r.seconds <= checkpoint.seconds and r.memory < checkpoint.memory), None)
        checks.append((f"below torch.utils.checkpoint ({checkpoint.label}: {checkpoint.memory / MB:.1f} MB, "
                       f"{checkpoint.seconds:.3f} s) at equal or lower time: "
                       + (f"{row.label}, {row.memory / MB:.1f} MB, {row.seconds:.3f} s" if row else "none"), row is not None))
    checks.append(("parameters and optimizer state bit-identical to plain after 3 steps in every row",
                   all(r.digest == plain.digest for r in [*ours] + ([checkpoint] if checkpoint else []))))
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help=f"comma-separated, of {', '.join(MODELS)} (default {','.join(DEFAULT_MODELS)})")
    parser.add_argument("--plan-time", type=float, default=90.0,
                        help="seconds for each search of the smallest feasible budget (default 90)")
    parser.add_argument("--workdir", help="where profiles, schedules and page files go (default a temporary one)")
    parser.add_argument("--rounds", type=int, default=6,
                        help="steps of every configuration, interleaved in one process: the median is its step time "
                             "(default 6)")
    parser.add_argument("--refine", action="store_true",
                        help="profile with the refined cut (poet-edge profile's default) instead of the default cut: "
                             "a lower activation floor, a larger graph to plan")
    parser.add_argument("--json", metavar="FILE", help="write every figure here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-times", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--runs", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--baseline-out", help=argparse.SUPPRESS)
    parser.add_argument("--baseline-file", help=argparse.SUPPRESS)
    parser.add_argument("--default-allocator", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args)))
        return 0
    if args.child_times:
        print(json.dumps(run_timing_child(args)))
        return 0
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {', '.join(MODELS)}")
    with tempfile.TemporaryDirectory(prefix="poet-memory-", dir="/var/tmp") as scratch:
        workdir = Path(args.workdir or scratch)
        results = [bench_model(name, workdir, args.plan_time, args.rounds, args.refine) for name in models]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if report(results) else 1


if __name__ == "__main__":
    sys.exit(main())
