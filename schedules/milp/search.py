"""The state of one solve across its phases: its clock, the best plan and bound so far, and why it ended."""

from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np

from schedules.milp.formulation import PoetFormulation
from schedules.milp.model import INF
from schedules.milp.outcome import (
    GAP_REACHED, INFEASIBLE, OPTIMAL, SOLVER_STOPPED, TIME_LIMIT, MilpOutcome, SolveProgress, SolverRun,
)

EXACT_GAP = 1e-9  # a proven gap this small is reported as "optimal", not "gap reached"


class Clock:
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


class Search:
    """The best plan and the best lower bound known so far, across the phases of a solve.

    Every cost is non-negative, so the store-all energy (the model's offset) is a
    lower bound before any LP is solved.  A phase that ends the search without
    proving the gap says why in :meth:`stop`.
    """

    def __init__(self, form: PoetFormulation, clock: Clock, progress: Callable[[SolveProgress], None] | None) -> None:
        self.form, self.clock, self.progress = form, clock, progress
        self.x: np.ndarray | None = None
        self.value = INF
        self.bound = form.model.offset
        self.infeasible = False
        self.proven = False  # a solver said "optimal" for the requested gap
        self.stopped: str | None = None  # why the search ended short of the gap, once a phase says so

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

    def absorb(self, run: SolverRun) -> None:
        """Take a solver run's answer into account."""
        if run.status == "infeasible" and self.x is None:
            self.infeasible = True
            return
        self.offer(run.x, "solver")
        self.raise_bound(run.bound)
        self.proven = self.proven or (run.status == "optimal" and self.x is not None)
        if run.stopped is not None:
            self.stop(run.stopped)

    def stop(self, reason: str) -> None:
        """Record why the search ends here (one of :data:`schedules.milp.outcome.STOP_REASONS`)."""
        self.stopped = reason

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
        scale = self.form.energy_scale
        if self.x is None:
            status = "infeasible" if self.infeasible else "no_solution"
            return MilpOutcome(status, None, None if self.infeasible else self.bound * scale, None,
                               self.clock.elapsed(), None, self.stop_reason(gap))
        mats = self.form.decode(self.x)
        status = "optimal" if self.proven or self.closed(gap) else "feasible"
        return MilpOutcome(status, self.form.plan_energy(mats), self.bound * scale, self.gap(),
                           self.clock.elapsed(), mats, self.stop_reason(gap))

    def stop_reason(self, gap: float) -> str:
        """Why the search ended: the gap proven, else what the last phase said, else the clock."""
        if self.x is None and self.infeasible:
            return INFEASIBLE
        if self.x is not None and (self.proven or self.closed(gap)):
            return OPTIMAL if self.closed(EXACT_GAP) else GAP_REACHED
        if self.stopped is not None:
            return self.stopped
        return TIME_LIMIT if self.clock.out_of_time() else SOLVER_STOPPED
