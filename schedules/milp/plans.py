"""Plans as decision matrices: plain backpropagation, a plan's energy, and a plan in the model's canonical form.

These work on :class:`~schedules.matrices.Matrices` alone, without a model:
the formulation decodes its solutions with :func:`least_residency`, and the
solve turns a warm start into columns through :func:`canonical_plan`.
"""

from __future__ import annotations

import numpy as np

from schedules.graph import TrainingGraph
from schedules.matrices import Matrices


def store_all_plan(graph: TrainingGraph) -> Matrices:
    """Plain backpropagation: every node computed once, each value kept until its last consumer."""
    mats = Matrices.empty(graph.size)
    np.fill_diagonal(mats.R, True)
    for i in range(graph.size):
        mats.SRam[:, i] = least_residency(graph, mats, i)
    return mats


def plan_energy(graph: TrainingGraph, mats: Matrices) -> float:
    """POET's objective for a plan: compute + page-in + page-out joules."""
    nodes = graph.nodes
    compute = np.array([n.compute_j for n in nodes])
    page_in = np.array([n.pagein_j for n in nodes])
    page_out = np.array([n.pageout_j for n in nodes])
    return float(mats.R.sum(axis=0) @ compute + mats.MIn.sum(axis=0) @ page_in + mats.MOut.sum(axis=0) @ page_out)


def canonical_plan(graph: TrainingGraph, mats: Matrices) -> Matrices:
    """The same plan with page-outs and page-ins where the reduced model expects them.

    Each node is paged out at most once, in the stage right after the
    computation whose value it writes, and each page-in moves to the stage
    right before the next consumer; residency is then rebuilt as the least
    the plan needs.  Energy never rises and memory never does either, so a
    feasible warm start stays feasible (reduction 1b of
    :mod:`schedules.milp.formulation`).
    """
    out = Matrices(mats.R.copy(), np.zeros_like(mats.SRam), np.zeros_like(mats.SSd),
                   np.zeros_like(mats.MIn), np.zeros_like(mats.MOut), mats.state_on_flash)
    for i in range(graph.size):
        written = _first_write(mats, i)
        if written is None:
            continue
        out.MOut[written, i] = True
        consumed = np.zeros(graph.size, dtype=bool)
        for j in graph.successors[i]:
            consumed |= mats.R[:, j]
        for t in np.flatnonzero(mats.MIn[:, i]).tolist():
            later = [u for u in np.flatnonzero(consumed).tolist() if u > t and not mats.R[u, i]]
            if later:  # a page-in nobody reads afterwards is dropped
                out.MIn[max(later[0] - 1, written + 1), i] = True
    for i in range(graph.size):
        out.SRam[:, i] = least_residency(graph, out, i)
    out.SSd[1:] = np.cumsum(out.MOut, axis=0)[:-1] > 0
    return out


def _first_write(mats: Matrices, i: int) -> int | None:
    """The stage right after the computation whose value the first page-out of ``i`` writes."""
    outs = np.flatnonzero(mats.MOut[:, i])
    if outs.size == 0:
        return None
    computed = [c for c in np.flatnonzero(mats.R[:, i]).tolist() if c < outs[0]]
    return computed[-1] + 1 if computed else int(outs[0])


def least_residency(graph: TrainingGraph, mats: Matrices, i: int) -> np.ndarray:
    """Stages at whose start node ``i`` must be in RAM, given when it is computed, paged in and out.

    ``i`` is needed at the start of ``u`` when a consumer runs in ``u`` without
    ``i`` being recomputed there, or when ``u`` pages it out; it is then kept from
    its latest source before ``u`` (a computation, or a page-in, in stage ``c``)
    through ``u``.
    """
    T = graph.size
    computed = mats.R[:, i]
    consumed = np.zeros(T, dtype=bool)
    for j in graph.successors[i]:
        consumed |= mats.R[:, j]
    needed = (consumed & ~computed) | mats.MOut[:, i]
    resident = np.zeros(T, dtype=bool)
    source = computed | mats.MIn[:, i]
    last_source = -1
    for t in range(T):
        if needed[t] and last_source >= 0:
            resident[last_source + 1 : t + 1] = True
        if source[t]:
            last_source = t
    return resident
