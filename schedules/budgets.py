"""Searches over the memory budget: the smallest feasible budget, and energy-vs-budget sweeps.

Both take a *probe*: a callable ``probe(budget_bytes, time_limit_s) ->
PlanResult`` (usually :func:`schedules.plan` with everything but the memory
budget fixed), so they work for POET and every baseline alike.

:func:`smallest_feasible_budget` bisects between two anchors that need no
solve to find:

* :func:`memory_lower_bound`: no schedule runs below the largest
  ``bytes(node) + bytes(its inputs)``, since computing a node needs its inputs
  and its output in RAM together;
* :func:`store_all_peak`: plain backpropagation's peak, feasible for POET
  whenever the runtime budget allows one plain step.

Given a :class:`~schedules.step_memory.TrainingSpec` (``training=``) both are
for the step's whole memory: the lower bound with all optimizer state on
flash and the smallest update chunks, the store-all peak with all of it in RAM.

With paging enabled and paging time not counted, POET is usually feasible at
or near the lower bound, so the search ends after two or three probes.  A probe
that stops at its time limit without an answer is taken as infeasible, which
keeps the answer safe (a budget where a schedule *was* found) but makes it
approximate; the result says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Sequence

from schedules.baselines import BaselineProblem, store_all
from schedules.floors import memory_lower_bound
from schedules.graph import TrainingGraph
from schedules.matrices import to_instructions
from schedules.plan import PlanResult
from schedules.simulate import simulate
from schedules.step_memory import MAX_CHUNK_BYTES, StepMemory, TrainingSpec

Probe = Callable[[int, float | None], PlanResult]


@dataclass(frozen=True)
class BudgetSearch:
    """The answer of :func:`smallest_feasible_budget`.

    Attributes
    ----------
    budget:
        The smallest budget (bytes) at which a schedule was found; ``None``
        when none was found even at ``upper``.
    infeasible_below:
        The largest budget known (or assumed, see ``exact``) to have no schedule, plus one.
    exact:
        True when every probe gave a definite answer and the bracket closed to
        the requested tolerance.
    probes, seconds:
        Solves made and time spent.
    note:
        One line for people: why the figure is approximate, or why there is none.
    """

    budget: int | None
    infeasible_below: int
    exact: bool
    probes: int
    seconds: float
    note: str = ""


BUDGET_CLASS_BITS = 7  # significant bits a budget class keeps: classes at most 1/64 (1.6 %) apart


def budget_class(memory_budget: int) -> int:
    """The largest budget class not above ``memory_budget``: its highest :data:`BUDGET_CLASS_BITS` bits.

    A fleet server plans for the class, not the byte: devices whose budgets differ by a few bytes (or a few
    kilobytes) share one solve, and a schedule planned for the class fits every budget in it, at most 1.6 %
    tighter than asked.  Budgets below ``2 ** BUDGET_CLASS_BITS`` bytes are their own class.
    """
    if memory_budget <= 0:
        raise ValueError(f"a memory budget is a positive number of bytes, got {memory_budget}")
    drop = max(memory_budget.bit_length() - BUDGET_CLASS_BITS, 0)
    return memory_budget >> drop << drop


def floor_text(graph: TrainingGraph) -> str:
    """One line for people: the smallest activation budget the graph's cut allows, over plain
    backpropagation's peak and over the operator-level bound extraction measured (where it did)."""
    floor, peak = memory_lower_bound(graph), store_all_peak(graph)
    text = f"{floor / 1e6:,.2f} MB, {floor / peak:.0%} of store-all's {peak / 1e6:,.2f} MB"
    bound = graph.operator_bound_bytes
    if bound:
        text += f"; operator-level bound {bound / 1e6:,.2f} MB (floor {floor / bound:.2f}x)"
    return text


def store_all_peak(graph: TrainingGraph, training: TrainingSpec | None = None) -> int:
    """Peak memory of plain backpropagation (store-all, workspaces included), by simulation; with ``training``
    the whole step's, all optimizer state in RAM and the largest update chunks."""
    instructions = to_instructions(graph, store_all(BaselineProblem(graph, None, None)))
    layout = None
    if training is not None:
        spec = training if training.chunk_bytes else replace(training, chunk_bytes=MAX_CHUNK_BYTES)
        layout = StepMemory.build(graph, spec).layout(())
    return simulate(graph, instructions, step=layout).peak_memory_bytes


def smallest_feasible_budget(
    graph: TrainingGraph,
    probe: Probe,
    *,
    time_budget_s: float = 60.0,
    probe_time_limit_s: float = 15.0,
    rel_tolerance: float = 0.005,
    upper: int | None = None,
    training: TrainingSpec | None = None,
) -> BudgetSearch:
    """Bisect the memory budget for the smallest one at which ``probe`` finds a schedule.

    Parameters
    ----------
    probe:
        ``probe(budget, time_limit) -> PlanResult`` with every other setting fixed.
    time_budget_s:
        Wall-clock cap on the whole search; when it runs out the best budget
        found so far is returned with ``exact=False``.
    probe_time_limit_s:
        Time limit of each solve (never more than what is left of the cap).
    rel_tolerance:
        Stop when the bracket is narrower than this fraction of the answer.
    upper:
        Where to start from above; defaults to :func:`store_all_peak`.
    training:
        The probe plans whole steps for this spec: the anchors are the whole step's.
    """
    search = _Bisection(probe, time.perf_counter() + time_budget_s, probe_time_limit_s)
    low = memory_lower_bound(graph, training)
    high = max(upper if upper is not None else store_all_peak(graph, training), low)
    found = search.feasible_peak(high)
    if found is None:
        return search.result(None, high + 1, "no schedule even at the store-all peak "
                             f"of {high:,} bytes: the runtime budget is too tight for this method")
    found = min(found, high)
    if search.feasible_peak(low) is not None:
        return search.result(low, low, "")
    infeasible = low  # a budget with no schedule (or none found)
    while found - infeasible > max(1, rel_tolerance * found) and not search.out_of_time():
        middle = (infeasible + found) // 2
        peak = search.feasible_peak(middle)
        if peak is None:
            infeasible = middle
        else:
            found = min(peak, middle)
    note = "" if search.definite and found - infeasible <= max(1, rel_tolerance * found) else (
        "approximate: " + ("some probes hit their time limit" if not search.definite else "the search time ran out"))
    return search.result(found, infeasible + 1, note)


class _Bisection:
    """Probe bookkeeping: time left, probe count, whether every answer was definite."""

    def __init__(self, probe: Probe, deadline: float, probe_limit: float) -> None:
        self.probe, self.deadline, self.probe_limit = probe, deadline, probe_limit
        self.started = time.perf_counter()
        self.probes = 0
        self.definite = True

    def out_of_time(self) -> bool:
        return time.perf_counter() >= self.deadline

    def feasible_peak(self, budget: int) -> int | None:
        """The peak of a schedule found within ``budget``, or ``None``."""
        left = max(1.0, self.deadline - time.perf_counter())
        result = self.probe(budget, min(self.probe_limit, left))
        self.probes += 1
        if result.feasible and result.schedule is not None:
            return result.schedule.predicted_peak_bytes
        if result.status != "infeasible":
            self.definite = False  # stopped without an answer: not a proof of infeasibility
        return None

    def result(self, budget: int | None, infeasible_below: int, note: str) -> BudgetSearch:
        return BudgetSearch(budget, infeasible_below, exact=not note, probes=self.probes,
                            seconds=time.perf_counter() - self.started, note=note)


@dataclass(frozen=True)
class SweepPoint:
    """One (method, budget) cell of an energy-vs-budget sweep; ``energy_j`` is ``None`` when infeasible."""

    method: str
    budget: int
    feasible: bool
    energy_j: float | None
    status: str
    seconds: float


def budget_points(low: int, high: int, count: int) -> list[int]:
    """``count`` budgets evenly spaced from ``low`` to ``high`` inclusive, without repeats."""
    if count <= 1 or high <= low:
        return [high]
    step = (high - low) / (count - 1)
    return sorted({round(low + k * step) for k in range(count)})


def sweep(
    budgets: Sequence[int],
    methods: Iterable[str],
    probe_for: Callable[[str], Probe],
    *,
    time_limit_s: float | None = None,
    on_point: Callable[[SweepPoint], None] | None = None,
) -> list[SweepPoint]:
    """Plan every method at every budget; energy is the simulator's prediction for the schedule.

    ``probe_for(method)`` returns that method's probe.  ``on_point`` is called
    after each solve (to print a table row as it fills).
    """
    probes = {method: probe_for(method) for method in methods}
    points: list[SweepPoint] = []
    for budget in budgets:  # budget-major, so a table can print one row per budget as it fills
        for method, probe in probes.items():
            result = probe(budget, time_limit_s)
            energy = result.schedule.predicted_energy_j if result.feasible and result.schedule else None
            point = SweepPoint(method, budget, energy is not None, energy, result.status, result.solve_seconds)
            points.append(point)
            if on_point is not None:
                on_point(point)
    return points
