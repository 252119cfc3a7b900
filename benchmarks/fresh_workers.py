"""Fresh workers on one prepared schedule: does every one's step stay within its budget?

    python -m benchmarks.fresh_workers [--model agent.digits:residual_digits_workload --input 192x1x8x8
                                        --budget 17.5MB --workers 6 --steps 12]

The defaults are ``make demo``'s Pi 4.  The agent prepares the workload once (profile and plan, on this
machine); then each worker is the daemon's own training worker (``python -m agent.daemon.worker``) in a fresh
process, starting from the step-0 checkpoint (``--resume``: from the last worker's), training ``--steps`` steps
with the memory check on.  A step's memory is the agent's own figure: the worker's peak RSS above the process
with the model loaded, plus what the model's first run left.  It depends a little on the process (where the
caching allocator's blocks lie, what oneDNN caches), so one worker cannot say that a budget holds.

Prints per worker, as it ends, its first step's memory, the range of the later ones and how far over the budget
it went; then the plan's parts and how many workers had a step over the budget and over the budget plus the
agent's tolerance.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agent.config import load_config
from common.units import parse_bytes
from agent.digits import write_device_data
from demo.devices import FakeDevice, write_config


@dataclass(frozen=True)
class Worker:
    """One fresh worker's steps: the memory of each (bytes) and the bound the agent checks them against."""

    memory: list[int]
    budget: int
    bound: int
    planned: dict[str, int]  # the plan's parts: activations, gradients, optimizer state, runtime

    @property
    def over(self) -> int:
        """Bytes by which the largest step went over the budget (0 when none did)."""
        return max(0, max(self.memory) - self.budget)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fresh_workers", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="agent.digits:residual_digits_workload",
                        help="zoo name or package.module:factory")
    parser.add_argument("--input", default="192x1x8x8", help="batch shape (the digits' for the default data)")
    parser.add_argument("--budget", default="17.5MB", help="the whole-step memory budget")
    parser.add_argument("--workers", type=int, default=6, help="fresh worker processes, one after another")
    parser.add_argument("--steps", type=int, default=12, help="steps each worker trains")
    parser.add_argument("--resume", action="store_true", help="each worker resumes from the last one's checkpoint")
    parser.add_argument("--dir", type=Path, help="keep the config, profile and schedule here (default: a "
                        "temporary folder; a folder already prepared is used as it is)")
    args = parser.parse_args(argv)
    if args.dir is not None:
        workers = run(args.dir, args)
    else:
        with tempfile.TemporaryDirectory(prefix="poet-fresh-workers-", dir="/var/tmp") as tmp:
            workers = run(Path(tmp), args)
    report(workers, args)
    return 0


def run(folder: Path, args: argparse.Namespace) -> list[Worker]:
    folder.mkdir(parents=True, exist_ok=True)
    device = FakeDevice(folder / "root")
    data = write_device_data(folder / "digits.npz", 0, 3)
    config_path = write_config(folder, device, data, args.model, args.input, training_memory_budget=args.budget,
                               training_steps_per_window=args.steps, training_checkpoint_every=args.steps)
    config = load_config(config_path)
    print(f"== {args.model} {args.input} at {parse_bytes(args.budget) / 1e6:.2f} MB: profiling and planning once ...",
          flush=True)
    from agent.prepare import prepare

    prepare(config, say=lambda _: None)
    workers = []
    for number in range(1, args.workers + 1):
        if not args.resume:
            shutil.rmtree(config.device.state_dir / "checkpoints", ignore_errors=True)
        w = _worker(config_path)
        workers.append(w)
        later = w.memory[1:] or w.memory
        print(f"   worker {number}: first step {w.memory[0] / 1e6:.2f} MB, later {min(later) / 1e6:.2f}-"
              f"{max(later) / 1e6:.2f} MB" + (f", {w.over / 1e6:.2f} MB over the budget" if w.over else ""),
              flush=True)
    return workers


def _worker(config_path: Path) -> Worker:
    """Run the daemon's training worker once, in a fresh process; its step events."""
    done = subprocess.run([sys.executable, "-m", "agent.daemon.worker", "--config", str(config_path)],
                          capture_output=True, text=True, timeout=1800)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0:
        errors = [e.get("message") for e in events if e.get("event") == "error"]
        raise SystemExit(f"the worker failed ({done.returncode}): {errors or done.stderr[-2000:]}")
    ready = next(e for e in events if e["event"] == "ready")
    steps = [e for e in events if e["event"] == "step"]
    return Worker([e["peak_bytes"] for e in steps], ready["memory_budget"], steps[0]["bound_bytes"],
                  ready["predicted_parts"])


def report(workers: list[Worker], args: argparse.Namespace) -> None:
    budget, bound = workers[0].budget, workers[0].bound
    peaks = [max(w.memory) for w in workers]
    print()
    print("the plan: " + ", ".join(f"{name} {value / 1e6:.2f} MB" for name, value in workers[0].planned.items()))
    over = sum(1 for w in workers if w.over)
    print(f"{len(workers)} fresh workers x {args.steps} steps: largest step {min(peaks) / 1e6:.2f}-"
          f"{max(peaks) / 1e6:.2f} MB against a budget of {budget / 1e6:.2f} MB; {over} of {len(workers)} had a "
          f"step over the budget, {sum(1 for p in peaks if p > bound)} over the budget plus the agent's tolerance "
          f"({(bound - budget) / 1e6:.2f} MB)")


if __name__ == "__main__":
    sys.exit(main())
