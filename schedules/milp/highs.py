"""HiGHS through ``highspy``: the phases of one solve, and the driver of each HiGHS run.

Phases
------
Every cost is non-negative, so the store-all energy is a lower bound, and
store-all itself is the optimum whenever it fits (checked first: no solve).
Otherwise: (a) the warm start, if any, is the first incumbent; (b) the LP
relaxation gives a bound (dual simplex; interior point without crossover for
models over :data:`LARGE_MODEL_NONZEROS` nonzeros, 3.5x faster on bert); (c)
the integer columns the LP left integral are fixed and the small MIP that
remains is solved (the POET relaxation is tight: on vgg16_cifar 34 of 4878
integers are fractional and this gives a plan within 4e-6 of the optimum in
0.2 s); (d) HiGHS' branch and bound starts from the best plan so far.  Where
its root would not fit in the time left (less than two LP solves' worth, four
on large models, whose simplex root is slower than the interior point), (d)
is skipped (stop reason ``no time for branch and bound``); ``relax_and_round``
stops after (c).  Where nothing follows (c), it may use all the time left;
otherwise a few LP solves' worth.  Progress is reported after each phase and
from HiGHS' MIP callbacks.

Time limit
----------
Each run's limit is what is left of the solve's when the run starts, so
model hand-over and the phases before it count against it.  Two parts of a
HiGHS MIP run do not look at the clock often enough for a hard limit:
presolve's probing (on a tight runtime budget it ran 6 s on a 1,700-column
model given 5 s, a model solved to its gap in 0.4 s without it, and 15 s on
vgg16 given 3 s), left out of every MIP run under a time limit; and the
root's cut rounds, each about an LP solve, so branch and bound is given one
LP solve's worth less than is left (at most 4% of the limit).

Measured by ``python -m benchmarks.solver`` (one thread; ours at gap 1e-6 with
the best baseline as warm start, within 60 s, the dense reference at HiGHS'
default 1e-4, 600 s): vgg16_cifar 1.5 MB / 1.5 optimal in 1.3 s (reference
20.7 s, same optimum within 5e-8); resnet18_cifar 3 MB / 7.6 optimal in 0.3 s
(reference 85 s); resnet18_cifar 1.5 MB / 1.5 7.89687 J, gap 3.7e-4 (reference
7.92585 J, gap 4.2e-3, at 600 s); at half the forward activations and 1.5:
vgg16 gap 1.1e-5, resnet18 1.3e-4, bert 2.3e-4 (LP bound, no time for branch
and bound) and resnet50 9.9e-4 (its LP takes 240 s: the bound is store-all's).
With presolve's probing, vgg16 reached 3.3e-6 in 60 s, but probing can
outlast any limit (see "Time limit").  Tried without a measurable gain:
``R + SRam <= 1``, ``MIn + SRam <= 1``, "recompute only what is read" for
input nodes, binary ``SRam``, HiGHS heuristic-effort and symmetry options.

Why highspy directly
--------------------
The sparse model goes to ``highspy`` in one ``passModel`` call.  Driving
highspy directly rather than through ``pulp.HiGHS`` costs one code path but
buys what the wrapper cannot do: build in milliseconds instead of one Python
call per column and row, report progress from HiGHS' MIP callbacks,
warm-start with ``setSolution``, run the LP-and-round phases on the same
arrays and read the proven bound and gap.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from typing import Callable

import numpy as np

from schedules.errors import SolverError
from schedules.milp.model import INF, SparseMilp
from schedules.milp.outcome import (
    NO_TIME_FOR_BRANCH_AND_BOUND, RELAX_AND_ROUND, SOLVER_STOPPED, TIME_LIMIT, SolverRun,
)
from schedules.milp.search import Clock, Search

LARGE_MODEL_NONZEROS = 150_000  # beyond this the LP goes to the interior-point solver (bert_a72: 3.5x faster)
PROBING_RULE = 1 << 15  # HiGHS' presolve_rule_off bit of probing (HiGHS 1.16 lists its rules at log_dev_level 1)


def search_with_highs(search: Search, gap: float, threads: int, relax_and_round: bool) -> None:
    """LP relaxation, a rounding heuristic on it, then branch and bound from the best plan known.

    The LP gives a bound and, since the POET relaxation is tight, a plan close
    to optimal once its few fractional decisions are settled by a small MIP
    (the rest fixed).  Given that incumbent, HiGHS usually proves the gap at
    its root instead of spending its first seconds on cuts and heuristics.
    On large models, where HiGHS' root LP alone would not fit in the time
    left, the branch and bound is skipped and the LP bound is the answer's.
    Where the search ends short of the gap, ``search`` records why.
    """
    model, clock = search.form.model, search.clock
    if search.closed(gap):
        search.proven = True
        return
    large = len(model.row_index) > LARGE_MODEL_NONZEROS
    search.report()  # the LP may take a while: say where things stand before it
    lp_started = time.perf_counter()
    lp = solve_highs(model, clock, gap, threads, None, None, relaxation=True, interior=large)
    lp_seconds = time.perf_counter() - lp_started
    if lp.status == "infeasible":
        search.infeasible = search.x is None
        return
    search.raise_bound(lp.bound)
    if lp.x is None or search.closed(gap) or clock.out_of_time():
        search.stop(TIME_LIMIT if clock.out_of_time() else lp.stopped or SOLVER_STOPPED)
        return
    last = relax_and_round or _no_time_to_branch(clock, lp_seconds, large)  # nothing follows the rounding
    rounded = _round_relaxation(model, lp.x, clock, _rounding_time(clock, lp_seconds, last), gap, threads,
                                tolerance=1e-3 if large else 1e-6, cutoff=search.value)
    search.offer(rounded, "rounding")
    if search.closed(gap) or relax_and_round or clock.out_of_time() or _no_time_to_branch(clock, lp_seconds, large):
        search.stop(TIME_LIMIT if clock.out_of_time() else
                    RELAX_AND_ROUND if relax_and_round else NO_TIME_FOR_BRANCH_AND_BOUND)
        return
    search.absorb(solve_highs(model, clock, gap, threads, search.x, _progress_callback(search),
                              reserve=_cut_round_reserve(clock, lp_seconds)))


def _no_time_to_branch(clock: Clock, lp_seconds: float, large: bool) -> bool:
    """True when branch and bound would not fit what is left of the time limit.

    Its root solves the LP again and then runs cut rounds of about an LP
    solve each, so it needs two LP solves' worth; on large models four, since
    the simplex root LP is slower than the interior point that timed the
    relaxation.
    """
    left = clock.remaining()
    return left is not None and left < (4.0 if large else 2.0) * lp_seconds


def _cut_round_reserve(clock: Clock, lp_seconds: float) -> float:
    """Seconds branch and bound leaves unused: HiGHS looks at its clock between the cut rounds of its root, so
    it may overrun its limit by one (about an LP solve); never more than 4% of the limit, of which 5% is allowed."""
    return 0.0 if clock.limit is None else min(lp_seconds, 0.04 * clock.limit)


def _rounding_time(clock: Clock, lp_seconds: float, last: bool) -> float:
    """Time for the rounding MIP: a few LP solves' worth, never most of what is left unless nothing follows it."""
    budget = 2.0 + 2.0 * lp_seconds
    left = clock.remaining()
    if left is None:
        return budget
    if last:
        return max(left - _cut_round_reserve(clock, lp_seconds), 0.01)
    return max(min(budget, 0.5 * left), 0.01)


def _round_relaxation(model: SparseMilp, x: np.ndarray, clock: Clock, time_limit: float, gap: float,
                      threads: int, tolerance: float, cutoff: float) -> np.ndarray | None:
    """Fix every integer column the LP left (nearly) integral and solve the small MIP that remains."""
    integer = np.asarray(model.col_integer)
    settled = integer & (np.abs(x - np.round(x)) <= tolerance)
    lower = np.asarray(model.col_lower, dtype=float)
    upper = np.asarray(model.col_upper, dtype=float)
    lower[settled] = upper[settled] = np.round(x[settled])
    run = solve_highs(model, clock, gap, threads, None, None, bounds=(lower, upper), cutoff=cutoff,
                      time_cap=time_limit)
    return run.x


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
def silence_highs_banner() -> None:
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


def _new_highs(gap: float, threads: int):
    """A silent HiGHS instance with the gap and threads set (the time limit is set right before it runs)."""
    import highspy

    silence_highs_banner()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", int(threads))
    h.setOptionValue("mip_rel_gap", float(gap))
    # objectives are in store-all units (about 1): HiGHS' default absolute gap (1e-6) would stop early
    h.setOptionValue("mip_abs_gap", 0.0)
    return h


def _time_limit(clock: Clock, cap: float | None, reserve: float = 0.0) -> float | None:
    """Seconds a run may take now: what is left of the solve less ``reserve``, at most ``cap``."""
    left = clock.remaining()
    limits = [t for t in (None if left is None else left - reserve, cap) if t is not None]
    return min(limits) if limits else None


def solve_highs(model: SparseMilp, clock: Clock, gap: float, threads: int, start: np.ndarray | None,
                callback: Callable | None, relaxation: bool = False,
                bounds: tuple[np.ndarray, np.ndarray] | None = None, interior: bool = False,
                cutoff: float = INF, time_cap: float | None = None, reserve: float = 0.0) -> SolverRun:
    """One HiGHS run on ``model`` (or its LP relaxation, or with tightened bounds).

    The run may take what is left on ``clock`` when it starts, less
    ``reserve`` seconds, at most ``time_cap`` seconds.  ``interior`` solves the LP by interior point
    without crossover (no vertex, but a bound in a fraction of the simplex
    time); ``cutoff`` prunes every plan not better than a known one.
    """
    try:
        h = _new_highs(gap, threads)
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
        limit = _time_limit(clock, time_cap, reserve)
        if limit is not None:  # measured now: building and loading the model came out of the same time
            h.setOptionValue("time_limit", max(float(limit), 0.01))
            if not relaxation:  # probing never looks at the clock (module docstring, "Time limit")
                h.setOptionValue("presolve_rule_off", PROBING_RULE)
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


def _highs_result(h, relaxation: bool, interior: bool = False) -> SolverRun:
    """Status, solution, proven bound and (for a run that did not finish) the reason of a HiGHS run."""
    import highspy

    S = highspy.HighsModelStatus
    status, info = h.getModelStatus(), h.getInfo()
    if status in (S.kInfeasible, S.kUnboundedOrInfeasible):
        return SolverRun("infeasible", None, None)
    if status in (S.kLoadError, S.kModelError, S.kPresolveError, S.kSolveError, S.kPostsolveError):
        raise SolverError(f"HiGHS stopped with {h.modelStatusToString(status)}; retry with solver='cbc'")
    stopped = None if status == S.kOptimal else TIME_LIMIT if status == S.kTimeLimit else SOLVER_STOPPED
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    x = np.array(h.getSolution().col_value) if has_solution else None
    if relaxation:
        if status != S.kOptimal:
            return SolverRun("no_solution", None, None, stopped)
        # an interior point stops within a small duality gap: step below it so the bound stays valid
        slack = max(abs(info.primal_dual_objective_error), 1e-9) if interior else 0.0
        value = info.objective_function_value
        return SolverRun("optimal", x, value - slack * max(abs(value), 1.0))
    if status == S.kOptimal:
        return SolverRun("optimal", x, info.mip_dual_bound)
    return SolverRun("feasible" if has_solution else "no_solution", x, info.mip_dual_bound, stopped)


def _progress_callback(search: Search, every_s: float = 0.25) -> Callable | None:
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
