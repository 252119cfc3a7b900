"""The POET MILP: energy-optimal rematerialization and paging under memory and runtime budgets.

One module per concern:

==================  =====================================================================
``solve``           :func:`solve_poet_milp`, the entry point: checks, model, first incumbents, solver
``formulation``     :class:`PoetFormulation`: the published model, our reductions, encode and decode
``model``           :class:`SparseMilp`: columns and CSR rows as plain arrays
``plans``           plans as matrices: store-all, a plan's energy, a warm start in canonical form
``search``          the best plan and bound across a solve's phases, its clock, why it ended
``highs``           the HiGHS phases (LP relaxation, rounding, branch and bound) and runs
``cbc``             CBC through PuLP, and the model as a PuLP problem
``outcome``         what a solve reports: progress, outcome, stop reasons
==================  =====================================================================

The model is built once as a sparse matrix (:class:`SparseMilp`).  The same
matrix becomes a PuLP ``LpProblem`` (:func:`build_pulp_problem`, used for CBC
and for inspection or export) or is handed to ``highspy`` in one ``passModel``
call (:mod:`schedules.milp.highs` says why highspy is driven directly).
"""

from __future__ import annotations

from schedules.milp.cbc import build_pulp_problem
from schedules.milp.formulation import PoetFormulation
from schedules.milp.highs import LARGE_MODEL_NONZEROS
from schedules.milp.model import SparseMilp
from schedules.milp.outcome import STOP_REASONS, MilpOutcome, SolveProgress
from schedules.milp.plans import canonical_plan, plan_energy, store_all_plan
from schedules.milp.solve import solve_poet_milp

__all__ = [
    "LARGE_MODEL_NONZEROS", "MilpOutcome", "PoetFormulation", "STOP_REASONS", "SolveProgress", "SparseMilp",
    "build_pulp_problem", "canonical_plan", "plan_energy", "solve_poet_milp", "store_all_plan",
]
