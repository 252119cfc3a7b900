"""Plain PyTorch's step as its users run it: glibc's default allocator, in a fresh process.

The benchmarks time plain PyTorch beside the executor with large tensors on mmap
(``MALLOC_MMAP_THRESHOLD_=65536``, :func:`agent.rss.return_freed_memory`): freed memory then leaves the
process, which the executor needs so that RSS follows its budget, and every fresh page costs a fault.  A user
of plain PyTorch has no such need: glibc keeps freed tensors in its heap and hands them out again.  This is
that yardstick, measured in a process of its own (the allocator's mode is process-wide), so a benchmark can
print its ratios against both.

``python -m benchmarks.default_allocator --zoo NAME --shape S [--threads N] [--steps K]`` prints the seconds of
the fastest of ``K`` forward-and-backward steps (after one warm-up step) as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

MMAP_VARIABLE = "MALLOC_MMAP_THRESHOLD_"


def default_allocator_environment(**extra: str) -> dict[str, str]:
    """This process's environment for a child that runs with glibc's default allocator, plus ``extra``."""
    return {**{name: value for name, value in os.environ.items() if name != MMAP_VARIABLE}, **extra}


def plain_seconds(zoo: str, shape: tuple[int, ...], threads: int, steps: int = 8) -> float:
    """The fastest of ``steps`` plain forward-and-backward steps of zoo model ``zoo`` at ``shape``, in a fresh
    process with glibc's default allocator and ``threads`` compute threads."""
    env = default_allocator_environment()
    command = [sys.executable, "-m", "benchmarks.default_allocator", "--zoo", zoo,
               "--shape", "x".join(map(str, shape)), "--threads", str(threads), "--steps", str(steps)]
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"timing plain {zoo} with the default allocator failed:\n{out.stderr[-3000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])


def _measure(zoo: str, shape: tuple[int, ...], threads: int, steps: int) -> float:
    import torch

    from agent.zoo import load_workload

    torch.set_num_threads(threads)
    work = load_workload(zoo, shape)
    times = []
    for _ in range(steps + 1):  # the first is a warm-up: lazily made state, first-touch page faults
        work.model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        work.loss_fn(work.model(work.inputs), work.targets).backward()
        times.append(time.perf_counter() - started)
    return min(times[1:])


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

    print(json.dumps({"seconds": _measure(args.zoo, parse_shape(args.shape), args.threads, args.steps)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
