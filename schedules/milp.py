"""The POET MILP: energy-optimal rematerialization and paging under memory and runtime budgets.

The published formulation
-------------------------
Patil et al., "POET: Training Neural Networks on Tiny Devices with Integrated
Rematerialization and Paging" (ICML 2022), over a ``T x T`` grid of stages ``t``
(stage ``t`` computes node ``t``) and nodes ``i``; ``m_i`` bytes, ``ms_i``
compute time, ``e = (i, k)`` an edge (``k`` consumes ``i``)::

    binary  R[t,i]     compute i in stage t          SRam[t,i]  i in RAM at the start of t
            SSd[t,i]   i on flash at the start of t  MIn[t,i]   page i in during t
            MOut[t,i]  page i out during t           Free_E[t,e] i may be freed after k in t
    real    U[t,k] in [0, budget]   memory after computing k in stage t, before k's inputs are freed

    minimise  sum_t,i  R[t,i] compute_j[i] + MIn[t,i] pagein_j[i] + MOut[t,i] pageout_j[i]
    s.t.  R[t,t] = 1;  R, MIn, MOut = 0 for i > t;  SRam, SSd = 0 for i >= t
          R[t,v]      <= R[t,u] + SRam[t,u]                        (u, v) in E
          SRam[t+1,i] <= SRam[t,i] + R[t,i] + MIn[t,i]
          SSd[t+1,i]  <= SSd[t,i] + MOut[t,i]
          MIn <= SSd,  MOut <= SRam
          Free_E[t,(i,k)] = R[t,k] AND NOT SRam[t+1,i] AND NOT any R[t,j], j in succ(i), j > k
                            (two aggregated big-M inequalities per (t, e))
          U[t,0]   = R[t,0] m_0 + sum_i SRam[t,i] m_i
          U[t,k+1] = U[t,k] + R[t,k+1] m_{k+1} - sum_{(i,k) in E} m_i Free_E[t,(i,k)]
          U[t,k] + R[t,k] w_k <= budget    (our addition: w_k, node k's workspace while it computes)
          sum_t,i R[t,i] ms_i <= runtime budget

``paging=False`` fixes SSd, MIn, MOut to 0 (remat-only, Checkmate);
``remat=False`` fixes R to the identity (paging-only).  The optional
``paging_time_ms`` refinement (off by default) adds ``sum MIn ms_in + MOut ms_out``
to the runtime row, for devices whose paging does not overlap compute.  The
optional ``read_ahead`` refinement (off by default) leaves room for the pages
read in during stage ``t`` beside the stage's own computation:
``U[t,t] + w_t + sum_i MIn[t,i] m_i <= budget``, which is where the executor
reads them ahead (:mod:`schedules.timeline`), so no page-in waits for its whole read.
Given read times (``read_ahead_ms``), a page whose read outlasts node ``t``'s
computation takes that room beside the own nodes of the stages before ``t``
too, back until their compute time covers the read (slow flash: an 8 MB page
at 80 MB/s reads through ten to twenty BERT nodes).

Our reductions (each keeps the optimum of the published model)
---------------------------------------------------------------
1. *Only variables that can be non-zero.*  Backward nodes are computed exactly
   once (``R[t,b] = 0`` for ``t != b``; a design rule of the product: gradients
   are exactly those of plain backpropagation).  ``last_use[i]`` is the last
   stage at which any consumer of ``i`` can run, so ``R[t,i]`` and
   ``SRam[t,i]`` exist for ``i < t <= last_use[i]`` only.  Fixed entries
   (``R[t,t]``) become constants.
1b. *Paging where it can pay off.*  A page-out can move to the start of the
   residency it belongs to and a page-in to the stage right before the next
   consumer, without changing energy and without raising memory; and a value
   once on flash stays there.  So ``MOut[t,i] <= R[t-1,i]`` (exists only right
   after a computation of ``i``), ``MIn[t,i] <= sum_j R[t+1,j]`` over the
   consumers ``j`` (exists only right before one), and ``SSd`` lives only
   between the first possible page-out and the last possible page-in.
   :func:`canonical_plan` moves a warm start's paging to these places.
2. *Disaggregated hazards.*  ``Free_E`` only ever lowers ``U``, so it is enough
   to bound it from above by each of its conditions:
   ``F <= R[t,k]``, ``F <= 1 - SRam[t+1,i]``, ``F <= 1 - R[t,j]`` (``j > k`` a
   consumer of ``i`` computable in ``t``).  At integral ``R``/``SRam`` the best
   ``F`` is the published indicator, so ``F`` is continuous in [0, 1]; the LP
   relaxation is the AND-polytope, much tighter than the big-M pair.  An
   ``F`` with one condition is replaced by it, one with none by 1, one whose
   condition is a fixed ``R[t,j] = 1`` is dropped.
3. *Memory only where it can peak.*  Within a stage ``U`` only rises where a
   node is computed, so it is bounded at those positions only, through a chain
   ``U[t,k] >= U[t,prev] + (computed since) - (freed since)``, ``0 <= U <= 1``
   (only the upper bound binds, so ``>=`` is exact).  Positions where even
   every candidate value resident would fit are not checked, and nothing freed
   after a stage's own node can lower a checked ``U``.  (With the chain as
   equalities and ``U`` free below, HiGHS 1.15.1's MIP presolve returned a
   non-optimal "optimum" on a 14-node chain; switching its presolve off, or
   writing the chain this way, gives the true one.  Tests pin that instance.)
4. *Continuous SRam and SSd.*  With ``R``, ``MIn``, ``MOut`` integral, rounding
   a feasible fractional ``SRam`` down to its integer part keeps every
   constraint (dependencies and ``MOut <= SRam`` need a full 1) and lowers
   memory; ``SSd`` likewise.  Only ``R``, ``MIn`` and ``MOut`` are branched on,
   and :meth:`PoetFormulation.decode` rebuilds ``SRam`` as the least residency
   the rounded decisions need.
5. *Units.*  Bytes are divided by the memory budget, joules by the store-all
   energy, milliseconds by the runtime budget, so every coefficient is
   O(1) and HiGHS' tolerances mean the same thing on every graph.  (The dense
   formulation in raw joules stops above the optimum on ``linear_a72``, whose
   costs sit below HiGHS' default tolerances.)

Search (HiGHS)
--------------
Every cost is non-negative, so the store-all energy is a lower bound, and
store-all itself is the optimum whenever it fits (checked first: no solve).
Otherwise: (a) the warm start, if any, is the first incumbent; (b) the LP
relaxation gives a bound (dual simplex; interior point without crossover for
models over :data:`LARGE_MODEL_NONZEROS` nonzeros, 3.5x faster on bert); (c)
the integer columns the LP left integral are fixed and the small MIP that
remains is solved (the POET relaxation is tight: on vgg16_cifar 34 of 4878
integers are fractional and this gives a plan within 4e-6 of the optimum in
0.2 s); (d) HiGHS' branch and bound starts from the best plan so far.  On
large models whose simplex root would not fit in the time left, (d) is
skipped; ``relax_and_round`` stops after (c).  Progress is reported after
each phase and from HiGHS' MIP callbacks.

Measured by ``python -m benchmarks.solver`` (one thread, a busy 2-core machine; ours at
gap 1e-6 with the best baseline as warm start, the dense reference at HiGHS'
default 1e-4, 600 s): vgg16_cifar 1.5 MB / 1.5 optimal in 1.1 s (reference
20.7 s, same optimum within 5e-8); resnet18_cifar 3 MB / 7.6 optimal in 0.2 s
(reference 85 s); resnet18_cifar 1.5 MB / 1.5 7.89687 J, gap 3.5e-4, in 60 s
(reference 7.92585 J, gap 4.2e-3, at 600 s); at half the forward activations
and 1.5: vgg16 gap 3.3e-6, resnet18 1.7e-4, bert 3.3e-4 (LP bound) and
resnet50 9.9e-4 (its LP takes 240 s: the bound is store-all's), each in 60 s.
Tried without a measurable gain: ``R + SRam <= 1``, ``MIn + SRam <= 1``,
"recompute only what is read" for input nodes, binary ``SRam``, HiGHS
heuristic-effort and symmetry options.

Solvers
-------
The model is built once as a sparse matrix (:class:`SparseMilp`).  The same
matrix becomes a PuLP ``LpProblem`` (:func:`build_pulp_problem`, used for CBC
and for inspection or export) or is handed to ``highspy`` in one ``passModel``
call.  Driving highspy directly rather than through ``pulp.HiGHS`` costs one
code path but buys what the wrapper cannot do: build in milliseconds instead
of one Python call per column and row, report progress from HiGHS' MIP
callbacks, warm-start with ``setSolution``, run the LP-and-round phases on the
same arrays and read the proven bound and gap.  CBC runs the model as one
MIP (no phases, no progress, no bound).
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from schedules.errors import SolverError
from schedules.graph import TrainingGraph
from schedules.matrices import Matrices

__all__ = ["MilpOutcome", "SolveProgress", "PoetFormulation", "SparseMilp", "build_pulp_problem", "solve_poet_milp"]

INF = math.inf


@dataclass(frozen=True)
class SolveProgress:
    """A snapshot of a running solve, in joules."""

    elapsed_s: float
    incumbent_j: float | None
    bound_j: float | None
    gap: float | None


@dataclass(frozen=True)
class MilpOutcome:
    """What a solve returned; ``matrices`` is the best schedule found, if any."""

    status: str  # "optimal" | "feasible" | "infeasible" | "no_solution"
    objective_j: float | None
    bound_j: float | None
    gap: float | None
    solve_seconds: float
    matrices: Matrices | None


# --------------------------------------------------------------------------- sparse model
@dataclass
class SparseMilp:
    """A MILP as plain arrays: columns with bounds, costs and integrality; rows in CSR form."""

    col_names: list[str] = field(default_factory=list)
    col_lower: list[float] = field(default_factory=list)
    col_upper: list[float] = field(default_factory=list)
    col_cost: list[float] = field(default_factory=list)
    col_integer: list[bool] = field(default_factory=list)
    row_lower: list[float] = field(default_factory=list)
    row_upper: list[float] = field(default_factory=list)
    row_start: list[int] = field(default_factory=lambda: [0])
    row_index: list[int] = field(default_factory=list)
    row_value: list[float] = field(default_factory=list)
    offset: float = 0.0
    contradiction: str | None = None  # set when a constant row is violated: the model is infeasible

    @property
    def num_cols(self) -> int:
        return len(self.col_names)

    @property
    def num_rows(self) -> int:
        return len(self.row_lower)

    def add_col(self, name: str, lower: float, upper: float, cost: float, integer: bool) -> int:
        """Append a column; returns its index."""
        self.col_names.append(name)
        self.col_lower.append(lower)
        self.col_upper.append(upper)
        self.col_cost.append(cost)
        self.col_integer.append(integer)
        return len(self.col_names) - 1

    def objective(self, x: np.ndarray) -> float:
        """The objective of column vector ``x`` (offset included)."""
        return float(np.dot(self.col_cost, x)) + self.offset

    def is_feasible(self, x: np.ndarray, tol: float = 1e-6) -> bool:
        """True when ``x`` meets every bound, integrality and row within ``tol``."""
        lower, upper = np.asarray(self.col_lower), np.asarray(self.col_upper)
        if np.any(x < lower - tol) or np.any(x > upper + tol):
            return False
        integer = np.asarray(self.col_integer)
        if np.any(np.abs(x[integer] - np.round(x[integer])) > tol):
            return False
        if self.num_rows == 0:
            return True
        values = np.asarray(self.row_value) * x[np.asarray(self.row_index, dtype=np.int64)]
        activity = np.add.reduceat(values, np.asarray(self.row_start[:-1], dtype=np.int64)) if len(values) else 0.0
        within_lower = np.all(activity >= np.asarray(self.row_lower) - tol)
        return bool(within_lower and np.all(activity <= np.asarray(self.row_upper) + tol))

    def add_row(self, terms: dict[int, float], lower: float, upper: float, why: str) -> None:
        """Append ``lower <= sum terms <= upper``; a row without terms is checked at once."""
        terms = {c: v for c, v in terms.items() if v != 0.0}
        if not terms:
            if lower > 1e-9 or upper < -1e-9:
                self.contradiction = self.contradiction or why
            return
        self.row_lower.append(lower)
        self.row_upper.append(upper)
        self.row_index.extend(terms)
        self.row_value.extend(terms.values())
        self.row_start.append(len(self.row_index))


# --------------------------------------------------------------------------- formulation
Expr = tuple[dict[int, float], float]  # linear terms {column: coefficient} plus a constant


class PoetFormulation:
    """The reduced POET MILP for one graph and budget (see the module docstring)."""

    def __init__(self, graph: TrainingGraph, *, memory_budget: float | None, runtime_budget_ms: float | None,
                 paging: bool = True, remat: bool = True,
                 paging_time_ms: tuple[Sequence[float], Sequence[float]] | None = None,
                 io_time_ms: tuple[Sequence[float], Sequence[float]] | None = None,
                 read_ahead: bool = False, read_ahead_ms: Sequence[float] | None = None) -> None:
        self.graph = graph
        self.T = graph.size
        self.memory_budget = memory_budget
        self.paging, self.remat = paging, remat
        self.read_ahead = read_ahead and paging
        self.read_ms = list(read_ahead_ms) if read_ahead_ms is not None else None  # sizes read-ahead room
        self.model = SparseMilp()
        self.energy_scale = _energy_scale(graph)
        self.R: dict[tuple[int, int], int] = {}
        self.SRam: dict[tuple[int, int], int] = {}
        self.SSd: dict[tuple[int, int], int] = {}
        self.MIn: dict[tuple[int, int], int] = {}
        self.MOut: dict[tuple[int, int], int] = {}
        self.F: dict[tuple[int, int, int], int] = {}
        self.U: dict[tuple[int, int], int] = {}
        self._memory_rows: list[tuple[int, int]] = []  # (U column, its defining row), in chain order
        self._add_columns()
        self._add_dependencies()
        self._add_persistence()
        if paging:
            self._add_paging()
        if runtime_budget_ms is not None:
            self._add_runtime(float(runtime_budget_ms), paging_time_ms)
            if io_time_ms is not None and paging:
                self._add_io_time(float(runtime_budget_ms), io_time_ms)
        if memory_budget is not None:
            self._add_memory(float(memory_budget))

    # -- columns -------------------------------------------------------------------
    def _add_columns(self) -> None:
        """Create R, SRam, MOut, MIn, SSd where they can be non-zero (reduction 1)."""
        g, m, scale = self.graph, self.model, self.energy_scale
        m.offset = sum(n.compute_j for n in g.nodes) / scale  # R[t,t] = 1
        for i, node in enumerate(g.nodes):
            if self.remat and not g.is_backward(i):
                for t in range(i + 1, g.last_use[i] + 1):
                    self.R[t, i] = m.add_col(f"R_{t}_{i}", 0, 1, node.compute_j / scale, True)
        for i in range(self.T):
            for t in range(i + 1, g.last_use[i] + 1):
                self.SRam[t, i] = m.add_col(f"SRam_{t}_{i}", 0, 1, 0.0, False)
        if self.paging:
            for i in range(self.T):
                self._add_paging_columns(i)

    def compute_stages(self, i: int) -> list[int]:
        """The stages in which node ``i`` may be computed, ascending."""
        return [i] + [t for t in range(i + 1, self.graph.last_use[i] + 1) if (t, i) in self.R]

    def _add_paging_columns(self, i: int) -> None:
        """MOut, MIn and SSd of node ``i`` where paging can pay off (reduction 1b).

        A page-out can move to the start of its residency interval and a page-in
        to the stage before a consumer runs without changing energy and without
        raising memory, so ``MOut[t,i]`` exists only right after a computation
        of ``i`` and ``MIn[t,i]`` only right before one of its consumers.
        """
        g, m, scale, node = self.graph, self.model, self.energy_scale, self.graph.nodes[i]
        consumer_stages = sorted({t for j in g.successors[i] for t in self.compute_stages(j)})
        page_in = [t - 1 for t in consumer_stages if t - 1 >= i + 2]
        page_out = [t + 1 for t in self.compute_stages(i) if page_in and t + 1 < page_in[-1]]
        if not page_out:
            return
        page_in = [t for t in page_in if t > page_out[0]]
        for t in page_out:
            self.MOut[t, i] = m.add_col(f"MOut_{t}_{i}", 0, 1, node.pageout_j / scale, True)
        for t in range(page_out[0] + 1, page_in[-1] + 1):
            self.SSd[t, i] = m.add_col(f"SSd_{t}_{i}", 0, 1, 0.0, False)
        for t in page_in:
            self.MIn[t, i] = m.add_col(f"MIn_{t}_{i}", 0, 1, node.pagein_j / scale, True)

    def r(self, t: int, i: int) -> Expr:
        """``R[t,i]`` as an expression: 1 on the diagonal, a column, or 0."""
        if t == i:
            return {}, 1.0
        col = self.R.get((t, i))
        return ({col: 1.0}, 0.0) if col is not None else ({}, 0.0)

    def can_compute(self, t: int, i: int) -> bool:
        """True when node ``i`` may be computed in stage ``t``."""
        return t == i or (t, i) in self.R

    # -- constraints ---------------------------------------------------------------
    def _add_dependencies(self) -> None:
        """``R[t,v] <= R[t,u] + SRam[t,u]`` wherever ``v`` can be computed."""
        for u, v in sorted(set(self.graph.edges)):
            for t in range(v, self.T):
                if not self.can_compute(t, v):
                    continue
                terms, const = _combine((self.r(t, v), 1.0), (self.r(t, u), -1.0))
                if (t, u) in self.SRam:
                    terms[self.SRam[t, u]] = terms.get(self.SRam[t, u], 0.0) - 1.0
                self.model.add_row(terms, -INF, -const, f"node {v} at stage {t} needs node {u}")

    def _add_persistence(self) -> None:
        """``SRam[t+1,i] <= SRam[t,i] + R[t,i] + MIn[t,i]`` (trivial right after ``i`` is computed)."""
        for (t1, i), col in self.SRam.items():
            t = t1 - 1
            if t == i:
                continue
            terms = {col: 1.0}
            for source in (self.SRam.get((t, i)), self.R.get((t, i)), self.MIn.get((t, i))):
                if source is not None:
                    terms[source] = -1.0
            self.model.add_row(terms, -INF, 0.0, f"node {i} resident at stage {t1}")

    def _add_paging(self) -> None:
        """Flash persistence; page in what is on flash, right before a consumer; page out what was just computed."""
        for (t, i), col in self.SSd.items():
            terms = {col: 1.0}
            for source in (self.SSd.get((t - 1, i)), self.MOut.get((t - 1, i))):
                if source is not None:
                    terms[source] = -1.0
            self.model.add_row(terms, -INF, 0.0, f"node {i} on flash at stage {t}")
        for (t, i), col in self.MIn.items():
            self.model.add_row({col: 1.0, self.SSd[t, i]: -1.0}, -INF, 0.0, "page in from flash")
            consumers = [self.r(t + 1, j) for j in self.graph.successors[i] if self.can_compute(t + 1, j)]
            terms, const = _combine(*((c, -1.0) for c in consumers))
            if const == 0.0:  # no consumer certainly runs at t + 1
                terms[col] = 1.0
                self.model.add_row(terms, -INF, 0.0, "page in only right before a consumer")
        for (t, i), col in self.MOut.items():
            self.model.add_row({col: 1.0, self.SRam[t, i]: -1.0}, -INF, 0.0, "page out from RAM")
            if (t - 1, i) in self.R:
                self.model.add_row({col: 1.0, self.R[t - 1, i]: -1.0}, -INF, 0.0, "page out right after computing")

    def _add_runtime(self, budget_ms: float, paging_time_ms: tuple[Sequence[float], Sequence[float]] | None) -> None:
        """Recomputation (and optionally paging) time within what the budget leaves after one pass."""
        g = self.graph
        allowance = budget_ms - g.total_compute_ms
        # in units of the whole budget, not of the allowance: at a budget of one pass the allowance is 0, and
        # dividing by it gave coefficients of 1e15, which HiGHS >= 1.16 refuses to load
        scale = max(budget_ms, g.total_compute_ms, 1e-9)
        terms = {col: g.nodes[i].compute_ms / scale for (t, i), col in self.R.items()}
        if paging_time_ms is not None:
            page_in_ms, page_out_ms = paging_time_ms
            terms.update({col: page_in_ms[i] / scale for (t, i), col in self.MIn.items()})
            terms.update({col: page_out_ms[i] / scale for (t, i), col in self.MOut.items()})
        self.model.add_row(terms, -INF, allowance / scale, "runtime budget")

    def _add_io_time(self, budget_ms: float, io_time_ms: tuple[Sequence[float], Sequence[float]]) -> None:
        """Paging beside compute still runs on one I/O thread: its total time fits the step's budget."""
        page_in_ms, page_out_ms = io_time_ms
        scale = max(budget_ms, 1e-12)
        terms = {col: page_in_ms[i] / scale for (t, i), col in self.MIn.items()}
        terms.update({col: page_out_ms[i] / scale for (t, i), col in self.MOut.items()})
        self.model.add_row(terms, -INF, 1.0, "I/O thread time")

    def _add_memory(self, budget: float) -> None:
        """Hazard variables and the memory chain of every stage (reductions 2 and 3)."""
        if budget <= 0:
            self.model.contradiction = "memory budget must be positive"
            return
        inputs: list[list[int]] = [[] for _ in range(self.T)]
        for i, k in sorted(set(self.graph.edges)):
            inputs[k].append(i)
        nbytes = [n.bytes / budget for n in self.graph.nodes]
        # read-ahead room: a page read in during stage t is read beside the own computations of stages
        # s..t, as many as its read takes (just t without read times)
        reads: list[dict[int, float]] = [{} for _ in range(self.T)]
        if self.read_ahead:
            for (t, i), col in self.MIn.items():
                for s in self.read_stages(t, i):
                    reads[s][col] = nbytes[i]
        for t in range(self.T):
            self._add_stage_memory(t, budget, inputs, nbytes, reads[t])

    def read_stages(self, t: int, i: int) -> range:
        """The stages whose own computation a read of node ``i``'s page for stage ``t`` runs beside: ``t`` and,
        given read times (``read_ahead_ms``), the stages before it until their own nodes' compute time covers the
        read (never before stage ``i + 1``: the page is written after ``i`` is computed)."""
        s = t
        if self.read_ms is not None:
            covered = self.graph.nodes[t].compute_ms
            while covered < self.read_ms[i] and s - 1 > i:
                s -= 1
                covered += self.graph.nodes[s].compute_ms
        return range(s, t + 1)

    def _add_stage_memory(self, t: int, budget: float, inputs: list[list[int]], nbytes: list[float],
                          reads: dict[int, float]) -> None:
        """``U`` after each possible computation of stage ``t`` stays within the budget (reduction 3).

        Positions where even keeping every candidate value would fit are not
        checked, and what is freed after the stage's own node ``t`` (always the
        last computation of the stage) cannot lower any checked ``U``.  ``reads``
        (``MIn`` column -> bytes / budget) are the page-ins whose read-ahead room is
        kept beside node ``t``: this stage's and, with read times, later stages'
        whose reads run through it (:meth:`read_stages`; empty unless ``read_ahead``).
        """
        m = self.model
        workspace = [n.workspace_bytes / budget for n in self.graph.nodes]
        positions = [k for k in range(t + 1) if self.can_compute(t, k)]
        terms: dict[int, float] = {self.SRam[t, i]: nbytes[i] for i in range(t) if (t, i) in self.SRam}
        most = sum(terms.values())  # U if every candidate were resident and nothing freed
        if most + sum(nbytes[k] for k in positions) + max(workspace[k] for k in positions) + sum(reads.values()) \
                <= 1.0 + 1e-9:
            return  # this stage fits whatever is decided
        const, previous = 0.0, None
        for k in positions:
            r_terms, r_const = self.r(t, k)
            for col, coef in r_terms.items():
                terms[col] = terms.get(col, 0.0) + coef * nbytes[k]
            const += r_const * nbytes[k]
            most += nbytes[k]
            beside = reads if k == t else {}
            if most + workspace[k] + sum(beside.values()) > 1.0 + 1e-9:
                # U[t,k] >= U[t,prev] + (computed since) - (freed since): only U's upper bound matters, so
                # ">=" is exact; equalities with free-below U trip a HiGHS 1.15 presolve bug (see docstring)
                u = m.add_col(f"U_{t}_{k}", 0.0, 1.0, 0.0, False)
                self.U[t, k] = u
                terms[u] = -1.0
                if previous is not None:
                    terms[previous] = terms.get(previous, 0.0) + 1.0
                self._memory_rows.append((u, m.num_rows))
                m.add_row(terms, -INF, -const, f"memory at stage {t} after node {k}")
                if workspace[k] or beside:  # while k computes it also holds its workspace (and reads ahead)
                    m.add_row({u: 1.0, **{c: v * workspace[k] for c, v in r_terms.items()}, **beside},
                              -INF, 1.0 - r_const * workspace[k], f"workspace of node {k} at stage {t}")
                previous, terms, const = u, {}, 0.0
            if k == t:
                break
            for i in inputs[k]:
                f_terms, f_const = self._free(t, i, k)
                for col, coef in f_terms.items():
                    terms[col] = terms.get(col, 0.0) - coef * nbytes[i]
                const -= f_const * nbytes[i]

    def _free(self, t: int, i: int, k: int) -> Expr:
        """``Free_E[t,(i,k)]``: may ``i`` be freed after ``k`` in stage ``t``? (reduction 2)."""
        conditions: list[Expr] = []  # each condition is an expression that must be 1
        if t != k:
            conditions.append(({self.R[t, k]: 1.0}, 0.0))
        if (t + 1, i) in self.SRam:
            conditions.append(({self.SRam[t + 1, i]: -1.0}, 1.0))
        for j in self.graph.successors[i]:
            if j > k and self.can_compute(t, j):
                if j == t:
                    return {}, 0.0  # a later consumer certainly runs in this stage
                conditions.append(({self.R[t, j]: -1.0}, 1.0))
        if len(conditions) <= 1:
            return conditions[0] if conditions else ({}, 1.0)
        col = self.model.add_col(f"F_{t}_{i}_{k}", 0, 1, 0.0, False)
        self.F[t, i, k] = col
        for c_terms, c_const in conditions:
            self.model.add_row({col: 1.0, **{c: -v for c, v in c_terms.items()}}, -INF, c_const, "hazard")
        return {col: 1.0}, 0.0

    # -- solutions -----------------------------------------------------------------
    def decode(self, x: Sequence[float]) -> Matrices:
        """Read the plan from a column vector.

        ``R``, ``MIn`` and ``MOut`` are rounded; ``SRam`` (continuous, reduction 4)
        is rebuilt as the least residency those decisions need, which is never
        more than the solver's values and so never more memory; ``SSd`` holds
        from the stage after the first page-out on.
        """
        mats = Matrices.empty(self.T)
        np.fill_diagonal(mats.R, True)
        for grid, cols in ((mats.R, self.R), (mats.MIn, self.MIn), (mats.MOut, self.MOut)):
            for (t, i), col in cols.items():
                grid[t, i] = x[col] > 0.5
        for i in range(self.T):
            mats.SRam[:, i] = _least_residency(self.graph, mats, i)
        mats.SSd[1:] = np.cumsum(mats.MOut, axis=0)[:-1] > 0
        return mats

    def encode(self, mats: Matrices) -> np.ndarray:
        """A full column vector for ``mats`` (a warm start): flash, hazards and memory derived exactly."""
        x = np.zeros(self.model.num_cols)
        for grid, cols in ((mats.R, self.R), (mats.SRam, self.SRam), (mats.MIn, self.MIn), (mats.MOut, self.MOut)):
            for (t, i), col in cols.items():
                x[col] = float(grid[t, i])
        for (t, i), col in self.SSd.items():  # ascending t per node: the previous stage is already set
            before = self.SSd.get((t - 1, i)), self.MOut.get((t - 1, i))
            x[col] = min(1.0, sum(x[c] for c in before if c is not None))
        for (t, i, k), col in self.F.items():
            x[col] = self._free_value(x, t, i, k)
        m = self.model
        for u_col, row in self._memory_rows:  # in chain order, so each U's predecessor is known
            start, end = m.row_start[row], m.row_start[row + 1]
            others = sum(v * x[c] for c, v in zip(m.row_index[start:end], m.row_value[start:end]) if c != u_col)
            x[u_col] = max(others - m.row_upper[row], 0.0)
        return x

    def _free_value(self, x: np.ndarray, t: int, i: int, k: int) -> float:
        """The exact hazard indicator for integral ``x``."""
        value = 1.0 if t == k else x[self.R[t, k]]
        if (t + 1, i) in self.SRam:
            value = min(value, 1.0 - x[self.SRam[t + 1, i]])
        for j in self.graph.successors[i]:
            if j > k and (t, j) in self.R:
                value = min(value, 1.0 - x[self.R[t, j]])
        return value


def _least_residency(graph: TrainingGraph, mats: Matrices, i: int) -> np.ndarray:
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


def _combine(*parts: tuple[Expr, float]) -> Expr:
    """``sum weight * expr`` over the given (expr, weight) pairs."""
    terms: dict[int, float] = {}
    const = 0.0
    for (p_terms, p_const), weight in parts:
        for col, coef in p_terms.items():
            terms[col] = terms.get(col, 0.0) + weight * coef
        const += weight * p_const
    return terms, const


def _energy_scale(graph: TrainingGraph) -> float:
    """The store-all energy: objectives are solved in multiples of it."""
    if not graph.has_energy:
        raise SolverError("the graph has no energy costs; price it with a device profile first (schedules.plan does)")
    total = sum(n.compute_j for n in graph.nodes)
    return total if total > 0 else 1.0


# --------------------------------------------------------------------------- solving
def solve_poet_milp(graph: TrainingGraph, *, memory_budget: float | None, runtime_budget_ms: float | None,
                    paging: bool = True, remat: bool = True, solver: str = "highs",
                    time_limit: float | None = None, gap: float = 1e-4, threads: int = 1,
                    warm_start: Matrices | None = None, relax_and_round: bool = False,
                    paging_time_ms: tuple[Sequence[float], Sequence[float]] | None = None,
                    io_time_ms: tuple[Sequence[float], Sequence[float]] | None = None,
                    read_ahead: bool = False, read_ahead_ms: Sequence[float] | None = None,
                    progress: Callable[[SolveProgress], None] | None = None) -> MilpOutcome:
    """Solve POET's MILP for ``graph``; an infeasible budget is a status, not an exception.

    Parameters
    ----------
    memory_budget:
        Activation bytes allowed at any moment; ``None`` for no limit.
    runtime_budget_ms:
        Compute time allowed for the step; ``None`` for no limit.
    paging, remat:
        Switch paging (remat-only baseline) or recomputation (paging-only) off.
    solver:
        ``"highs"`` (highspy; CBC when highspy is missing) or ``"cbc"``.
    time_limit, gap, threads:
        Wall-clock seconds for the whole call, relative MIP gap to prove, solver threads.
    warm_start:
        A feasible plan (e.g. the best baseline) given to the solver as its first incumbent.
    relax_and_round:
        Solve the LP relaxation, fix what it decides firmly, solve the rest, and stop;
        the gap is then measured against the LP bound.  For graphs beyond exact reach.
    paging_time_ms:
        ``(page-in ms, page-out ms)`` per node: count paging time in the runtime
        budget (devices whose paging does not overlap compute).  Off by default.
    io_time_ms:
        The same columns for devices whose paging overlaps compute: paging
        then costs the compute thread nothing, but the total of all transfers,
        done in turn by one I/O thread, must fit the runtime budget.  Off by default.
    read_ahead:
        Leave room under the memory budget for the pages read in during each
        stage beside that stage's own computation (:mod:`schedules.timeline`:
        the executor reads a page ahead where the budget holds it), so that no
        page-in waits for its whole read.  The published formulation has a
        page-in take memory only once its consumer's stage starts.  Off by default.
    read_ahead_ms:
        With ``read_ahead``, the read time of each node's page: a read that
        outlasts the stage's own computation gets room beside the own
        computations of as many stages before as it takes (slow flash), at
        the price of memory the plan could otherwise use.
    progress:
        Called with a :class:`SolveProgress` after each phase and while HiGHS searches.
    """
    clock = _Clock(time_limit)
    _check_arguments(graph, solver, gap, threads, time_limit,
                     {"paging_time_ms": paging_time_ms, "io_time_ms": io_time_ms}, read_ahead, read_ahead_ms)
    form = PoetFormulation(graph, memory_budget=memory_budget, runtime_budget_ms=runtime_budget_ms,
                           paging=paging, remat=remat, paging_time_ms=paging_time_ms, io_time_ms=io_time_ms,
                           read_ahead=read_ahead, read_ahead_ms=read_ahead_ms)
    if form.model.contradiction is not None:
        return MilpOutcome("infeasible", None, None, None, clock.elapsed(), None)
    start = _warm_start_vector(form, warm_start)
    search = _Search(form, clock, progress)
    # store-all costs exactly the lower bound: when it fits, it is optimal and nothing need be solved
    search.offer(form.encode(store_all_plan(graph)), "store-all")
    if start is not None:
        search.offer(start, "warm start")
    if _backend(solver) == "cbc":
        search.absorb(_solve_cbc(form.model, clock.remaining(), gap, threads, search.x))
    else:
        _search_with_highs(search, gap, threads, relax_and_round)
    return search.outcome(gap)


class _Clock:
    """Elapsed and remaining wall-clock time of one solve."""

    def __init__(self, limit: float | None) -> None:
        self.started = time.perf_counter()
        self.limit = limit

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def remaining(self) -> float | None:
        return None if self.limit is None else max(self.limit - self.elapsed(), 0.0)

    def out_of_time(self) -> bool:
        left = self.remaining()
        return left is not None and left < 0.01


@dataclass
class _RawResult:
    """One solver run's answer in the model's (normalised) units."""

    status: str  # "optimal" | "feasible" | "infeasible" | "no_solution"
    x: np.ndarray | None
    bound: float | None


class _Search:
    """The best plan and the best lower bound known so far, across the phases of a solve.

    Every cost is non-negative, so the store-all energy (the model's offset) is a
    lower bound before any LP is solved.
    """

    def __init__(self, form: PoetFormulation, clock: _Clock, progress: Callable[[SolveProgress], None] | None) -> None:
        self.form, self.clock, self.progress = form, clock, progress
        self.x: np.ndarray | None = None
        self.value = INF
        self.bound = form.model.offset
        self.infeasible = False
        self.proven = False  # a solver said "optimal" for the requested gap

    def offer(self, x: np.ndarray | None, source: str) -> bool:
        """Keep ``x`` if it is feasible and better than the incumbent."""
        if x is None or not self.form.model.is_feasible(x):
            return False
        value = self.form.model.objective(x)
        if value >= self.value - 1e-12:
            return False
        self.x, self.value = x, value
        self.report()
        return True

    def raise_bound(self, bound: float | None) -> None:
        if bound is not None and math.isfinite(bound) and bound > self.bound:
            self.bound = min(bound, self.value)
            self.report()

    def absorb(self, raw: _RawResult) -> None:
        """Take a solver run's answer into account."""
        if raw.status == "infeasible" and self.x is None:
            self.infeasible = True
            return
        self.offer(raw.x, "solver")
        self.raise_bound(raw.bound)
        self.proven = self.proven or (raw.status == "optimal" and self.x is not None)

    def gap(self) -> float | None:
        if self.x is None:
            return None
        return max(self.value - self.bound, 0.0) / max(abs(self.value), 1e-12)

    def closed(self, gap: float) -> bool:
        """True when the incumbent is proven within ``gap`` of the optimum."""
        g = self.gap()
        return g is not None and g <= gap + 1e-12

    def report(self, incumbent: float | None = None, bound: float | None = None) -> None:
        """Tell ``progress`` where the solve stands (optionally with a running solver's figures)."""
        if self.progress is None:
            return
        scale = self.form.energy_scale
        value = min(self.value, incumbent if incumbent is not None else INF)
        lower = max(self.bound, bound if bound is not None and math.isfinite(bound) else -INF)
        known = math.isfinite(value)
        self.progress(SolveProgress(
            elapsed_s=self.clock.elapsed(),
            incumbent_j=value * scale if known else None,
            bound_j=lower * scale,
            gap=max(value - lower, 0.0) / max(abs(value), 1e-12) if known else None,
        ))

    def outcome(self, gap: float) -> MilpOutcome:
        """The answer in joules, with matrices re-priced exactly from the plan."""
        seconds = self.clock.elapsed()
        scale = self.form.energy_scale
        if self.x is None:
            status = "infeasible" if self.infeasible else "no_solution"
            return MilpOutcome(status, None, None if self.infeasible else self.bound * scale, None, seconds, None)
        mats = self.form.decode(self.x)
        status = "optimal" if self.proven or self.closed(gap) else "feasible"
        return MilpOutcome(status, plan_energy(self.form.graph, mats), self.bound * scale, self.gap(), seconds, mats)


def _check_arguments(graph: TrainingGraph, solver: str, gap: float, threads: int, time_limit: float | None,
                     time_columns: dict[str, tuple[Sequence[float], Sequence[float]] | None],
                     read_ahead: bool = False, read_ahead_ms: Sequence[float] | None = None) -> None:
    """Reject arguments that would make the solver fail obscurely (or be ignored)."""
    if solver not in ("highs", "cbc"):
        raise SolverError(f"unknown solver {solver!r}: use 'highs' or 'cbc'")
    if not gap >= 0:
        raise SolverError(f"the MIP gap must be >= 0, got {gap}")
    if threads < 1:
        raise SolverError(f"threads must be >= 1, got {threads}")
    if time_limit is not None and not time_limit > 0:
        raise SolverError(f"the time limit must be positive seconds, got {time_limit}")
    for name, columns in time_columns.items():
        if columns is not None and any(len(col) != graph.size for col in columns):
            raise SolverError(f"{name} needs (page-in, page-out) lists of {graph.size} values each")
    if read_ahead_ms is not None and len(read_ahead_ms) != graph.size:
        raise SolverError(f"read_ahead_ms needs one read time per node ({graph.size} values)")
    if read_ahead_ms is not None and not read_ahead:
        raise SolverError("read_ahead_ms sizes the read-ahead room: pass read_ahead=True with it")


def _backend(solver: str) -> str:
    """``"highs"`` when highspy imports, else CBC (also when CBC was asked for)."""
    if solver == "highs":
        try:
            import highspy  # noqa: F401
            return "highs"
        except ImportError:
            pass
    import pulp
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        available = pulp.PULP_CBC_CMD(msg=False).available()
    if not available:
        raise SolverError("no MILP solver: install highspy (pip install highspy) or CBC (PuLP's bundled cbc)")
    return "cbc"


def _warm_start_vector(form: PoetFormulation, warm_start: Matrices | None) -> np.ndarray | None:
    """Encode the warm-start plan as a column vector (``None`` when there is none)."""
    if warm_start is None:
        return None
    if warm_start.R.shape != (form.T, form.T):
        raise SolverError(f"warm start matrices are {warm_start.R.shape}, the graph needs {(form.T, form.T)}")
    return form.encode(canonical_plan(form.graph, warm_start))


def canonical_plan(graph: TrainingGraph, mats: Matrices) -> Matrices:
    """The same plan with page-outs and page-ins where the reduced model expects them.

    Each node is paged out at most once, in the stage right after the
    computation whose value it writes, and each page-in moves to the stage
    right before the next consumer; residency is then rebuilt as the least
    the plan needs.  Energy never rises and memory never does either, so a
    feasible warm start stays feasible (reduction 1b of the module docstring).
    """
    out = Matrices(mats.R.copy(), np.zeros_like(mats.SRam), np.zeros_like(mats.SSd),
                   np.zeros_like(mats.MIn), np.zeros_like(mats.MOut))
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
        out.SRam[:, i] = _least_residency(graph, out, i)
    out.SSd[1:] = np.cumsum(out.MOut, axis=0)[:-1] > 0
    return out


def _first_write(mats: Matrices, i: int) -> int | None:
    """The stage right after the computation whose value the first page-out of ``i`` writes."""
    outs = np.flatnonzero(mats.MOut[:, i])
    if outs.size == 0:
        return None
    computed = [c for c in np.flatnonzero(mats.R[:, i]).tolist() if c < outs[0]]
    return computed[-1] + 1 if computed else int(outs[0])


def store_all_plan(graph: TrainingGraph) -> Matrices:
    """Plain backpropagation: every node computed once, each value kept until its last consumer."""
    mats = Matrices.empty(graph.size)
    np.fill_diagonal(mats.R, True)
    for i in range(graph.size):
        mats.SRam[:, i] = _least_residency(graph, mats, i)
    return mats


def plan_energy(graph: TrainingGraph, mats: Matrices) -> float:
    """POET's objective for a plan: compute + page-in + page-out joules."""
    nodes = graph.nodes
    compute = np.array([n.compute_j for n in nodes])
    page_in = np.array([n.pagein_j for n in nodes])
    page_out = np.array([n.pageout_j for n in nodes])
    return float(mats.R.sum(axis=0) @ compute + mats.MIn.sum(axis=0) @ page_in + mats.MOut.sum(axis=0) @ page_out)


# --------------------------------------------------------------------------- HiGHS
LARGE_MODEL_NONZEROS = 150_000  # beyond this the LP goes to the interior-point solver (bert_a72: 3.5x faster)


def _search_with_highs(search: _Search, gap: float, threads: int, relax_and_round: bool) -> None:
    """LP relaxation, a rounding heuristic on it, then branch and bound from the best plan known.

    The LP gives a bound and, since the POET relaxation is tight, a plan close
    to optimal once its few fractional decisions are settled by a small MIP
    (the rest fixed).  Given that incumbent, HiGHS usually proves the gap at
    its root instead of spending its first seconds on cuts and heuristics.
    On large models, where HiGHS' root LP alone would not fit in the time
    left, the branch and bound is skipped and the LP bound is the answer's.
    """
    model, clock = search.form.model, search.clock
    if search.closed(gap):
        search.proven = True
        return
    large = len(model.row_index) > LARGE_MODEL_NONZEROS
    search.report()  # the LP may take a while: say where things stand before it
    lp_started = time.perf_counter()
    lp = _solve_highs(model, clock.remaining(), gap, threads, None, None, relaxation=True, interior=large)
    lp_seconds = time.perf_counter() - lp_started
    if lp.status == "infeasible":
        search.infeasible = search.x is None
        return
    search.raise_bound(lp.bound)
    if lp.x is None or search.closed(gap) or clock.out_of_time():
        return
    rounded = _round_relaxation(model, lp.x, _rounding_time(clock, lp_seconds), gap, threads,
                                tolerance=1e-3 if large else 1e-6, cutoff=search.value)
    search.offer(rounded, "rounding")
    left = clock.remaining()
    no_time = left is not None and large and left < 4.0 * lp_seconds  # the simplex root LP is slower still
    if search.closed(gap) or relax_and_round or clock.out_of_time() or no_time:
        return
    search.absorb(_solve_highs(model, left, gap, threads, search.x, _progress_callback(search)))


def _rounding_time(clock: _Clock, lp_seconds: float) -> float:
    """Time for the rounding MIP: a few LP solves' worth, never most of what is left."""
    budget = 2.0 + 2.0 * lp_seconds
    left = clock.remaining()
    return budget if left is None else max(min(budget, 0.5 * left), 0.01)


def _round_relaxation(model: SparseMilp, x: np.ndarray, time_limit: float, gap: float, threads: int,
                      tolerance: float, cutoff: float) -> np.ndarray | None:
    """Fix every integer column the LP left (nearly) integral and solve the small MIP that remains."""
    integer = np.asarray(model.col_integer)
    settled = integer & (np.abs(x - np.round(x)) <= tolerance)
    lower = np.asarray(model.col_lower, dtype=float)
    upper = np.asarray(model.col_upper, dtype=float)
    lower[settled] = upper[settled] = np.round(x[settled])
    raw = _solve_highs(model, time_limit, gap, threads, None, None, bounds=(lower, upper), cutoff=cutoff)
    return raw.x


def _highs_model(model: SparseMilp):
    """The sparse model as a ``highspy.HighsLp`` (one bulk hand-over, no per-row calls)."""
    import highspy

    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = model.num_cols, model.num_rows
    lp.col_cost_ = np.asarray(model.col_cost, dtype=float)
    lp.col_lower_ = np.asarray(model.col_lower, dtype=float)
    lp.col_upper_ = np.asarray(model.col_upper, dtype=float)
    lp.row_lower_ = np.asarray(model.row_lower, dtype=float)
    lp.row_upper_ = np.asarray(model.row_upper, dtype=float)
    lp.offset_ = model.offset
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = model.num_cols, model.num_rows
    lp.a_matrix_.start_ = np.asarray(model.row_start, dtype=np.int32)
    lp.a_matrix_.index_ = np.asarray(model.row_index, dtype=np.int32)
    lp.a_matrix_.value_ = np.asarray(model.row_value, dtype=float)
    lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                       for i in model.col_integer]
    return lp


@functools.cache
def _silence_highs_banner() -> None:
    """Construct the process's first ``Highs`` with standard output pointed at /dev/null.

    HiGHS (1.16) prints its banner to file descriptor 1 from the first
    instance's constructor, before ``output_flag`` can be set, which would mix
    it into output a caller parses (``--json``, a pipe).  Later instances
    print nothing.
    """
    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _new_highs(time_limit: float | None, gap: float, threads: int):
    """A silent HiGHS instance with the limits set."""
    import highspy

    _silence_highs_banner()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", int(threads))
    h.setOptionValue("mip_rel_gap", float(gap))
    # objectives are in store-all units (about 1): HiGHS' default absolute gap (1e-6) would stop early
    h.setOptionValue("mip_abs_gap", 0.0)
    if time_limit is not None:
        h.setOptionValue("time_limit", max(float(time_limit), 0.01))
    return h


def _solve_highs(model: SparseMilp, time_limit: float | None, gap: float, threads: int,
                 start: np.ndarray | None, callback: Callable | None, relaxation: bool = False,
                 bounds: tuple[np.ndarray, np.ndarray] | None = None, interior: bool = False,
                 cutoff: float = INF) -> _RawResult:
    """One HiGHS run on ``model`` (or its LP relaxation, or with tightened bounds).

    ``interior`` solves the LP by interior point without crossover (no vertex,
    but a bound in a fraction of the simplex time); ``cutoff`` prunes every
    plan not better than a known one.
    """
    try:
        h = _new_highs(time_limit, gap, threads)
        lp = _highs_model(model)
        if relaxation:
            lp.integrality_ = []
        if interior:
            h.setOptionValue("solver", "ipm")
            h.setOptionValue("run_crossover", "off")
        if math.isfinite(cutoff):
            h.setOptionValue("objective_bound", float(cutoff))
        if bounds is not None:
            lp.col_lower_, lp.col_upper_ = bounds
        _check(h.passModel(lp), "load the model")
        if start is not None:
            h.setSolution(len(start), np.arange(len(start), dtype=np.int32), start)
        if callback is not None:
            h.cbMipInterrupt.subscribe(callback)
            h.cbMipImprovingSolution.subscribe(callback)
        _check(h.run(), "solve")
        return _highs_result(h, relaxation, interior)
    except SolverError:
        raise
    except Exception as exc:  # highspy raises plain exceptions from C++
        raise SolverError(f"HiGHS failed ({exc}); retry with solver='cbc' or report the graph file") from exc


def _check(status, what: str) -> None:
    import highspy

    if status == highspy.HighsStatus.kError:
        raise SolverError(f"HiGHS could not {what}; retry with solver='cbc' or report the graph file")


def _highs_result(h, relaxation: bool, interior: bool = False) -> _RawResult:
    """Status, solution and proven bound of a finished HiGHS run."""
    import highspy

    S = highspy.HighsModelStatus
    status, info = h.getModelStatus(), h.getInfo()
    if status in (S.kInfeasible, S.kUnboundedOrInfeasible):
        return _RawResult("infeasible", None, None)
    if status in (S.kLoadError, S.kModelError, S.kPresolveError, S.kSolveError, S.kPostsolveError):
        raise SolverError(f"HiGHS stopped with {h.modelStatusToString(status)}; retry with solver='cbc'")
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    x = np.array(h.getSolution().col_value) if has_solution else None
    if relaxation:
        if status != S.kOptimal:
            return _RawResult("no_solution", None, None)
        # an interior point stops within a small duality gap: step below it so the bound stays valid
        slack = max(abs(info.primal_dual_objective_error), 1e-9) if interior else 0.0
        value = info.objective_function_value
        return _RawResult("optimal", x, value - slack * max(abs(value), 1.0))
    if status == S.kOptimal:
        return _RawResult("optimal", x, info.mip_dual_bound)
    return _RawResult("feasible" if has_solution else "no_solution", x, info.mip_dual_bound)


def _progress_callback(search: _Search, every_s: float = 0.25) -> Callable | None:
    """A HiGHS MIP callback reporting to ``search`` at most every ``every_s`` seconds and on new incumbents."""
    if search.progress is None:
        return None
    last = [-INF]

    def report(event) -> None:
        now = time.perf_counter()
        improving = event.callback_type == _improving_solution_type()
        if not improving and now - last[0] < every_s:
            return
        last[0] = now
        out = event.data_out
        search.report(incumbent=out.mip_primal_bound, bound=out.mip_dual_bound)

    return report


def _improving_solution_type():
    import highspy

    return highspy.cb.HighsCallbackType.kCallbackMipImprovingSolution


# --------------------------------------------------------------------------- CBC (through PuLP)
def build_pulp_problem(model: SparseMilp, name: str = "POET"):
    """The sparse model as a PuLP ``LpProblem``; returns ``(problem, variables)`` in column order."""
    import pulp

    problem = pulp.LpProblem(name, pulp.LpMinimize)
    # PuLP >= 3.3 wants variables created by their problem; older releases only have LpVariable
    make = getattr(problem, "add_variable", None) or pulp.LpVariable
    variables = [
        make(n, None if lo == -INF else lo, None if up == INF else up, pulp.LpInteger if integer else pulp.LpContinuous)
        for n, lo, up, integer in zip(model.col_names, model.col_lower, model.col_upper, model.col_integer)
    ]
    problem += pulp.LpAffineExpression(
        [(v, c) for v, c in zip(variables, model.col_cost) if c != 0.0], constant=model.offset)
    for row in range(model.num_rows):
        start, end = model.row_start[row], model.row_start[row + 1]
        expr = pulp.LpAffineExpression(
            [(variables[c], v) for c, v in zip(model.row_index[start:end], model.row_value[start:end])])
        lo, up = model.row_lower[row], model.row_upper[row]
        if lo == up:
            problem += pulp.LpConstraint(expr, pulp.LpConstraintEQ, f"c{row}", lo)
            continue
        if lo != -INF:
            problem += pulp.LpConstraint(expr, pulp.LpConstraintGE, f"c{row}_lo", lo)
        if up != INF:
            problem += pulp.LpConstraint(expr, pulp.LpConstraintLE, f"c{row}", up)
    return problem, variables


def _solve_cbc(model: SparseMilp, time_limit: float | None, gap: float, threads: int,
               start: np.ndarray | None) -> _RawResult:
    """Solve with PuLP's bundled CBC (no progress reports, no proven bound)."""
    import pulp

    problem, variables = build_pulp_problem(model)
    if start is not None:
        for var, value in zip(variables, start):
            var.setInitialValue(round(value) if var.cat == pulp.LpInteger else value)
    with warnings.catch_warnings():  # PuLP 3.3 announces PULP_CBC_CMD's move to COIN_CMD in 4.0
        warnings.simplefilter("ignore", DeprecationWarning)
        backend = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, gapRel=gap, threads=threads,
                                    warmStart=start is not None)
    try:
        problem.solve(backend)
    except pulp.PulpSolverError as exc:
        raise SolverError(f"CBC failed ({exc}); check that PuLP's cbc binary runs, or use solver='highs'") from exc
    if problem.status == pulp.LpStatusInfeasible:
        return _RawResult("infeasible", None, None)
    if problem.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return _RawResult("no_solution", None, None)
    x = np.array([v.varValue or 0.0 for v in variables])
    return _RawResult("optimal" if problem.sol_status == pulp.LpSolutionOptimal else "feasible", x, None)
