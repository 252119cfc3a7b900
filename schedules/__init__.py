"""POET Edge planner: training graphs, device profiles, the POET MILP, baselines, schedules.

Pure Python, numpy and PuLP/HiGHS: ``schedules`` never imports torch, and
nothing of ``agent`` or ``server``.  Training graphs come from a model through
:func:`engine.extract.extract` (device side) or from a graph file.

Modules:

- :mod:`~schedules.graph`: ``TrainingGraph`` and ``Node``: the graph format, structure helpers, the fingerprint,
  reading POET reference graphs
- :mod:`~schedules.device`: ``DeviceProfile``, built-in profiles, ``price_graph``, ``paging_time_ms``
- :mod:`~schedules.matrices`: the five decision matrices and ``to_instructions``
- :mod:`~schedules.milp`: the POET MILP: ``solve_poet_milp`` and the public names of its modules below
- :mod:`~schedules.baselines`: heuristic baselines: store-all, checkpoint-all, sqrt-n, capuchin, revolve
- :mod:`~schedules.binomial`: Griewank's binomial checkpointing (Revolve) on an abstract chain of steps
- :mod:`~schedules.plan`: ``plan()``, ``PlanOptions``, ``PlanResult``, ``METHODS``: one entry point for POET and every
  baseline, one time limit for the whole call
- :mod:`~schedules.simulate`: replays and checks a schedule; predicts peak, runtime, energy
- :mod:`~schedules.timeline`: the executor's I/O plan (``plan_io``) and step time with paging overlapped
  (``timeline_step_ms``)
- :mod:`~schedules.budgets`: smallest feasible memory budget, energy-vs-budget sweeps
- :mod:`~schedules.schedule`: ``Schedule``, ``SolverInfo``, the instruction token encoding
- :mod:`~schedules.signing`: Ed25519 keys, ``sign``, ``verify``, ``verify_document``
- :mod:`~schedules.errors`: the planner's branch of the error tree
- :mod:`~schedules.cli`: the planner's subcommands of ``poet-edge``: solve, plot, pareto, keys, verify, devices
- :mod:`~schedules.plot`: stage x node timeline and Pareto pictures (matplotlib, Agg)
- :mod:`~schedules.progress`: live solver progress: a bar on a terminal, a line at a regular interval
  elsewhere
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

