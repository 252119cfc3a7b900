"""The digits model profiled once per seed on this machine: the graph every virtual device of a simulation plans
from (run config ``graph-file``).

Extracting in each ClientApp process, with one timing sample, gave identical devices different schedules and
energies, and a seed run again different numbers.  :func:`profile_once` extracts in a fresh process (as a
device's ClientApp runs: workspaces measured by RSS in a process that has run much else are not a device's),
each node's time the median of several runs, and keeps the graph in :func:`profile_cache` for every later run.
``python -m simulation.profile SEED REPEATS OUT [TUNING]`` is that fresh process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def profile_once(seed: int, cache: Path | None = None, repeats: int = 5, tuning: str = "") -> Path:
    """The path of the digits model's graph for ``seed`` in ``cache`` (default :func:`profile_cache`),
    profiled now if it is not there yet, or no longer matches the model (another version of the code) or is
    damaged.  With ``tuning`` (a strategy that fine-tunes part of the model) the graph of that part trained."""
    import torch

    from agent.digits import digits_workload
    from agent.errors import ScheduleRefusedError
    from agent.extract import segments_matching
    from schedules.errors import FormatError
    from schedules.graph import TrainingGraph

    part = f"-{tuning}" if tuning else ""
    path = (cache or profile_cache()) / f"digits{part}-seed{seed}-torch{torch.__version__}.json"
    if path.is_file():
        try:
            segments_matching(digits_workload(seed, tuning=tuning), TrainingGraph.load(path), source=str(path))
            return path
        except (FormatError, ScheduleRefusedError, OSError, ValueError):
            pass  # profiled by other code, or damaged: profile again
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    subprocess.run([sys.executable, "-m", "simulation.profile", str(seed), str(repeats), str(partial), tuning],
                   check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    partial.replace(path)  # whole or not at all: another simulation may be reading it
    print(f"simulate: profiled the digits model on this machine once, kept in {path} (remove it to profile "
          "again)", file=sys.stderr)
    return path


def profile_cache() -> Path:
    """Where simulations keep the graphs they profiled: ``$XDG_CACHE_HOME/poet-edge/simulate``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "poet-edge" / "simulate"


def _main(argv: list[str]) -> None:
    import torch

    from agent.digits import digits_workload
    from agent.extract import extract

    seed, repeats, out, tuning = int(argv[0]), int(argv[1]), Path(argv[2]), argv[3] if len(argv) > 3 else ""
    torch.set_num_threads(1)
    work = digits_workload(seed, tuning=tuning)
    graph, _ = extract(work.model, work.example, work.loss_fn, repeats=repeats, segments=work.segments)
    graph.save(out)


if __name__ == "__main__":
    _main(sys.argv[1:])
