"""CBC through PuLP: the sparse model as an ``LpProblem``, solved as one MIP.

CBC runs the model in one go: no phases, no progress reports, no proven
bound.  :func:`build_pulp_problem` also serves inspection and export of the
model in PuLP's formats.
"""

from __future__ import annotations

import warnings

import numpy as np

from schedules.errors import SolverError
from schedules.milp.model import INF, SparseMilp
from schedules.milp.outcome import SOLVER_STOPPED, TIME_LIMIT, SolverRun
from schedules.milp.search import Clock


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


def solve_cbc(model: SparseMilp, clock: Clock, gap: float, threads: int, start: np.ndarray | None) -> SolverRun:
    """Solve with PuLP's bundled CBC (no progress reports, no proven bound).

    CBC gets what is left on ``clock`` once the PuLP problem is built.  It is
    given no limit but time, so a run that ends without proving the gap under
    a time limit ended on it.
    """
    import pulp

    problem, variables = build_pulp_problem(model)
    time_limit = clock.remaining()
    if time_limit is not None:
        time_limit = max(time_limit, 0.01)
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
        return SolverRun("infeasible", None, None)
    stopped = TIME_LIMIT if time_limit is not None else SOLVER_STOPPED
    if problem.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return SolverRun("no_solution", None, None, stopped)
    x = np.array([v.varValue or 0.0 for v in variables])
    if problem.sol_status == pulp.LpSolutionOptimal:
        return SolverRun("optimal", x, None)
    return SolverRun("feasible", x, None, stopped)
