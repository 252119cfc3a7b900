"""Benchmarks: figures measured side by side in one run, printed as tables and ratios.

Each is a module of the installed package, run as ``python -m benchmarks.NAME``
(``solver``, ``executor``, ``validate``, ``paging``, ``plan_time``); ``--help``
tells what each measures.  They assert nothing: the tests do that.
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
