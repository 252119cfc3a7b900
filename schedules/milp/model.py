"""The MILP as plain arrays: columns with bounds, costs and integrality, rows in CSR form.

The formulation (:mod:`schedules.milp.formulation`) writes into one
:class:`SparseMilp`; each solver driver hands the same arrays to its solver
(HiGHS in one bulk call, PuLP one row at a time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

INF = math.inf


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
