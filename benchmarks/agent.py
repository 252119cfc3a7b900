"""Agent benchmark: the daemon's costs and reaction times, a real agent process on a fake sysfs tree.

    python -m benchmarks.agent [--model resnet18 --input 8x3x64x64 --budget 0.4 --wait-seconds 60]

Prints, from one run: the waiting agent's RSS and CPU over ``--wait-seconds``
(targets: at most 60 MB and 1% of one core); the time from eligibility lost
(the charger unplugged) to the training process stopped, after the step in
progress (target: at most 2 s), over ``--stops`` repetitions; the cost of a
checkpoint against the training time between two checkpoints at the default
interval (target: at most 10%); and the time from restarting an agent killed
with ``kill -9`` to its first new step.

The data are random images with random labels (what is measured is the agent,
not learning); the schedule is planned on this machine for ``--budget`` of M,
the whole memory of the model's plain step with the agent's optimizer (SGD with
momentum): at the default the schedule recomputes, pages activations and keeps
optimizer state on flash.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from agent.config import TrainingSection, load_config
from agent.prepare import training_spec
from schedules.budgets import memory_lower_bound, store_all_peak
from demo.devices import FakeDevice, read_status, start_agent, stop, wait_for, write_config

TARGET_RSS_MB = 60.0
TARGET_CPU_PERCENT = 1.0
TARGET_STOP_SECONDS = 2.0
TARGET_CHECKPOINT_SHARE = 0.10


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.agent", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet18", help="zoo name or package.module:factory")
    parser.add_argument("--input", default="8x3x64x64", help="batch shape")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--budget", type=float, default=0.4,
                        help="fraction of M, a plain step's whole memory (raised to the graph's lower bound)")
    parser.add_argument("--wait-seconds", type=float, default=60.0, help="how long the waiting agent is watched")
    parser.add_argument("--stops", type=int, default=3, help="eligibility losses measured")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="poet-agent-bench-", dir="/var/tmp") as tmp:
        run(Path(tmp), args)
    return 0


def run(tmp: Path, args: argparse.Namespace) -> None:
    device = FakeDevice(tmp / "root")
    data = _images(tmp / "data.npz", args.input, args.classes)
    config_path = _configure(tmp, device, data, args, budget="1GB")
    print(f"== {args.model} {args.input}: profiling this machine once (the agent's first run does the same) ...")
    started = time.perf_counter()
    graph = _prepare(config_path)
    spec = training_spec(load_config(config_path))
    peak, floor = store_all_peak(graph, spec), memory_lower_bound(graph, spec)
    budget = max(int(args.budget * peak), floor)
    print(f"   {graph.size} nodes, M = {peak / 1e6:.1f} MB (lower bound {floor / peak:.0%} of M), profiled in "
          f"{time.perf_counter() - started:.0f} s; budget {budget / 1e6:.1f} MB ({budget / peak:.0%} of M)")
    config_path = _configure(tmp, device, data, args, budget=budget)

    rss_mb, cpu = _waiting(tmp, device, config_path, args.wait_seconds)
    stops, step_s = _stops(tmp, device, config_path, args.stops)
    share, checkpoint_s, interval = _checkpoint_share(config_path, tmp)
    resume_s = _resume_after_kill(tmp, config_path)

    print()
    print(f"{'figure':<58} {'measured':>12} {'target':>10}  ")
    rows = [
        ("waiting agent: peak RSS", f"{rss_mb:.1f} MB", f"<= {TARGET_RSS_MB:g} MB", rss_mb <= TARGET_RSS_MB),
        (f"waiting agent: CPU over {args.wait_seconds:g} s", f"{cpu:.2f}% core", f"<= {TARGET_CPU_PERCENT:g}%",
         cpu <= TARGET_CPU_PERCENT),
        (f"eligibility lost -> stopped, after the step (worst of {len(stops)})",
         f"{max(stops):.2f} s", f"<= {TARGET_STOP_SECONDS:g} s", max(stops) <= TARGET_STOP_SECONDS),
        (f"checkpoint / {interval} steps' training", f"{share:.3f}", f"<= {TARGET_CHECKPOINT_SHARE:g}",
         share <= TARGET_CHECKPOINT_SHARE),
        ("restart after kill -9 -> first new step", f"{resume_s:.1f} s", "-", None),
    ]
    for name, value, target, ok in rows:
        print(f"{name:<58} {value:>12} {target:>10}  {'' if ok is None else 'met' if ok else 'MISSED'}")
    print(f"(a step takes {step_s:.2f} s, a checkpoint {checkpoint_s:.2f} s; stops measured: "
          f"{', '.join(f'{s:.2f}' for s in stops)} s)")


def _images(path: Path, shape_text: str, classes: int, samples: int = 256) -> Path:
    shape = tuple(int(v) for v in shape_text.split("x"))
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.random((samples, *shape[1:]), dtype=np.float32), y=rng.integers(0, classes, samples))
    return path


def _configure(tmp: Path, device: FakeDevice, data: Path, args: argparse.Namespace, budget: int | str) -> Path:
    return write_config(tmp, device, data, args.model, args.input, workload_profile_repeats=3, training_memory_budget=budget,
                        training_steps_per_window=100000,
                        training_checkpoint_every=TrainingSection.checkpoint_every,
                        eligibility_poll_seconds=5.0, eligibility_training_poll_seconds=0.5,
                        schedule_solve_time_limit=60)


def _prepare(config_path: Path):
    from agent.prepare import prepare

    return prepare(load_config(config_path)).graph


def _waiting(tmp: Path, device: FakeDevice, config_path: Path, seconds: float) -> tuple[float, float]:
    """Peak RSS (MB) and mean CPU (% of one core) of the daemon waiting on battery."""
    device.unplug()
    agent = start_agent(config_path)
    try:
        wait_for(lambda: read_status(tmp).get("state") == "waiting", 60, "waiting", agent)
        time.sleep(2.0)  # past start-up
        cpu_start, wall_start = _cpu_seconds(agent.pid), time.monotonic()
        peak = 0
        while time.monotonic() - wall_start < seconds:
            peak = max(peak, _rss(agent.pid))
            time.sleep(1.0)
        cpu = (_cpu_seconds(agent.pid) - cpu_start) / (time.monotonic() - wall_start) * 100
        peak = max(peak, _peak_rss(agent.pid))
    finally:
        stop(agent)
    return peak / 1e6, cpu


def _stops(tmp: Path, device: FakeDevice, config_path: Path, count: int) -> tuple[list[float], float]:
    """Seconds from (eligibility lost, or the end of the step then running) to the training process's exit."""
    agent = start_agent(config_path)
    results, step_s = [], []
    try:
        for _ in range(count):
            before = read_status(tmp).get("steps_done", 0)
            device.plug()
            wait_for(lambda: _steps(tmp) >= before + 3, 600, "training steps", agent)
            time.sleep(0.37 * (len(results) + 1))  # unplug at different points of a step
            unplugged = time.time()
            device.unplug()
            status = wait_for(lambda: (s := read_status(tmp)).get("state") == "waiting" and s, 120, "stopped", agent)
            stopped_wall = time.time()
            after_step = status["last_stop_after_step_seconds"]
            # the stop happened at stopped_wall at the latest; what came after the step is after_step, and
            # the detection delay counts when the step had already ended before the unplug
            results.append(min(stopped_wall - unplugged, after_step + _poll_delay(status)))
            step_s.append(status["step_seconds"])
    finally:
        stop(agent)
    return results, statistics.median(step_s)


def _poll_delay(status: dict) -> float:
    return 0.5  # eligibility.training_poll_seconds: the longest the daemon takes to see the charger go


def _checkpoint_share(config_path: Path, tmp: Path) -> tuple[float, float, int]:
    """Checkpoint seconds / the seconds of the steps between two checkpoints (the default interval)."""
    import torch

    from agent.daemon.checkpoint import CheckpointStore
    from agent.prepare import prepare
    from agent.daemon.trainer import Trainer
    from agent.data import open_dataset

    torch.set_num_threads(1)
    config = load_config(config_path)
    prepared = prepare(config)
    data = open_dataset(config.data.path, tuple(prepared.workload.inputs.shape), seed=config.workload.seed)
    trainer = Trainer(config, prepared, data, store=CheckpointStore(tmp / "bench-checkpoints"))
    interval = config.training.checkpoint_every
    try:
        trainer.step()  # warm-up: optimizer state exists from here on
        started = time.perf_counter()
        for _ in range(interval):
            trainer.step()
        training = time.perf_counter() - started
        checkpoint = statistics.median(trainer.checkpoint() for _ in range(3))
    finally:
        trainer.close()
    return checkpoint / training, checkpoint, interval


def _resume_after_kill(tmp: Path, config_path: Path) -> float:
    """Seconds from restarting an agent killed with ``kill -9`` mid-training to its first new committed step."""
    agent = start_agent(config_path)
    FakeDevice(tmp / "root").plug()
    wait_for(lambda: _steps(tmp) >= 30, 600, "training steps", agent)
    stop(agent, 9)
    started = time.monotonic()
    agent = start_agent(config_path)
    try:
        # a fresh daemon's status has no step time until its worker commits a step
        wait_for(lambda: (s := read_status(tmp)).get("pid") == agent.pid and s.get("step_seconds") is not None,
                 600, "a new step", agent, interval=0.01)
        return time.monotonic() - started
    finally:
        stop(agent)


def _steps(tmp: Path) -> int:
    """Steps done so far; a failing agent ends the benchmark with its reason instead of a time-out."""
    status = read_status(tmp)
    if status.get("state") == "backing off":
        raise RuntimeError(f"the agent failed: {status.get('last_error')}")
    return status.get("steps_done", 0)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    raise SystemExit(main())
