"""``solve_poet_milp``: one solve, from a graph and budgets to the best plan found and why the search ended.

The model is built once (:class:`~schedules.milp.formulation.PoetFormulation`);
store-all and the warm start are offered as the first incumbents; HiGHS
(:mod:`schedules.milp.highs`) or CBC (:mod:`schedules.milp.cbc`) then searches
within what is left of the time limit.
"""

from __future__ import annotations

import warnings
from typing import Callable, Sequence

import numpy as np

from schedules.errors import SolverError
from schedules.graph import TrainingGraph
from schedules.matrices import Matrices
from schedules.milp.cbc import solve_cbc
from schedules.milp.formulation import PoetFormulation
from schedules.milp.highs import search_with_highs
from schedules.milp.outcome import INFEASIBLE, MilpOutcome, SolveProgress
from schedules.milp.plans import canonical_plan, store_all_plan
from schedules.milp.search import Clock, Search
from schedules.step_memory import StateCosts, StepMemory


def solve_poet_milp(graph: TrainingGraph, *, memory_budget: float | None, runtime_budget_ms: float | None,
                    paging: bool = True, remat: bool = True, solver: str = "highs",
                    time_limit: float | None = None, gap: float = 1e-4, threads: int = 1,
                    warm_start: Matrices | None = None, relax_and_round: bool = False,
                    paging_time_ms: tuple[Sequence[float], Sequence[float]] | None = None,
                    io_time_ms: tuple[Sequence[float], Sequence[float]] | None = None,
                    read_ahead: bool = False, read_ahead_ms: Sequence[float] | None = None,
                    progress: Callable[[SolveProgress], None] | None = None,
                    step: StepMemory | None = None, state_costs: StateCosts | None = None) -> MilpOutcome:
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
    step, state_costs:
        Plan the step's whole memory (:mod:`schedules.step_memory`): ``graph`` is then ``step.graph``,
        ``memory_budget`` bounds activations, gradients, optimizer state and the runtime together, and
        the plan decides which optimizer-state groups live on flash (priced by ``state_costs``).

    Returns
    -------
    MilpOutcome
        The best plan found, its bound and gap, and ``stop_reason``: why the
        search ended (:data:`schedules.milp.outcome.STOP_REASONS`).
    """
    clock = Clock(time_limit)
    _check_arguments(graph, solver, gap, threads, time_limit,
                     {"paging_time_ms": paging_time_ms, "io_time_ms": io_time_ms}, read_ahead, read_ahead_ms)
    form = PoetFormulation(graph, memory_budget=memory_budget, runtime_budget_ms=runtime_budget_ms,
                           paging=paging, remat=remat, paging_time_ms=paging_time_ms, io_time_ms=io_time_ms,
                           read_ahead=read_ahead, read_ahead_ms=read_ahead_ms, step=step, state_costs=state_costs)
    if form.model.contradiction is not None:
        return MilpOutcome("infeasible", None, None, None, clock.elapsed(), None, INFEASIBLE)
    start = _warm_start_vector(form, warm_start)
    search = Search(form, clock, progress)
    # store-all costs exactly the lower bound: when it fits, it is optimal and nothing need be solved
    search.offer(form.encode(store_all_plan(graph)), "store-all")
    if start is not None:
        search.offer(start, "warm start")
    if _backend(solver) == "cbc":
        search.absorb(solve_cbc(form.model, clock, gap, threads, search.x))
    else:
        search_with_highs(search, gap, threads, relax_and_round)
    return search.outcome(gap)


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

