"""Whole-step memory and time against plain PyTorch as its users run it: every configuration in fresh processes.

For each model (resnet18 at 32x3x64x64 with SGD and momentum, ``vgg11_bn`` at 16x3x64x64 with SGD and momentum,
the BERT encoder and GPT-2 at 8x128 with AdamW) and each thread count (``--threads``, default 1 and 2), this
machine is profiled at that thread count and the model's whole-step schedules are planned
(:func:`schedules.plan` with a :class:`~schedules.step_memory.TrainingSpec`, least energy).  The configurations:

* ``plain``: ``loss.backward(); optimizer.step(); optimizer.zero_grad()`` as its users run it: glibc's default
  allocator, nothing set;
* ``checkpoint``: per-block ``torch.utils.checkpoint`` (``checkpoint_sequential`` with a segment per block for
  the CNNs, transformers' ``gradient_checkpointing_enable`` per layer), the same default allocator;
* ``ours``: the agent's own path, :class:`engine.training.Training` with its memory check on (the agent's
  tolerance), its allocator (:mod:`engine.allocator`) and the same threads, at these budgets: the whole step
  stored (``no paging``: nothing paged or recomputed, the executor's own cost), half and a third of plain's
  measured memory, ``torch.utils.checkpoint``'s measured memory, and the tightest any schedule fits.  A
  process of ours measures more than the agent budgets: the libraries' code the model's kernels fault in
  (file-backed; :func:`engine.rss.anonymous_growth_since`).  The ``no paging`` configuration, run once, says
  how much (its measured memory less the agent's own figure), and the budgets of the half and third rows
  leave that much room, so that what is measured there lands on the share the targets judge.

Memory is the peak RSS over a process's steps minus the RSS of that process once it has imported torch and
built the model (and loaded the optimizer's code, which any training process does): every copy, leftover,
buffer and cache a configuration adds counts -- cutting the model into segments, the executor's and the
allocator's.  Time: every round (``--rounds``, default 9) runs each configuration in a fresh process, plain
first and plain again last, each ``STEPS`` steps on the same seeded batches (the first ``WARMUP`` warm up: a
process's first steps fault in its memory and, where a schedule pages, start the storage's writeback; its
time the median of the rest, the steady step a device's window trains at); a row's ratio is the median over the rounds of its time over its round's plain, printed
with the spread of those ratios (25th to 75th percentile).  Plain again over plain is the machine's own noise;
a run whose noise is 5% or more says so, and its targets are not judged.  After three steps each process
hashes its parameters and optimizer state: every row must equal plain's bit for bit.

Targets (each model, each thread count): at most 0.33 of plain's memory at no more than 1.35x its time; at
most 0.5 at no more than 1.15x; at ``torch.utils.checkpoint``'s memory, no slower than it; the executor at a
budget that neither pages nor recomputes at most 1.03x plain; the planner's step time (the schedule's
``predicted_runtime_ms``, column ``planned``) within 15% of the measured median in every row of ours; no step
over its budget plus tolerance; bits identical.

``python -m benchmarks.memory [--models resnet18,vgg11_bn,bert,gpt2,...] [--threads 1,2] [--rounds 9]
[--refine] [--json F]`` (about 12 minutes a model and thread count on 2 cores).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.default_allocator import MMAP_VARIABLE, default_allocator_environment
from benchmarks.workloads import BENCH_MODELS

SGD = {"optimizer": "sgd", "learning_rate": 0.01, "momentum": 0.9}
ADAMW = {"optimizer": "adamw", "learning_rate": 1e-4, "weight_decay": 0.01}
MODELS = {"resnet18": SGD, "mobilenet_v2": SGD, "vgg11_bn": SGD, "unet": SGD, "bert": ADAMW, "gpt2": ADAMW, "gpt2-32k": ADAMW,  # name: optimizer
          "gpt2-32k-chunked": ADAMW, "llama": ADAMW, "vit": ADAMW, "swin_t": ADAMW,  # (the input: BENCH_MODELS')
          "gpt2-lora": ADAMW, "llama-lora": ADAMW}
DEFAULT_MODELS = ("resnet18", "vgg11_bn", "bert", "gpt2")
LAYER_CHECKPOINTS = {"bert": "checkpoint:layers", "gpt2": "checkpoint:layers", "gpt2-32k": "checkpoint:layers",
                     "gpt2-32k-chunked": "checkpoint:layers", "llama": "checkpoint:layers",
                     "vit": "checkpoint:vit-layers"}  # per-layer torch.utils.checkpoint for the transformers
STEPS = 10
WARMUP = 2  # steps each process runs before its time counts (every configuration alike)
HASH_AFTER = 3
ROUNDS = 9
NOISE_LIMIT = 0.05  # targets are judged in a run whose plain-against-plain spread is below this
SHARES = (0.5, 0.33)  # budgets as shares of plain's measured memory
TARGETS = {0.5: 1.15, 0.33: 1.35}  # share of plain's memory: the most time it may take, as a ratio to plain's
OVERHEAD_TARGET = 1.03  # the executor's own cost where it neither pages nor recomputes
PREDICTION_TARGET = 0.15  # the planner's step time against the measured, either way
MB = 1e6


# -- the child: one configuration in a process of its own ------------------------------------
def run_child(args: argparse.Namespace) -> dict[str, Any]:
    """Build the model, read the baseline RSS, set up the configuration, run the steps; report memory, the
    median step time, the hash after three steps and how many steps the memory check stopped."""
    import torch

    from engine import rss
    from engine.training import OptimizerSettings
    from agent.zoo import parse_shape

    torch.set_num_threads(args.threads)
    shape = parse_shape(args.input or BENCH_MODELS[args.model].input)
    settings = OptimizerSettings(**MODELS[args.model])
    work = BENCH_MODELS[args.model].build(shape)
    batches = [_batch(work, shape, step) for step in range(args.steps)]
    settings.build([torch.zeros(1, requires_grad=True)])  # the optimizer's code (100 MB, once): any training's
    rss.trim_heap()
    baseline = rss.current()
    step, optimizer_state, seen = _method(args, work, settings)
    times, over, digest = [], [], ""
    rss.start_window()  # what setting up left resident is in every reading below
    for k, batch in enumerate(batches):
        figures_before = len(seen)
        started = time.perf_counter()
        went_over = step(batch)
        times.append(time.perf_counter() - started)
        if went_over:  # which step, the agent's figure and how long it took: enough to tell a cold start from a leak
            figure = seen[-1] if len(seen) > figures_before else None  # this step's own, never an earlier one's
            over.append({"step": k, "memory": figure, "seconds": times[-1]})
        if k + 1 == HASH_AFTER:
            digest = _digest(work.model, optimizer_state())
    from engine import allocator

    return {"memory": rss.peak_since_start() - baseline, "seconds": statistics.median(times[WARMUP:] or times),
            "digest": digest,
            "over": len(over), "over_steps": over, "agent_memory": max(seen, default=None),
            "threads": torch.get_num_threads(),
            "caching_allocator": allocator.installed() is not None,
            MMAP_VARIABLE: os.environ.get(MMAP_VARIABLE)}


def plain_training_memory(model: str, input: str) -> int:
    """Plain PyTorch's training memory for zoo ``model`` at batch ``input`` with the benchmark's optimizer for it,
    as its users run it: the peak RSS of its steps above the process with the model loaded, in a fresh process."""
    return int(_child(model, "plain", Path(tempfile.gettempdir()), 1, input=input)["memory"])


def _method(args: argparse.Namespace, work: Any, settings: Any) -> tuple[Any, Any, list[int]]:
    """``(step(batch) -> steps over budget, optimizer_state(), the agent's figure of each step)`` for the
    configuration ``args.run`` names (no figures but ours')."""
    if args.run.startswith("ours:"):
        return _ours(args, work, settings)
    model = work.model
    optimizer = settings.build(model.parameters())
    forward = _forward(args.run, work)

    def step(batch: Any) -> int:
        inputs, targets = batch
        work.loss_fn(forward(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return 0

    return step, lambda: optimizer.state_dict(), []


def _ours(args: argparse.Namespace, work: Any, settings: Any) -> tuple[Any, Any, list[int]]:
    """The agent's path: the model cut as profiled, :class:`~engine.training.Training` with its check on."""
    from engine import allocator, rss
    from engine.errors import MemoryBoundError
    from engine.extract import segments_matching
    from engine.training import Training
    from schedules.graph import TrainingGraph
    from schedules.schedule import Schedule

    folder = Path(args.workdir)
    graph = TrainingGraph.load(folder / "graph.json")
    schedule = Schedule.load(args.run.removeprefix("ours:"))
    # the agent's own check: what the cut leaves in the process's own memory counts in every step
    allocator.release_cache()
    loaded = rss.settled_anonymous()
    segments = segments_matching(work, graph)
    training = Training(work, graph, segments, schedule, settings, folder / "swap",
                        first_run_bytes=rss.anonymous_growth_since(loaded))

    seen: list[int] = []  # the step memory the agent's check measured, each step

    def step(batch: Any) -> int:
        try:
            report = training.step([batch])
        except MemoryBoundError as exc:  # the step was applied; the agent would stop its window here
            report = exc.report
            over = 1
        else:
            over = 0
        if report is not None and report.memory_bytes is not None:
            seen.append(report.memory_bytes)
        return over

    return step, training.fused.state_dict, seen


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
    """SHA-256 over every parameter and every optimizer state tensor, in order, as raw bytes.  State is taken in
    its parameters' order without their index: an optimizer over the trainable parameters only (ours, under
    adapters) numbers them from 0, one over every parameter (plain's) skips the frozen ones' numbers."""
    import torch

    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes())
    for index in sorted(state["state"]):
        for key in sorted(state["state"][index]):
            t = state["state"][index][key]
            h.update(key.encode())
            h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# -- the parent: profile, plan, run every configuration in rounds, report ------------------------
@dataclass
class Row:
    label: str
    run: str
    memory: list[int] = field(default_factory=list)  # per round
    ratios: list[float] = field(default_factory=list)  # per round: its median step over that round's plain's
    seconds: list[float] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    over: int = 0  # steps the memory check stopped, over every round
    over_steps: list[dict[str, Any]] = field(default_factory=list)  # each: round, step, the agent's figure, seconds
    budget: int | None = None
    paged_state: int = 0
    predicted_s: float | None = None  # the planner's step time for the schedule (rows of ours)

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    @property
    def spread(self) -> tuple[float, float]:
        return _quartiles(self.ratios)

    @property
    def peak(self) -> int:
        return statistics.median(self.memory)

    @property
    def prediction_error(self) -> float:
        """How far the planner's step time lies from the measured median: negative where it promised less."""
        assert self.predicted_s is not None
        return self.predicted_s / statistics.median(self.seconds) - 1


def bench_model(name: str, threads: int, workdir: Path, plan_time: float, rounds: int,
                refine: bool = False) -> dict[str, Any]:
    """Profile ``name`` at ``threads``, plan its budgets from plain's and checkpoint's measured memory, then run
    every configuration in ``rounds`` rounds of fresh processes."""
    from engine.training import OptimizerSettings
    from schedules.budgets import floor_text, store_all_peak

    shape_text, optimizer = BENCH_MODELS[name].input, MODELS[name]
    folder = workdir / f"{name}-t{threads}"
    print(f"\n== {name} {shape_text}, {optimizer['optimizer']}, {threads} thread(s): profiling ...", flush=True)
    graph, device = profile_in_child(name, threads, folder, refine)
    print(f"   {graph.size} nodes; activation floor {floor_text(graph)}", flush=True)
    spec = OptimizerSettings(**optimizer).spec()
    whole = store_all_peak(graph, spec)
    plain = Row("plain", "plain")
    checkpoint = Row("checkpoint per block", LAYER_CHECKPOINTS.get(name, "checkpoint:all"))
    print("   plain and checkpoint once, for the budgets ...", flush=True)
    for row in (plain, checkpoint):
        row.budget = int(_child(name, row.run, folder, threads)["memory"])
    ours, uncounted = [], 0
    stored = _plan(graph, device, spec, whole)
    if stored is not None:
        ours.append(_row("ours, no paging", stored, folder, graph))
        uncounted = unbudgeted_memory(_child(name, ours[0].run, folder, threads))
        print(f"   a process of ours measures {uncounted / MB:.1f} MB beside what the agent budgets and checks (the "
              "libraries' code its kernels fault in): the share rows' budgets leave it room", flush=True)
    else:
        print(f"   ours, no paging: no schedule fits {whole / MB:.1f} MB", flush=True)
    budgets = {**{f"{share} of plain": int(share * plain.budget) - uncounted for share in SHARES},
               "checkpoint's memory": checkpoint.budget}
    plans = plans_with_tightest(graph, device, spec, plan_time, whole, budgets)
    for label in (*budgets, "tightest"):
        result, missing = plans[label]
        if result is None:
            print(f"   ours, {label}: {missing}", flush=True)
            continue
        ours.append(_row(f"ours, {label}", result, folder, graph))
    plain.budget = checkpoint.budget = None
    again = Row("plain again (noise)", "plain")
    rows = [plain, checkpoint, *ours, again]
    print(f"   {rounds} rounds, each configuration in a fresh process, plain first and last ...", flush=True)
    for k in range(rounds):
        for row in rows:
            figures = _child(name, row.run, folder, threads)
            row.memory.append(int(figures["memory"]))
            row.seconds.append(float(figures["seconds"]))
            row.digests.append(figures["digest"])
            row.over += int(figures["over"])
            row.over_steps.extend({"round": k + 1, **step} for step in figures.get("over_steps", []))
        for row in rows:
            row.ratios.append(row.seconds[-1] / plain.seconds[-1])
        print(f"   round {k + 1}: plain {plain.seconds[-1]:.3f} s, noise {again.ratios[-1]:.3f}", flush=True)
    return {"model": name, "input": shape_text, "optimizer": optimizer["optimizer"], "threads": threads,
            "parameters": graph.parameter_bytes, "whole_step_store_all": whole, "rows": [asdict(r) for r in rows]}


def profile_in_child(name: str, threads: int, folder: Path, refine: bool = False) -> tuple[Any, Any]:
    """``(graph, device)`` of ``name`` profiled at ``threads`` in a fresh process, as the agent's first window
    profiles: what the model's first run leaves in the process's own memory (the profile reserves it) is only
    there to see in a process that has not run a model yet.  Saved in ``folder`` (``graph.json``,
    ``device.json``), where the children find them."""
    from schedules.device import DeviceProfile
    from schedules.graph import TrainingGraph

    folder.mkdir(parents=True, exist_ok=True)
    env = default_allocator_environment(OMP_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, "-m", "benchmarks.memory", "--profile-child", "--model", name,
                          "--workdir", str(folder), "--threads", str(threads), *(["--refine"] if refine else [])],
                         capture_output=True, text=True, env=env, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"profiling {name} failed:\n{out.stderr[-3000:]}")
    return TrainingGraph.load(folder / "graph.json"), DeviceProfile.load(folder / "device.json")


def _profile_child(args: argparse.Namespace) -> None:
    import torch

    from agent.zoo import parse_shape
    from engine.profile import profile_workload
    from engine.training import OptimizerSettings

    torch.set_num_threads(args.threads)
    folder = Path(args.workdir)
    work = BENCH_MODELS[args.model].build(parse_shape(BENCH_MODELS[args.model].input))
    profile, _ = profile_workload(work.model, work.example, work.loss_fn, folder / "swap", name=args.model,
                                  repeats=3, segments=work.segments, refine=args.refine,
                                  training=OptimizerSettings(**MODELS[args.model]))
    profile.graph.save(folder / "graph.json")
    profile.device.save(folder / "device.json")


def _plan(graph: Any, device: Any, spec: Any, budget: int) -> Any:
    """The least-energy whole-step schedule within ``budget``, or ``None``."""
    from schedules.plan import plan

    result = plan(graph, device, memory_budget=budget, training=spec, time_limit=30, gap=0.01)
    return result if result.feasible else None


def _plan_tightest(graph: Any, device: Any, spec: Any, plan_time: float, whole: int) -> tuple[Any, str]:
    """The plan at the smallest budget any schedule fits, or ``None`` and why.  Near the floor the least-energy
    solve may stop before it finds the schedule the search's looser probe found: that one is kept then."""
    from schedules.budgets import smallest_feasible_budget
    from schedules.plan import plan

    def probe(budget: int, limit: float | None) -> Any:
        return plan(graph, device, memory_budget=budget, training=spec, time_limit=limit, gap=0.05,
                    check_timeline=False)

    search = smallest_feasible_budget(graph, probe, time_budget_s=plan_time, probe_time_limit_s=20, upper=whole,
                                      training=spec)
    if search.budget is None:
        return None, f"no budget found ({search.note or 'the search found no schedule'})"
    result = _plan(graph, device, spec, search.budget) or probe(search.budget, 60)
    if not result.feasible:
        return None, f"no schedule at the search's {search.budget / MB:.1f} MB within 30 s and 60 s of solving"
    return result, ""


def plans_with_tightest(graph: Any, device: Any, spec: Any, plan_time: float, whole: int,
                        budgets: dict[str, int]) -> dict[str, tuple[Any, str]]:
    """The tightest plan, then one plan per labelled budget: label -> ``(result, "")``, or ``(None, why)``."""
    tightest, why = _plan_tightest(graph, device, spec, plan_time, whole)
    plans = {"tightest": (tightest, why)}
    for label, budget in budgets.items():
        result = _plan(graph, device, spec, budget)
        plans[label] = (result, "" if result is not None else f"no schedule fits {budget / MB:.1f} MB")
    return plans


def unbudgeted_memory(figures: dict[str, Any]) -> int:
    """What a child of ours measured beside the agent's own memory figure (``memory`` less ``agent_memory``):
    the libraries' code the model's kernels fault in, file-backed, which the agent leaves out of its budgets
    (:func:`engine.rss.anonymous_growth_since`) and this benchmark counts."""
    agent = figures.get("agent_memory")
    return max(0, int(figures["memory"]) - int(agent)) if agent is not None else 0


def _row(label: str, result: Any, folder: Path, graph: Any) -> Row:
    path = folder / f"schedule-{label.split(', ')[1].replace(' ', '-')}.json"
    result.schedule.save(path)
    return Row(label, f"ours:{path}", budget=result.schedule.memory_budget,
               paged_state=result.schedule.step.paged_state_bytes,
               predicted_s=result.schedule.predicted_runtime_ms / 1e3)


def _child(model: str, run: str, folder: Path, threads: int, input: str | None = None,
           steps: int = STEPS) -> dict[str, Any]:
    """One configuration in a fresh process with glibc's default allocator (ours sets its own, as the agent)."""
    env = default_allocator_environment(OMP_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, "-m", "benchmarks.memory", "--child", "--model", model, "--run", run,
                          "--workdir", str(folder), "--threads", str(threads), "--steps", str(steps),
                          *(["--input", input] if input else [])],
                         capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{run} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def noise(result: dict[str, Any]) -> float:
    """The machine's own noise in a run: how far plain again lies from plain (its median ratio's distance from 1,
    or half its spread, whichever is larger)."""
    again = Row(**result["rows"][-1])
    low, high = again.spread
    return max(abs(again.ratio - 1), (high - low) / 2)


def report(results: list[dict[str, Any]]) -> bool:
    """The side-by-side table of every model and thread count, and whether each target holds; True when all do."""
    met = True
    for result in results:
        rows = [Row(**r) for r in result["rows"]]
        plain, checkpoint, ours = rows[0], rows[1], rows[2:-1]
        machine_noise = noise(result)
        print(f"\n{result['model']} {result['input']}, {result['optimizer']}, {result['threads']} thread(s): "
              f"parameters {result['parameters'] / MB:.1f} MB; plain step {statistics.median(plain.seconds):.3f} s, "
              f"training memory {plain.peak / MB:.1f} MB (glibc's default allocator, a fresh process each)")
        print(f"  {'configuration':<27} {'budget':>8} {'memory':>8} {'/plain':>7} {'time':>7} {'/plain':>7} "
              f"{'(25%-75%)':>13} {'planned':>8} {'error':>7} {'on flash':>9} {'over':>5} {'bits':>5}")
        for r in rows:
            low, high = r.spread
            budget = f"{r.budget / MB:.1f}" if r.budget else "-"
            flash = f"{r.paged_state / MB:.1f}" if r.run.startswith("ours") else "-"
            same = all(d == plain.digests[0] for d in r.digests)
            planned = f"{r.predicted_s:.3f}" if r.predicted_s else "-"
            error = f"{r.prediction_error:+.0%}" if r.predicted_s else "-"
            print(f"  {r.label:<27} {budget:>8} {r.peak / MB:8.1f} {r.peak / plain.peak:7.2f} "
                  f"{statistics.median(r.seconds):7.3f} {r.ratio:7.2f} {f'({low:.2f}-{high:.2f})':>13} {planned:>8} "
                  f"{error:>7} {flash:>9} {r.over:>5} {'same' if same else 'DIFF':>5}")
        for line in over_lines(ours):
            print(f"  {line}")
        print(f"  the machine's noise (plain again against plain): {machine_noise:.1%}")
        checks = _targets(plain, checkpoint, ours)
        if machine_noise >= NOISE_LIMIT:
            print(f"  NOT JUDGED: noise {machine_noise:.1%} is {NOISE_LIMIT:.0%} or more; run again on a quieter machine")
            met = False
            continue
        for text, ok in checks:
            print(f"  {'met ' if ok else 'MISSED'}  {text}")
        met = met and all(ok for _, ok in checks)
    return met


def over_lines(rows: list[Row]) -> list[str]:
    """One line for each step the agent's memory check stopped: the row, its round and step, the agent's figure
    against the row's budget, and the step's time."""
    lines = []
    for r in rows:
        for o in r.over_steps:
            seen = f"{o['memory'] / MB:.1f} MB" if o.get("memory") is not None else "an unknown figure"
            budget = f"{r.budget / MB:.1f} MB" if r.budget else "its budget"
            lines.append(f"over: {r.label}, round {o['round']}, step {o['step'] + 1}: the agent's check read {seen} "
                         f"against {budget} plus tolerance, in {o['seconds']:.3f} s")
    return lines


def _targets(plain: Row, checkpoint: Row, ours: list[Row]) -> list[tuple[str, bool]]:
    def best(limit: float) -> Row | None:
        fitting = [r for r in ours if r.ratio <= limit]
        return min(fitting, key=lambda r: r.peak) if fitting else None

    checks = []
    for share in sorted(TARGETS, reverse=True):
        limit, row = TARGETS[share], best(TARGETS[share])
        text = (f"memory <= {share} of plain's at <= {limit}x its time: "
                + (f"{row.peak / plain.peak:.2f} at {row.ratio:.2f}x ({row.label})" if row
                   else "no row of ours within that time"))
        checks.append((text, row is not None and row.peak <= share * plain.peak))
    at_checkpoint = [r for r in ours if r.peak <= checkpoint.peak]
    fastest = min(at_checkpoint, key=lambda r: r.ratio) if at_checkpoint else None
    checks.append((f"at torch.utils.checkpoint's memory ({checkpoint.peak / MB:.1f} MB, {checkpoint.ratio:.2f}x) no "
                   "slower than it: " + (f"{fastest.label}, {fastest.peak / MB:.1f} MB at {fastest.ratio:.2f}x"
                                          if fastest else "no row of ours within its memory"),
                   fastest is not None and fastest.ratio <= checkpoint.ratio))
    stored = next((r for r in ours if r.label == "ours, no paging"), None)
    checks.append((f"the executor's own cost, nothing paged or recomputed, <= {OVERHEAD_TARGET}x: "
                   + (f"{stored.ratio:.2f}x" if stored else "no such row"),
                   stored is not None and stored.ratio <= OVERHEAD_TARGET))
    predicted = [r for r in ours if r.predicted_s]
    worst = max(predicted, key=lambda r: abs(r.prediction_error), default=None)
    checks.append((f"the planner's step time within {PREDICTION_TARGET:.0%} of the measured in every row of ours: "
                   + (f"at most {worst.prediction_error:+.0%} ({worst.label})" if worst else "no row"),
                   worst is not None and abs(worst.prediction_error) <= PREDICTION_TARGET))
    checks.append(("no step over its budget plus tolerance (the agent's check on)",
                   all(r.over == 0 for r in ours)))
    checks.append(("parameters and optimizer state bit-identical to plain after 3 steps in every row",
                   all(d == plain.digests[0] for r in (checkpoint, *ours) for d in r.digests)))
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help=f"comma-separated, of {', '.join(MODELS)} (default {','.join(DEFAULT_MODELS)})")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default 1,2)")
    parser.add_argument("--plan-time", type=float, default=90.0,
                        help="seconds for the search of the smallest feasible budget (default 90)")
    parser.add_argument("--workdir", help="where profiles, schedules and page files go (default a temporary one)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help=f"rounds of fresh processes, every configuration in each (default {ROUNDS})")
    parser.add_argument("--refine", action="store_true",
                        help="profile with the refined cut (poet-edge profile's default) instead of the default cut")
    parser.add_argument("--json", metavar="FILE", help="write every figure here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--profile-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=STEPS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child or args.profile_child:
        args.threads = int(args.threads)
        if args.profile_child:
            _profile_child(args)
        else:
            print(json.dumps(run_child(args)))
        return 0
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {', '.join(MODELS)}")
    counts = [int(t) for t in args.threads.split(",")]
    with tempfile.TemporaryDirectory(prefix="poet-memory-", dir="/var/tmp") as scratch:
        workdir = Path(args.workdir or scratch)
        results = [bench_model(name, threads, workdir, args.plan_time, args.rounds, args.refine)
                   for name in models for threads in counts]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if report(results) else 1


if __name__ == "__main__":
    sys.exit(main())
