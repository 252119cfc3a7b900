"""Exceptions raised by the planner.

The tree::

    PlannerError                     anything the planner refuses to do
    ├── FormatError                  a file is not a valid graph / profile / schedule
    │   └── UnsupportedVersionError  the file's ``version`` is not one we read
    ├── SignatureError               a schedule's signature is missing, wrong or tampered
    ├── ScheduleMismatchError        a schedule was planned for another graph
    ├── ScheduleViolation            a schedule breaks the rules when replayed
    ├── SolverError                  the MILP solver failed (not: the budget is infeasible)
    └── UnknownNameError             no such built-in device profile / baseline

An infeasible budget is *not* an error: :func:`schedules.plan` returns a
``PlanResult`` with ``feasible=False``.
"""

from __future__ import annotations


class PlannerError(Exception):
    """Base class of every error raised by ``schedules``."""


class FormatError(PlannerError):
    """A graph, device profile or schedule file is malformed."""


class UnsupportedVersionError(FormatError):
    """A file declares a format version this release cannot read."""


class SignatureError(PlannerError):
    """A schedule's signature does not verify against the given public key."""


class ScheduleMismatchError(PlannerError):
    """A schedule was solved for a different training graph than the one given."""


class ScheduleViolation(PlannerError):
    """Replaying a schedule broke a rule (missing input, over budget, ...).

    Attributes
    ----------
    position:
        Index of the offending instruction, or ``None`` for a whole-schedule problem.
    """

    def __init__(self, message: str, position: int | None = None) -> None:
        super().__init__(message)
        self.position = position


class SolverError(PlannerError):
    """The MILP solver itself failed (missing binary, crash), not the budget."""


class UnknownNameError(PlannerError):
    """A built-in name (device profile, baseline, method) does not exist."""
