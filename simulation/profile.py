"""The fleet's model profiled once per seed and data set on this machine: the graph every virtual device of a
simulation plans from (run config ``graph-file``).

Extracting in each ClientApp process, with one timing sample, gave identical devices different schedules and
energies, and a seed run again different numbers.  :func:`profile_once` extracts in a fresh process (as a
device's ClientApp runs: workspaces measured by RSS in a process that has run much else are not a device's),
each node's time the median of several runs, and keeps the graph in :func:`profile_cache` for every later run.
``python -m simulation.profile SEED REPEATS OUT [TUNING [DATASET [LABEL_COLUMN]]]`` is that fresh process.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path


def profile_once(seed: int, cache: Path | None = None, repeats: int = 5, tuning: str = "", dataset: str = "",
                 label_column: str = "") -> Path:
    """The path of the fleet's model's graph for ``seed`` in ``cache`` (default :func:`profile_cache`),
    profiled now if it is not there yet, or no longer matches the model (another version of the code) or is
    damaged.  With ``tuning`` (a strategy that fine-tunes part of the model) the graph of that part trained;
    with ``dataset`` (a saved data set, :mod:`agent.image_sets`) the model sized to its images."""
    import torch

    from agent.digits import fleet_workload
    from engine.errors import ScheduleRefusedError
    from engine.extract import segments_matching
    from agent.federated.virtual import FleetData
    from schedules.errors import FormatError
    from schedules.graph import TrainingGraph

    data = FleetData(dataset=dataset, label_column=label_column)
    part = f"-{tuning}" if tuning else ""
    model = "digits"
    if dataset:  # the directory's name to read, its whole path's hash to tell copies apart
        where = hashlib.sha256(f"{Path(dataset).resolve()}:{label_column}".encode()).hexdigest()[:12]
        model = f"{Path(dataset).name}-{where}"
    path = (cache or profile_cache()) / f"{model}{part}-seed{seed}-torch{torch.__version__}.json"
    if path.is_file():
        try:
            segments_matching(fleet_workload(data, seed, tuning=tuning), TrainingGraph.load(path), source=str(path))
            return path
        except (FormatError, ScheduleRefusedError, OSError, ValueError):
            pass  # profiled by other code, or damaged: profile again
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    subprocess.run([sys.executable, "-m", "simulation.profile", str(seed), str(repeats), str(partial), tuning,
                    dataset, label_column], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    partial.replace(path)  # whole or not at all: another simulation may be reading it
    print(f"simulate: profiled the {model} model on this machine once, kept in {path} (remove it to profile "
          "again)", file=sys.stderr)
    return path


def profile_cache() -> Path:
    """Where simulations keep the graphs they profiled: ``$XDG_CACHE_HOME/poet-edge/simulate``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "poet-edge" / "simulate"


def _main(argv: list[str]) -> None:
    import torch

    from agent.digits import fleet_workload
    from engine.extract import extract
    from agent.federated.virtual import STDLIB_TEXT, FleetData

    seed, repeats, out = int(argv[0]), int(argv[1]), Path(argv[2])
    tuning, dataset, label_column = (*argv[3:], "", "", "")[:3]
    torch.set_num_threads(1)
    work = fleet_workload(FleetData(dataset=dataset, label_column=label_column), seed, tuning=tuning)
    # the decoder's layers are cut into their operators: cut at layers only, no schedule fits below a plain
    # step (each layer's attention is most of it); the digits' CNN keeps the coarse cut its figures were made on
    refine = dataset == STDLIB_TEXT
    graph, _ = extract(work.model, work.example, work.loss_fn, repeats=repeats, segments=work.segments, refine=refine)
    graph.save(out)


if __name__ == "__main__":
    _main(sys.argv[1:])
