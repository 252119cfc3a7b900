"""The planner's branch of POET Edge's one error tree (its root is :class:`common.errors.PoetEdgeError`).

The whole tree, every package's branch with each class's exit code, is drawn once in
``docs/architecture.md`` ("Errors and exit codes"), generated from the classes and checked by
``tests/test_errors.py``.

A malformed file raises :class:`common.errors.FormatError` (re-exported here), the bottom package's, since
canonical JSON lives there.  An infeasible budget is *not* an error: :func:`schedules.plan` returns a
``PlanResult`` with ``feasible=False``.  Exit codes are
:class:`common.exit_codes.ExitCode`; a command turns any of these into its
code with :func:`common.exit_codes.exit_code_for`.
"""

from __future__ import annotations

from common.errors import FormatError, PoetEdgeError
from common.exit_codes import ExitCode

__all__ = ["FormatError", "InfeasibleBudgetError", "PlannerError", "ScheduleMismatchError", "ScheduleViolation",
           "SignatureError", "SolverError", "UnknownNameError", "UnsupportedVersionError"]


class PlannerError(PoetEdgeError):
    """Base class of every error raised by ``schedules``."""


class UnsupportedVersionError(FormatError):
    """A file declares a format version this release cannot read."""


class SignatureError(PlannerError):
    """A schedule's signature does not verify against the given public key."""

    exit_code = ExitCode.REJECTED


class ScheduleMismatchError(PlannerError):
    """A schedule was solved for a different training graph than the one given."""

    exit_code = ExitCode.REJECTED


class ScheduleViolation(PlannerError):
    """Replaying a schedule broke a rule (missing input, over budget, ...).

    Attributes
    ----------
    position:
        Index of the offending instruction, or ``None`` for a whole-schedule problem.
    """

    exit_code = ExitCode.REJECTED

    def __init__(self, message: str, position: int | None = None) -> None:
        super().__init__(message)
        self.position = position


class SolverError(PlannerError):
    """The MILP solver itself failed (missing binary, crash), not the budget."""

    exit_code = ExitCode.SOLVER_FAILED


class InfeasibleBudgetError(PlannerError):
    """No schedule fits the memory and runtime budgets asked for (the budget, not the solver, is the problem)."""

    exit_code = ExitCode.INFEASIBLE


class UnknownNameError(PlannerError):
    """A built-in name (device profile, baseline, method) does not exist."""
