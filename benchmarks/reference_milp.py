"""The POET MILP exactly as published: the dense reference the planner is measured against.

Written from the equations of Patil et al. (ICML 2022), section 3, and the
public reference implementation's formulation (``poet/poet_solver.py`` in
ShishirPatil/poet); no code is shared with either.  Every matrix is created in
full over the ``T x T`` stage grid (``Free_E`` over ``T x E``), the structural
zeros are imposed by constraints rather than by leaving variables out, the
hazard indicators are binaries tied down by aggregated big-M constraints, and
memory is tracked by continuous ``U`` equalities.  Nothing here is tuned: it is
the yardstick for :mod:`schedules.milp`.

Variables (``t`` a stage, ``i`` a node, ``e = (i, k)`` an edge)::

    R[t,i], SRam[t,i], SSd[t,i], MIn[t,i], MOut[t,i]  in {0, 1}
    Free_E[t,e]                                       in {0, 1}
    U[t,k]                                            in [0, budget]

Constraints::

    R[t,t] = 1;  R, MIn, MOut = 0 above the diagonal;  SRam, SSd = 0 on and above it
    R[t,v]      <= R[t,u] + SRam[t,u]                        every edge (u, v)
    SRam[t+1,i] <= SRam[t,i] + R[t,i] + MIn[t,i]
    SSd[t+1,i]  <= SSd[t,i] + MOut[t,i]
    MIn <= SSd;  MOut <= SRam
    h[t,e] = 1 - R[t,k] + SRam[t+1,i] + sum_{j in succ(i), j > k} R[t,j]   (no SRam term at t = T-1)
    1 - Free_E[t,e] <= h[t,e] <= H_e (1 - Free_E[t,e])     H_e = the largest value h can take
    U[t,0]   = R[t,0] m_0 + sum_i SRam[t,i] m_i
    U[t,k+1] = U[t,k] + R[t,k+1] m_{k+1} - sum_{e = (i, k)} m_i Free_E[t,e]
    sum R[t,i] ms_i <= runtime budget

Objective: ``sum R[t,i] compute_j[i] + MIn[t,i] pagein_j[i] + MOut[t,i] pageout_j[i]``.

``paging=False`` fixes ``SSd``, ``MIn`` and ``MOut`` to zero; ``remat=False``
fixes ``R[t,i]`` to ``t == i``.  (The published code's remat switch adds the
Python value ``False`` for ``t != i`` by an operator-precedence slip, so it never
fixed anything off the diagonal; here it does what it says.)  With no memory
budget the ``Free_E`` and ``U`` parts are left out: they constrain nothing then.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pulp

from schedules.milp.highs import silence_highs_banner
from schedules.graph import TrainingGraph
from schedules.matrices import Matrices


@dataclass(frozen=True)
class ReferenceOutcome:
    """What the dense reference solve returned, in the same terms as ``MilpOutcome``."""

    status: str  # "optimal" | "feasible" | "infeasible" | "no_solution"
    objective_j: float | None
    bound_j: float | None
    gap: float | None
    build_seconds: float
    solve_seconds: float
    matrices: Matrices | None
    variables: int
    constraints: int


Grid = list[list[pulp.LpVariable]]


def new_variable(problem: pulp.LpProblem, name: str, low: float | None, up: float | None, cat: str) -> pulp.LpVariable:
    """A PuLP variable owned by ``problem`` (PuLP >= 3.3 deprecates free-standing ones)."""
    if hasattr(problem, "add_variable"):
        return problem.add_variable(name, low, up, cat)
    return pulp.LpVariable(name, low, up, cat)


def _grid(problem: pulp.LpProblem, name: str, rows: int, cols: int, up: float | None = None,
          cat: str = pulp.LpBinary) -> Grid:
    """A dense ``rows x cols`` matrix of PuLP variables."""
    return [[new_variable(problem, f"{name}_{r}_{c}", 0, up, cat) for c in range(cols)] for r in range(rows)]


class ReferenceMilp:
    """The dense POET MILP for one graph and budget, built with PuLP."""

    def __init__(self, graph: TrainingGraph, *, memory_budget: float | None, runtime_budget_ms: float | None,
                 paging: bool = True, remat: bool = True) -> None:
        started = time.perf_counter()
        self.graph = graph
        self.T = T = graph.size
        self.edges = list(graph.edges)
        self.problem = pulp.LpProblem("POET_reference", pulp.LpMinimize)
        p = self.problem
        self.R, self.SRam, self.SSd = _grid(p, "R", T, T), _grid(p, "SRam", T, T), _grid(p, "SSd", T, T)
        self.MIn, self.MOut = _grid(p, "MIn", T, T), _grid(p, "MOut", T, T)
        self._objective()
        self._structure()
        self._correctness()
        if memory_budget is not None:
            self._memory(float(memory_budget))
        if runtime_budget_ms is not None:
            self._runtime(float(runtime_budget_ms))
        if not paging:
            self._fix_all([self.SSd, self.MIn, self.MOut], lambda t, i: 0)
        if not remat:
            self._fix_all([self.R], lambda t, i: int(t == i))
        self.build_seconds = time.perf_counter() - started

    def _objective(self) -> None:
        nodes, T = self.graph.nodes, self.T
        self.problem += pulp.lpSum(
            self.R[t][i] * nodes[i].compute_j + self.MIn[t][i] * nodes[i].pagein_j
            + self.MOut[t][i] * nodes[i].pageout_j
            for t in range(T) for i in range(T)
        )

    def _structure(self) -> None:
        """Triangular zeros and the diagonal of R, as the published model states them."""
        T, p = self.T, self.problem
        p += pulp.lpSum(self.R[t][i] for t in range(T) for i in range(t + 1, T)) == 0
        p += pulp.lpSum(self.MIn[t][i] for t in range(T) for i in range(t + 1, T)) == 0
        p += pulp.lpSum(self.MOut[t][i] for t in range(T) for i in range(t + 1, T)) == 0
        p += pulp.lpSum(self.SRam[t][i] for t in range(T) for i in range(t, T)) == 0
        p += pulp.lpSum(self.SSd[t][i] for t in range(T) for i in range(t, T)) == 0
        p += pulp.lpSum(self.R[t][t] for t in range(T)) == T

    def _correctness(self) -> None:
        """Dependencies, persistence in RAM and on flash, paging only what is there."""
        T, p = self.T, self.problem
        for u, v in self.edges:
            for t in range(T):
                p += self.R[t][v] <= self.R[t][u] + self.SRam[t][u]
        for t in range(T - 1):
            for i in range(T):
                p += self.SRam[t + 1][i] <= self.SRam[t][i] + self.R[t][i] + self.MIn[t][i]
                p += self.SSd[t + 1][i] <= self.SSd[t][i] + self.MOut[t][i]
        for t in range(T):
            for i in range(T):
                p += self.MIn[t][i] <= self.SSd[t][i]
                p += self.MOut[t][i] <= self.SRam[t][i]

    def _memory(self, budget: float) -> None:
        """Big-M hazard indicators and the U recurrence, bounded by the budget."""
        T, p, m = self.T, self.problem, [n.bytes for n in self.graph.nodes]
        self.Free = _grid(p, "FreeE", T, len(self.edges))
        self.U = _grid(p, "U", T, T, up=budget, cat=pulp.LpContinuous)
        succ = self.graph.successors
        for t in range(T):
            for e, (i, k) in enumerate(self.edges):
                later = [j for j in succ[i] if j > k]
                hazards = 1 - self.R[t][k] + pulp.lpSum(self.R[t][j] for j in later)
                if t + 1 < T:
                    hazards += self.SRam[t + 1][i]
                most = len(later) + (2 if t + 1 < T else 1)
                p += 1 - self.Free[t][e] <= hazards
                p += most * (1 - self.Free[t][e]) >= hazards
        inputs = [[e for e, (_, k) in enumerate(self.edges) if k == node] for node in range(T)]
        for t in range(T):
            p += self.U[t][0] == self.R[t][0] * m[0] + pulp.lpSum(self.SRam[t][i] * m[i] for i in range(T))
            for k in range(T - 1):
                freed = pulp.lpSum(m[self.edges[e][0]] * self.Free[t][e] for e in inputs[k])
                p += self.U[t][k + 1] == self.U[t][k] + self.R[t][k + 1] * m[k + 1] - freed
        # Not in the paper: a node's workspace while it computes (0 on the reference graphs, so no rows).
        for k, node in enumerate(self.graph.nodes):
            if node.workspace_bytes:
                for t in range(T):
                    p += self.U[t][k] + self.R[t][k] * node.workspace_bytes <= budget

    def _runtime(self, budget_ms: float) -> None:
        ms = [n.compute_ms for n in self.graph.nodes]
        self.problem += pulp.lpSum(self.R[t][i] * ms[i] for t in range(self.T) for i in range(self.T)) <= budget_ms

    def _fix_all(self, grids: list[Grid], value) -> None:
        for grid in grids:
            for t in range(self.T):
                for i in range(self.T):
                    self.problem += grid[t][i] == value(t, i)

    def solve(self, *, time_limit: float | None = None, threads: int = 1, solver: str = "highs",
              gap: float | None = None, msg: bool = False) -> ReferenceOutcome:
        """Solve with HiGHS (PuLP's highspy interface) or CBC, one thread by default.

        ``gap`` is the relative MIP gap; ``None`` keeps the solver's default
        (1e-4 for HiGHS), as the published code does.
        """
        if solver == "highs":
            # HiGHS' default absolute gap (1e-6 J) would end the search early on millijoule graphs
            extra = {} if gap is None else {"gapAbs": 0.0}
            silence_highs_banner()  # the banner would land in the benchmark's table
            backend = pulp.HiGHS(msg=msg, threads=threads, timeLimit=time_limit, gapRel=gap, **extra)
        else:
            backend = pulp.PULP_CBC_CMD(msg=msg, threads=threads, timeLimit=time_limit, gapRel=gap)
        started = time.perf_counter()
        self.problem.solve(backend)
        seconds = time.perf_counter() - started
        status = _status(self.problem)
        objective = pulp.value(self.problem.objective) if status in ("optimal", "feasible") else None
        bound, gap = _bound_and_gap(self.problem, solver, objective)
        return ReferenceOutcome(
            status=status, objective_j=objective, bound_j=bound, gap=gap,
            build_seconds=self.build_seconds, solve_seconds=seconds,
            matrices=self._matrices() if objective is not None else None,
            variables=self.problem.numVariables(), constraints=self.problem.numConstraints(),
        )

    def _matrices(self) -> Matrices:
        def read(grid: Grid) -> np.ndarray:
            return np.array([[(v.varValue or 0.0) > 0.5 for v in row] for row in grid], dtype=bool)
        return Matrices(read(self.R), read(self.SRam), read(self.SSd), read(self.MIn), read(self.MOut))


def _status(problem: pulp.LpProblem) -> str:
    """Map PuLP's status pair onto optimal / feasible / infeasible / no_solution."""
    if problem.status == pulp.LpStatusInfeasible:
        return "infeasible"
    if problem.sol_status == pulp.LpSolutionOptimal:
        return "optimal"
    if problem.sol_status == pulp.LpSolutionIntegerFeasible:
        return "feasible"
    return "no_solution"


def _bound_and_gap(problem: pulp.LpProblem, solver: str, objective: float | None) -> tuple[float | None, float | None]:
    """The dual bound and relative gap HiGHS proved (CBC through PuLP does not report them)."""
    if solver != "highs" or objective is None:
        return None, None
    info = problem.solverModel.getInfo()
    # HiGHS' bound excludes the objective's constant; PuLP's objective includes it.
    bound = info.mip_dual_bound + (problem.objective.constant or 0.0)
    return bound, info.mip_gap


def solve_reference(graph: TrainingGraph, *, memory_budget: float | None, runtime_budget_ms: float | None,
                    paging: bool = True, remat: bool = True, time_limit: float | None = None,
                    threads: int = 1, solver: str = "highs", gap: float | None = None,
                    msg: bool = False) -> ReferenceOutcome:
    """Build the dense published formulation and solve it; see :class:`ReferenceMilp`."""
    model = ReferenceMilp(graph, memory_budget=memory_budget, runtime_budget_ms=runtime_budget_ms,
                          paging=paging, remat=remat)
    return model.solve(time_limit=time_limit, threads=threads, solver=solver, gap=gap, msg=msg)
