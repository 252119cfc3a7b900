"""What runs inside a planner process: one :func:`schedules.plan` call per job, JSON in and JSON out.

The server's API process never plans: :mod:`server.solves` hands each job to
a worker process (``spawn`` start method: a fresh interpreter that imports
only this module and the planner).  Job and result cross the process boundary
as JSON bytes, never as pickled objects of ours.

Job::

    {"graph": {...}, "device": {...}, "memory_budget": 1500000, "runtime_budget": 1.5, "time_limit": 60,
     "training": {...} | null}   (a whole step's training: schedules.step_memory.TrainingSpec)

Result::

    {"outcome": "done" | "failed" | "timed_out", "schedule": "<schedule JSON>" | null, "error": str | null,
     "status": planner status, "stop_reason": why the search ended, "plan_seconds": float}

The schedule comes back unsigned: the server signs it (its key never enters a
worker).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from typing import Any

from common.canonical import canonical_json
from schedules.device import DeviceProfile
from schedules.errors import FormatError, PlannerError
from schedules.graph import TrainingGraph
from schedules.plan import plan
from schedules.step_memory import TrainingSpec

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def initialise(server_pid: int) -> None:
    """Worker start: leave Ctrl-C to the server, which stops its workers itself; die with the server.

    A server killed outright (SIGKILL, the OOM killer) cannot stop its workers, so on Linux each asks the
    kernel for SIGKILL when its parent dies, instead of lingering as an orphan holding a core.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with(server_pid)


def _die_with(server_pid: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != server_pid:  # the server died before the request took effect
        os._exit(1)


def ready() -> int:
    """A no-op the server runs first in each new worker: the worker is up (imports done); its process id."""
    return os.getpid()


def solve(job_json: bytes) -> bytes:
    """Plan one job (see the module docstring); planner errors become a ``failed`` result, not an exception."""
    job = json.loads(job_json)
    try:
        graph = TrainingGraph.from_dict(job["graph"])
        device = DeviceProfile.from_dict(job["device"])
        training = None if job.get("training") is None else TrainingSpec.from_dict(job["training"])
        result = plan(graph, device, memory_budget=job["memory_budget"], runtime_budget=job["runtime_budget"],
                      time_limit=job["time_limit"], training=training)
    except (PlannerError, FormatError) as exc:
        return _result("failed", error=str(exc))
    info: dict[str, Any] = {"status": result.status, "stop_reason": result.stop_reason,
                            "plan_seconds": result.solve_seconds}
    if result.feasible and result.schedule is not None:
        return _result("done", schedule=result.schedule.to_json().decode("utf-8"), **info)
    if result.status == "infeasible":
        message = f"infeasible: {result.message}" if result.message else _infeasible(job)
        return _result("failed", error=message, **info)
    return _result("timed_out", error=f"no schedule found within the time limit of {job['time_limit']:g} s "
                                      f"({result.stop_reason or result.status}); {result.message}".rstrip("; "),
                   **info)


def _infeasible(job: dict[str, Any]) -> str:
    runtime = "no runtime budget" if job["runtime_budget"] is None else f"runtime budget {job['runtime_budget']:g}x"
    what = "a step" if job.get("training") else "the activations"
    return (f"infeasible: no schedule fits {what} in a memory budget of {job['memory_budget']:,} bytes with "
            f"{runtime}; ask with a larger memory or runtime budget")


def _result(outcome: str, *, schedule: str | None = None, error: str | None = None, **info: Any) -> bytes:
    return canonical_json({"outcome": outcome, "schedule": schedule, "error": error, **info})
