"""Baseline planners with the same signature and result type as POET.

Each heuristic takes a :class:`BaselineProblem` and returns decision matrices
(or ``None`` when it has no answer within the budgets); :func:`schedules.plan`
turns them into a checked schedule.  The MILP-based baselines (remat-only,
i.e. Checkmate, and paging-only) live in :mod:`schedules.plan` as switches of
the MILP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from schedules.graph import TrainingGraph
from schedules.matrices import Matrices


@dataclass(frozen=True)
class BaselineProblem:
    """What a baseline plans for.

    ``counted_paging_ms`` is set only when paging time counts against the
    runtime budget; ``paging_ms`` (page-in, page-out ms per node) is the
    device's paging time whenever a device profile is known.
    """

    graph: TrainingGraph
    memory_budget: float | None
    runtime_budget_ms: float | None
    counted_paging_ms: tuple[Sequence[float], Sequence[float]] | None = None
    paging_ms: tuple[Sequence[float], Sequence[float]] | None = None


def store_all(problem: BaselineProblem) -> Matrices:
    """Plain backpropagation: compute every node once and keep it until its last use."""
    g = problem.graph
    m = Matrices.empty(g.size)
    for i in range(g.size):
        m.R[i, i] = True
        m.SRam[i + 1 : g.last_use[i] + 1, i] = True
    return m


HEURISTIC_BASELINES: dict[str, Callable[[BaselineProblem], Matrices | None]] = {
    "store-all": store_all,
}

__all__ = ["BaselineProblem", "HEURISTIC_BASELINES", "store_all", "np"]
