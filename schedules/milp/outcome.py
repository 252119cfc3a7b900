"""What a solve reports: progress snapshots while it runs, the outcome when it ends, and why it ended."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from schedules.matrices import Matrices

# Why a solve ended: the values of ``MilpOutcome.stop_reason`` (and of ``PlanResult.stop_reason``).
OPTIMAL = "optimal"  # the plan is proven optimal: no gap left between it and the lower bound
GAP_REACHED = "gap reached"  # the plan is proven within the requested relative gap of the optimum
TIME_LIMIT = "time limit"  # the time limit ended the search (a solver's run, or no time left for the next phase)
NO_TIME_FOR_BRANCH_AND_BOUND = "no time for branch and bound"  # the root would not fit the time left
RELAX_AND_ROUND = "relax and round"  # relax_and_round: stopped after rounding the LP relaxation, as asked
SOLVER_STOPPED = "solver stopped early"  # the solver ended on a limit other than time, or without an answer
INFEASIBLE = "infeasible"  # no plan meets the budgets
STOP_REASONS = (OPTIMAL, GAP_REACHED, TIME_LIMIT, NO_TIME_FOR_BRANCH_AND_BOUND, RELAX_AND_ROUND, SOLVER_STOPPED,
                INFEASIBLE)


@dataclass(frozen=True)
class SolveProgress:
    """A snapshot of a running solve, in joules."""

    elapsed_s: float
    incumbent_j: float | None
    bound_j: float | None
    gap: float | None


@dataclass(frozen=True)
class MilpOutcome:
    """What a solve returned; ``matrices`` is the best schedule found, if any.

    ``stop_reason`` says why the search ended, one of :data:`STOP_REASONS`: a
    ``feasible`` status with a gap above the one asked for ends on ``time
    limit``, ``no time for branch and bound`` (a large model whose branch and
    bound root would not fit the time left after the LP relaxation),
    ``relax and round`` or ``solver stopped early``.
    """

    status: str  # "optimal" | "feasible" | "infeasible" | "no_solution"
    objective_j: float | None
    bound_j: float | None
    gap: float | None
    solve_seconds: float
    matrices: Matrices | None
    stop_reason: str = SOLVER_STOPPED


@dataclass
class SolverRun:
    """One solver run's answer in the model's (normalised) units.

    ``stopped`` is why a run without a proven answer ended (:data:`TIME_LIMIT`
    or :data:`SOLVER_STOPPED`); ``None`` when it finished.
    """

    status: str  # "optimal" | "feasible" | "infeasible" | "no_solution"
    x: np.ndarray | None
    bound: float | None
    stopped: str | None = None
