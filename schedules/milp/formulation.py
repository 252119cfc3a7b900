"""POET's MILP over the stage grid, reduced to the columns and rows that can matter.

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
   :func:`schedules.milp.plans.canonical_plan` moves a warm start's paging
   to these places.
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

The whole step (our extension)
------------------------------
Given a :class:`~schedules.step_memory.StepMemory` (``step=``), the budget is
the step's whole memory.  Each stage's memory chain starts from what the step
holds beside activations there (``constant + stage_bytes[t]``, see
:mod:`schedules.step_memory`) plus the optimizer state left in RAM::

    binary  Y[g]   state group g lives on flash (read and written at its update, every step)
    real    Z      resident optimizer state / budget,   Z + sum_g s_g Y[g] >= S
    U[t,first] >= Z + (constant + stage_bytes[t]) / budget + sum_{g holds at t} behind_g Y[g] / budget + ...
                   (the first memory row of each stage; behind_g: a background update's gradients and
                   transient, held at the stage after node(g), or from node(g) on for a late group; a
                   table updated by rows also from its lookup on, and its overlay at every stage)
    minimise ... + sum_g Y[g] paging_j[g];  the I/O-thread row gains sum_g Y[g] io_ms[g], the runtime row
    what of it the computation beside does not cover:
    E[b] >= sum_{g: node(g) = b, not late} io_ms[g] Y[g] - compute_ms[b+1],  E[b] >= 0,
    E_tail >= sum_{g: start(g) >= s} io_ms[g] Y[g] - sum_{t >= s} compute_ms[t] - sum_{b+1 >= s} E[b]
              (each stage s a late group starts at: node(g)+1, or a table's lookup),  runtime += sum_b E[b] + E_tail

Without state paging (``state_paging=False``) ``Z`` is the constant ``S``.
Each update's transient memory joins its node's workspace.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from schedules.errors import SolverError
from schedules.graph import TrainingGraph
from schedules.matrices import Matrices
from schedules.milp.model import INF, SparseMilp
from schedules.milp.plans import least_residency, plan_energy
from schedules.step_memory import StateCosts, StepMemory

Expr = tuple[dict[int, float], float]  # linear terms {column: coefficient} plus a constant


class PoetFormulation:
    """The reduced POET MILP for one graph and budget (see the module docstring)."""

    def __init__(self, graph: TrainingGraph, *, memory_budget: float | None, runtime_budget_ms: float | None,
                 paging: bool = True, remat: bool = True,
                 paging_time_ms: tuple[Sequence[float], Sequence[float]] | None = None,
                 io_time_ms: tuple[Sequence[float], Sequence[float]] | None = None,
                 read_ahead: bool = False, read_ahead_ms: Sequence[float] | None = None,
                 step: StepMemory | None = None, state_costs: StateCosts | None = None) -> None:
        if step is not None and step.graph.fingerprint != graph.fingerprint:
            raise SolverError("the whole-step accounting was built for another graph")
        if step is not None and step.groups and step.spec.state_paging and state_costs is None:
            raise SolverError("optimizer state on flash needs its paging priced: pass state_costs")
        self.graph = graph
        self.T = graph.size
        self.step = step
        self.state_costs = state_costs
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
        self.Y: dict[int, int] = {}  # optimizer-state group -> its "on flash" column
        self.Z: int | None = None    # resident optimizer state / budget
        self._behind: dict[int, dict[int, float]] = {}  # stage -> {Y column: what its background update holds}
        self._memory_rows: list[tuple[int, int]] = []  # (U column, its defining row), in chain order
        self._wait_rows: list[tuple[int, int]] = []  # (E column, a row bounding it below), E[b] before E_tail
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
        if self.step is not None and self.step.groups and self.step.spec.state_paging:
            for k in range(len(self.step.groups)):
                self.Y[k] = m.add_col(f"Y_{k}", 0, 1, self.state_costs.energy_j[k] / scale, True)

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
        terms.update(self._exposed_state_paging(scale))
        self.model.add_row(terms, -INF, allowance / scale, "runtime budget")

    def _exposed_state_paging(self, scale: float) -> dict[int, float]:
        """Columns of the time the step waits for optimizer state on flash, the rows of
        :func:`schedules.step_memory.background_waits`: a node's background updates run beside the next
        node's computation and hold the step only for what that does not cover,
        ``E[b] >= sum_{g: node(g) = b} io_ms[g] Y[g] - compute_ms[b + 1]``, ``E[b] >= 0``; late groups' beside
        the rest of the step, ``E_tail >= sum_{g: start(g) >= s} io_ms[g] Y[g] - sum_{t >= s} compute_ms[t] -
        sum_{b + 1 >= s} E[b]`` for each stage ``s`` a late group starts at (``StateGroup.start``: the stage
        after its node, or a table's lookup).  Paging beside compute also slows it by the device's exposed
        share."""
        if not self.Y:
            return {}
        groups = self.step.groups
        share = self.state_costs.exposed_fraction  # paging beside compute slows it by this share anyway
        io = {col: self.state_costs.io_ms[k] / scale for k, col in self.Y.items()}
        exposed = {col: share * ms for col, ms in io.items()}
        by_node: dict[int, dict[int, float]] = {}
        for k, col in self.Y.items():
            if not groups[k].late:
                by_node.setdefault(groups[k].node, {})[col] = io[col]
        waits: dict[int, int] = {}  # node -> its E column
        for node, paging in by_node.items():
            covered = self.graph.nodes[node + 1].compute_ms / scale if node + 1 < self.T else 0.0
            waits[node] = col = self.model.add_col(f"E_{node}", 0.0, INF, 0.0, False)
            self._wait_rows.append((col, self.model.num_rows))
            self.model.add_row({col: 1.0, **{c: -v for c, v in paging.items()}}, -covered, INF,
                               f"state paging of node {node} beyond the next node's compute")
            exposed[col] = 1.0
        starts = sorted({groups[k].start for k in self.Y if groups[k].late})
        if starts:
            tail = self.model.add_col("E_tail", 0.0, INF, 0.0, False)
            exposed[tail] = 1.0
            for start in starts:
                terms = {tail: 1.0, **{col: -io[col] for k, col in self.Y.items() if groups[k].start >= start}}
                terms.update({col: 1.0 for node, col in waits.items() if node + 1 >= start})
                covered = sum(n.compute_ms for n in self.graph.nodes[start:]) / scale
                self._wait_rows.append((tail, self.model.num_rows))
                self.model.add_row(terms, -covered, INF, f"late state paging from stage {start} beyond the compute left")
        return exposed

    def _add_io_time(self, budget_ms: float, io_time_ms: tuple[Sequence[float], Sequence[float]]) -> None:
        """Paging beside compute still runs on one I/O thread: its total time fits the step's budget."""
        page_in_ms, page_out_ms = io_time_ms
        scale = max(budget_ms, 1e-12)
        terms = {col: page_in_ms[i] / scale for (t, i), col in self.MIn.items()}
        terms.update({col: page_out_ms[i] / scale for (t, i), col in self.MOut.items()})
        terms.update({col: self.state_costs.io_ms[k] / scale for k, col in self.Y.items()})
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
        beside = self._add_state_residency(budget)
        # read-ahead room: a page read in during stage t is read beside the own computations of stages
        # s..t, as many as its read takes (just t without read times)
        reads: list[dict[int, float]] = [{} for _ in range(self.T)]
        if self.read_ahead:
            for (t, i), col in self.MIn.items():
                for s in self.read_stages(t, i):
                    reads[s][col] = nbytes[i]
        for t in range(self.T):
            self._add_stage_memory(t, budget, inputs, nbytes, reads[t], beside[t])

    def _add_state_residency(self, budget: float) -> list[tuple[float, float]]:
        """``Z`` and its row; per stage, what it holds beside activations: (fixed bytes, most resident state),
        both over the budget."""
        if self.step is None:
            return [(0.0, 0.0)] * self.T
        step = self.step
        state = step.state_bytes / budget
        fixed = [(step.constant_bytes + step.stage_bytes[t]) / budget for t in range(self.T)]
        if self.Y:
            self.Z = self.model.add_col("Z", 0.0, state, 0.0, False)
            terms = {self.Z: 1.0, **{col: step.groups[k].bytes / budget for k, col in self.Y.items()}}
            self.model.add_row(terms, state, INF, "optimizer state in RAM or on flash")
            behind = [0.0] * self.T  # background updates of state on flash, held into the stages they run in
            for k, col in self.Y.items():
                group = step.groups[k]
                for stage in range(self.T):
                    held = group.held_at(stage) + group.overlay_bytes  # a table's overlay: in RAM at every stage
                    if held:
                        self._behind.setdefault(stage, {})[col] = held / budget
                        behind[stage] += held / budget
            return [(f, state + b) for f, b in zip(fixed, behind)]
        return [(f + state, 0.0) for f in fixed]

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
                          reads: dict[int, float], beside: tuple[float, float] = (0.0, 0.0)) -> None:
        """``U`` after each possible computation of stage ``t`` stays within the budget (reduction 3).

        Positions where even keeping every candidate value would fit are not
        checked, and what is freed after the stage's own node ``t`` (always the
        last computation of the stage) cannot lower any checked ``U``.  ``reads``
        (``MIn`` column -> bytes / budget) are the page-ins whose read-ahead room is
        kept beside node ``t``: this stage's and, with read times, later stages'
        whose reads run through it (:meth:`read_stages`; empty unless ``read_ahead``).  ``beside`` is what the
        whole step holds beside activations at this stage (fixed bytes, and resident optimizer state at most:
        ``Z``), both over the budget; it enters the stage's first memory row.
        """
        m = self.model
        workspace = [n.workspace_bytes / budget for n in self.graph.nodes]
        if self.step is not None:
            workspace = [w + u / budget for w, u in zip(workspace, self.step.update_bytes)]
        positions = [k for k in range(t + 1) if self.can_compute(t, k)]
        terms: dict[int, float] = {self.SRam[t, i]: nbytes[i] for i in range(t) if (t, i) in self.SRam}
        fixed, state = beside
        most = sum(terms.values()) + fixed + state  # U if every candidate were resident and nothing freed
        if self.Z is not None:
            terms[self.Z] = 1.0
            terms.update(self._behind.get(t, {}))
        if most + sum(nbytes[k] for k in positions) + max(workspace[k] for k in positions) + sum(reads.values()) \
                <= 1.0 + 1e-9:
            return  # this stage fits whatever is decided
        const, previous = fixed, None
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
        mats = Matrices(mats.R, mats.SRam, mats.SSd, mats.MIn, mats.MOut,
                        frozenset(k for k, col in self.Y.items() if x[col] > 0.5))
        np.fill_diagonal(mats.R, True)
        for grid, cols in ((mats.R, self.R), (mats.MIn, self.MIn), (mats.MOut, self.MOut)):
            for (t, i), col in cols.items():
                grid[t, i] = x[col] > 0.5
        for i in range(self.T):
            mats.SRam[:, i] = least_residency(self.graph, mats, i)
        mats.SSd[1:] = np.cumsum(mats.MOut, axis=0)[:-1] > 0
        return mats

    def plan_energy(self, mats: Matrices) -> float:
        """POET's objective for ``mats`` in joules, with its optimizer-state paging."""
        energy = plan_energy(self.graph, mats)
        if self.Y:
            energy += sum(self.state_costs.energy_j[k] for k in mats.state_on_flash)
        return energy

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
        for k, col in self.Y.items():
            x[col] = float(k in mats.state_on_flash)
        if self.Z is not None:
            paged = sum(self.step.groups[k].bytes for k in mats.state_on_flash if k in self.Y)
            x[self.Z] = max(self.step.state_bytes - paged, 0) / self.memory_budget
        m = self.model
        for u_col, row in self._memory_rows:  # in chain order, so each U's predecessor is known
            start, end = m.row_start[row], m.row_start[row + 1]
            others = sum(v * x[c] for c, v in zip(m.row_index[start:end], m.row_value[start:end]) if c != u_col)
            x[u_col] = max(others - m.row_upper[row], 0.0)
        for e_col, row in self._wait_rows:  # E >= lower - others: the least wait the rows allow
            start, end = m.row_start[row], m.row_start[row + 1]
            others = sum(v * x[c] for c, v in zip(m.row_index[start:end], m.row_value[start:end]) if c != e_col)
            x[e_col] = max(x[e_col], m.row_lower[row] - others, 0.0)
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

