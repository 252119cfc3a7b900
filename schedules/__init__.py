"""POET Edge planner: training graphs, device profiles, the POET MILP, baselines, schedules.

Pure Python and PuLP: importing ``schedules`` never imports torch.  Only
:func:`extract` (graph extraction from an ``nn.Module``) and the profiler need
torch, and they import it when called.
"""

from __future__ import annotations

from typing import Any

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
from schedules.plan import METHODS, PlanResult, plan
from schedules.schedule import Schedule
from schedules.simulate import SimulationReport, simulate

__all__ = [
    "DeviceProfile", "FormatError", "METHODS", "Node", "PlanResult", "PlannerError", "Schedule",
    "ScheduleMismatchError", "ScheduleViolation", "SignatureError", "SimulationReport", "SolverError",
    "TrainingGraph", "UnknownNameError", "UnsupportedVersionError", "extract", "plan", "simulate",
]


def extract(*args: Any, **kwargs: Any):
    """Extract a TrainingGraph from a torch model; see :func:`schedules.extract.extract` (imports torch)."""
    import importlib
    import sys

    module = importlib.import_module("schedules.extract")
    # Importing the submodule rebinds the package attribute ``extract`` to the
    # module; put this function back so ``schedules.extract(...)`` keeps working.
    setattr(sys.modules[__name__], "extract", extract)
    return module.extract(*args, **kwargs)
