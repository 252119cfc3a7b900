"""Plain PyTorch's step as its users run it: glibc's default allocator, in a fresh process.

The benchmarks time plain PyTorch beside the executor with large tensors on mmap
(``MALLOC_MMAP_THRESHOLD_=65536``, :func:`engine.rss.return_freed_memory`): freed memory then leaves the
process, which the executor needs so that RSS follows its budget, and every fresh page costs a fault.  A user
of plain PyTorch has no such need: glibc keeps freed tensors in its heap and hands them out again.  This is
that yardstick, measured in a process of its own (the allocator's mode is process-wide), so a benchmark can
print its ratios against both.  Its speed has a price in memory: the freed tensors glibc keeps are resident, so
the process holds more than the step's live peak.  That is measured too, as a user would see it: the peak RSS
over the steps above the process with its model and gradients in place (the heap trimmed once before them).

``python -m benchmarks.default_allocator --zoo NAME --shape S [--threads N] [--steps K]`` prints, as JSON, the
seconds of the fastest of ``K`` forward-and-backward steps (after one warm-up step) and that RSS growth.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from engine.rss import FREED_MEMORY_THRESHOLD

MMAP_VARIABLE = "MALLOC_MMAP_THRESHOLD_"


def default_allocator_environment(**extra: str) -> dict[str, str]:
    """This process's environment for a child that runs with glibc's default allocator, plus ``extra``."""
    return {**{name: value for name, value in os.environ.items() if name != MMAP_VARIABLE}, **extra}


def returned_memory_environment(**extra: str) -> dict[str, str]:
    """This process's environment for a child that runs as the executor's steps do, large tensors on mmap so
    that freed memory leaves the process (:func:`engine.rss.return_freed_memory`), plus ``extra``."""
    return {**os.environ, MMAP_VARIABLE: str(FREED_MEMORY_THRESHOLD), **extra}


@dataclass(frozen=True)
class DefaultAllocatorStep:
    """Plain PyTorch's step with glibc's default allocator: its fastest time, and the memory it held for it."""

    seconds: float
    growth_bytes: int | None  # peak RSS over the steps above the process with model and gradients; None off Linux


def plain_step(zoo: str, shape: tuple[int, ...], threads: int, steps: int = 8) -> DefaultAllocatorStep:
    """The fastest of ``steps`` plain forward-and-backward steps of zoo model ``zoo`` at ``shape``, and the peak
    RSS growth over them, in a fresh process with glibc's default allocator and ``threads`` compute threads."""
    env = default_allocator_environment()
    command = [sys.executable, "-m", "benchmarks.default_allocator", "--zoo", zoo,
               "--shape", "x".join(map(str, shape)), "--threads", str(threads), "--steps", str(steps)]
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"timing plain {zoo} with the default allocator failed:\n{out.stderr[-3000:]}")
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    return DefaultAllocatorStep(float(figures["seconds"]), figures["growth_bytes"])


def _measure(zoo: str, shape: tuple[int, ...], threads: int, steps: int) -> DefaultAllocatorStep:
    import torch

    from engine import rss
    from agent.zoo import load_workload

    torch.set_num_threads(threads)
    work = load_workload(zoo, shape)

    def step() -> float:
        work.model.zero_grad(set_to_none=False)  # gradients in place, as every method's step in the benchmarks
        started = time.perf_counter()
        work.loss_fn(work.model(work.inputs), work.targets).backward()
        return time.perf_counter() - started

    step()  # makes the gradients and lazily made state; what it leaves in the heap goes with the trim below
    before = rss.start_window()
    times = [step() for _ in range(steps + 1)]  # the first fills the heap again: first-touch page faults
    peak = rss.peak_since_start()
    return DefaultAllocatorStep(min(times[1:]), None if before is None or peak is None else peak - before)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", required=True, help="a model name from agent.zoo")
    parser.add_argument("--shape", required=True, help="input shape, e.g. 8x128")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args(argv)
    if os.environ.get(MMAP_VARIABLE):
        parser.error(f"run without {MMAP_VARIABLE}: this is plain PyTorch with glibc's default allocator")
    from agent.zoo import parse_shape

    print(json.dumps(asdict(_measure(args.zoo, parse_shape(args.shape), args.threads, args.steps))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
