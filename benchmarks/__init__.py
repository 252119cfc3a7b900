"""Benchmarks: figures measured side by side in one run, printed as tables and ratios.

Each is a module of the installed package, run as ``python -m benchmarks.NAME``
(``solver``, ``executor``, ``validate``, ``paging``, ``plan_time``); ``--help``
tells what each measures.  They assert nothing: the tests do that.

Modules:

- :mod:`~benchmarks.solver`: our MILP against the dense published formulation on the reference graphs (``make
  bench``)
- :mod:`~benchmarks.reference_milp`: the POET MILP exactly as published, dense: the yardstick (used by
  ``benchmarks.solver``)
- :mod:`~benchmarks.executor`: POET schedules run for real against plain PyTorch, ``torch.utils.checkpoint`` and
  disk offload
- :mod:`~benchmarks.validate`: predictions against measurements over memory budgets, per model
- :mod:`~benchmarks.paging`: the pager's bandwidth against the filesystem's raw bandwidth
- :mod:`~benchmarks.plan_time`: ``plan()``'s wall time against its time limit on every case of the executor
  benchmark
- :mod:`~benchmarks.agent`: the agent daemon's waiting cost, stop latency, checkpoint cost and restart
- :mod:`~benchmarks.fleet_scale`: time per round against the fleet's size (``poet-edge simulate``, 100 to 1,000
  devices)
- :mod:`~benchmarks.flower_overhead`: Flower's cost per round on a device, cold ClientApps against the warm
  runner
- :mod:`~benchmarks.server_load`, :mod:`~benchmarks.load_client`, :mod:`~benchmarks.server_rig`,
  :mod:`~benchmarks.postgres`: the fleet server under simulated devices; the asyncio load client; server
  processes and enrolment; a temporary PostgreSQL cluster
- :mod:`~benchmarks.memory`: a whole training step's memory and time: plain PyTorch, ``torch.utils.checkpoint`,
  ours at three budgets
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def reference_graph_dir() -> Path | None:
    """The folder of POET reference graphs: ``$POET_GRAPHS``, else ``shared/bench/poet_graphs`` beside or inside
    the checkout; ``None`` when there is none."""
    candidates = [Path(os.environ["POET_GRAPHS"])] if os.environ.get("POET_GRAPHS") else []
    candidates += [REPO.parent / "shared" / "bench" / "poet_graphs", REPO / "shared" / "bench" / "poet_graphs"]
    return next((c for c in candidates if c.is_dir()), None)
