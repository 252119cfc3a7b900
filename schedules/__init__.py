"""POET Edge planner: training graphs, device profiles, the POET MILP, baselines, schedules.

Pure Python, numpy and PuLP/HiGHS: ``schedules`` never imports torch, and
nothing of ``agent`` or ``server``.  Training graphs come from a model through
:func:`agent.extract.extract` (device side) or from a graph file.
"""

from __future__ import annotations

from schedules.device import DeviceProfile
from schedules.errors import (
    FormatError,
    PlannerError,
    ScheduleMismatchError,
    ScheduleViolation,
    SignatureError,
    SolverError,
    UnknownNameError,
    UnsupportedVersionError,
)
from schedules.graph import Node, TrainingGraph
from schedules.plan import METHODS, PlanOptions, PlanResult, plan
from schedules.schedule import Schedule
from schedules.simulate import SimulationReport, simulate

__all__ = [
    "DeviceProfile", "FormatError", "METHODS", "Node", "PlanOptions", "PlanResult", "PlannerError", "Schedule",
    "ScheduleMismatchError", "ScheduleViolation", "SignatureError", "SimulationReport", "SolverError",
    "TrainingGraph", "UnknownNameError", "UnsupportedVersionError", "plan", "simulate",
]

