"""Where the agent's schedule comes from, and where its status goes: the two seams the fleet plugs into.

A :class:`ScheduleSource` turns (this device's graph, its profile, the
budgets) into a schedule: :class:`FileScheduleSource` reads a signed file the
operator placed, :class:`LocalSolveSource` plans on the device within a time
limit (the fleet server's source comes with the server).  Whatever the source,
:class:`ScheduleCache` keeps what it gave signed on disk and verifies it
(signature and graph fingerprint) every time it is used, so a schedule
tampered with on the device, or planned for another model, never runs.

A :class:`Reporter` receives the agent's status at every change; the default
reports nowhere (the status file is always written).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from schedules.budgets import budget_class
from schedules.device import DeviceProfile
from schedules.errors import FormatError, InfeasibleBudgetError, PlannerError, ScheduleMismatchError
from schedules.graph import TrainingGraph
from schedules.schedule import Schedule
from schedules.step_memory import TrainingSpec
from common.canonical import canonical_json
from common.files import write_atomically
from common.units import format_bytes
from schedules.signing import generate_keypair, load_private_key, load_public_key, sign

log = logging.getLogger("poet-agent")


@dataclass(frozen=True)
class Request:
    """What a schedule is asked for: this device's graph and profile, its training, and the budgets.

    ``memory_budget`` is the step's whole memory beyond the loaded model, planned for ``training``.
    """

    graph: TrainingGraph
    device: DeviceProfile
    memory_budget: int
    training: TrainingSpec
    runtime_budget: float | None = None  # factor of the plain step time

    def check(self, schedule: Schedule) -> None:
        """Refuse a schedule not planned for this graph, budget and training, saying what differs.

        The budget matches when the schedule was planned for this budget or for its class (the budget rounded
        down to 7 significant bits, as a fleet server plans it: :func:`schedules.budgets.budget_class`): such a
        schedule fits, at most 1.6 % tighter.  One planned for more memory could not keep the step within this
        budget; one planned for much less would train slower than this device allows.
        """
        schedule.check_graph(self.graph)
        planned = schedule.memory_budget
        if planned is None or not budget_class(self.memory_budget) <= planned <= self.memory_budget:
            budget = "no memory budget" if schedule.memory_budget is None else \
                f"a memory budget of {format_bytes(schedule.memory_budget)}"
            raise ScheduleMismatchError(
                f"schedule {schedule.schedule_id} is planned for {budget}, not this device's "
                f"training.memory_budget of {format_bytes(self.memory_budget)}: plan it for "
                f"{self.memory_budget} B (`poet-edge solve --memory {self.memory_budget} --optimizer ...`) or set "
                "training.memory_budget to the schedule's")
        if schedule.step is None:
            raise ScheduleMismatchError(
                f"schedule {schedule.schedule_id} budgets activations only; a device trains under a schedule planned "
                "for the step's whole memory: plan it with `poet-edge solve --optimizer ...`")
        training = schedule.step.training
        for name in ("optimizer", "state_tensors", "update_temporaries", "accumulation", "clip"):
            if getattr(training, name) != getattr(self.training, name):
                raise ScheduleMismatchError(
                    f"schedule {schedule.schedule_id} is planned for {training.describe()}, this device trains with "
                    f"{self.training.describe()}: plan it for the device's [training] settings")


class ScheduleSource(Protocol):
    """Gives a schedule for a request, or raises a :class:`~common.errors.PoetEdgeError` saying why not."""

    description: str
    cacheable: bool  # False: asked again at every start (a local file is as cheap to read as the cache)

    def fetch(self, request: Request) -> Schedule: ...


class FileScheduleSource:
    """A schedule file the operator placed on the device, signed by a key the agent trusts."""

    def __init__(self, path: str | Path, public_key: str | Path) -> None:
        self.path = Path(path)
        self.public_key = load_public_key(public_key)
        self.description = f"schedule file {self.path}"
        self.cacheable = False

    def fetch(self, request: Request) -> Schedule:
        schedule = Schedule.load(self.path, public_key=self.public_key)  # signature first, then the content
        request.check(schedule)
        return schedule


class LocalSolveSource:
    """Plans on the device: POET's MILP within ``time_limit`` seconds."""

    def __init__(self, time_limit: float) -> None:
        self.time_limit = time_limit
        self.description = f"local solve ({time_limit:g} s limit)"
        self.cacheable = True

    def fetch(self, request: Request) -> Schedule:
        from schedules.plan import plan  # the solver loads only when a solve is needed

        result = plan(request.graph, request.device, memory_budget=request.memory_budget,
                      runtime_budget=request.runtime_budget, time_limit=self.time_limit, training=request.training)
        if result.schedule is None:
            raise InfeasibleBudgetError(
                f"no schedule fits a step in {format_bytes(request.memory_budget)}"
                + (f" within {request.runtime_budget:g}x the plain step time" if request.runtime_budget else "")
                + f" ({result.status}, stopped: {result.stop_reason}); {smallest_budget_advice(request, self.time_limit)}")
        return result.schedule


def smallest_budget_advice(request: Request, time_limit: float) -> str:
    """Where the smallest feasible budget is, in words an operator acts on (searched within ``time_limit``)."""
    from schedules.budgets import smallest_feasible_budget
    from schedules.plan import plan

    def probe(budget: int, limit: float | None):
        return plan(request.graph, request.device, memory_budget=budget, runtime_budget=request.runtime_budget,
                    time_limit=limit, gap=0.5, check_timeline=False, training=request.training)

    search = smallest_feasible_budget(request.graph, probe, time_budget_s=max(time_limit, 5.0),
                                      probe_time_limit_s=min(15.0, max(time_limit, 5.0)), training=request.training)
    if search.budget is None:
        return (f"no budget fits within the runtime budget ({search.note}): raise training.runtime_budget")
    about = "" if search.exact else "about "
    return (f"the smallest budget that fits is {about}{format_bytes(search.budget)}: set training.memory_budget = "
            f"\"{search.budget}\" or more")


class ScheduleCache:
    """Schedules kept on the device, re-verified on every use.

    Schedules from a trusted key stay signed by it; a locally solved one is
    signed with the agent's own key (made in ``directory`` on first use), so
    every cached schedule is checked the same way before it runs.
    """

    def __init__(self, directory: str | Path, trusted_key: str | Path | None = None) -> None:
        self.directory = Path(directory)
        self.trusted_key = load_public_key(trusted_key) if trusted_key is not None else None

    def path(self, request: Request) -> Path:
        runtime = f"-rt{request.runtime_budget:g}" if request.runtime_budget else ""
        t = request.training
        training = f"-{t.optimizer}{t.state_tensors}{t.update_temporaries}a{t.accumulation}{'c' if t.clip else ''}"
        return self.directory / f"schedule-{request.memory_budget}{runtime}{training}.json"

    def load(self, request: Request) -> Schedule | None:
        """The cached schedule for ``request`` after verification; ``None`` (and the file removed) if absent or
        if it fails verification, with the reason logged."""
        path = self.path(request)
        if not path.is_file():
            return None
        try:
            schedule = self._verified(path)
            request.check(schedule)
        except (PlannerError, FormatError) as exc:
            log.warning("cached schedule %s refused, getting a new one: %s", path, exc)
            path.unlink(missing_ok=True)
            return None
        return schedule

    def store(self, request: Request, schedule: Schedule) -> Schedule:
        """Keep ``schedule`` (signing a local one with the agent's key); returns what was stored."""
        if schedule.signature is None:
            schedule = sign(schedule, load_private_key(self._agent_key()[0]))
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(request)
        temporary = path.with_suffix(".tmp")
        schedule.save(temporary)
        temporary.replace(path)
        return schedule

    def verdict_path(self, request: Request) -> Path:
        """Where the verdict that no schedule fits ``request`` is kept."""
        return self.path(request).with_suffix(".infeasible.json")

    def store_infeasible(self, request: Request, message: str) -> None:
        """Keep the verdict that no schedule fits ``request``, tied to its graph and device profile."""
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomically(self.verdict_path(request),
                         canonical_json({"inputs": _request_inputs(request), "message": message}))

    def raise_known_infeasible(self, request: Request) -> None:
        """Raise the kept :class:`InfeasibleBudgetError` when an earlier solve found ``request`` infeasible for
        this very graph and device profile (a verdict for other inputs, or unreadable, is removed)."""
        path = self.verdict_path(request)
        if not path.is_file():
            return
        try:
            verdict = json.loads(path.read_bytes())
            same = verdict.get("inputs") == _request_inputs(request)
            message = str(verdict["message"])
        except (OSError, ValueError, KeyError, AttributeError):
            same = False
        if not same:
            path.unlink(missing_ok=True)
            return
        raise InfeasibleBudgetError(f"{message} [found by an earlier solve of this graph and budget; change the "
                                    f"budget, or remove {path} to solve again]")

    def _verified(self, path: Path) -> Schedule:
        signature = json.loads(path.read_bytes()).get("signature") or {}
        keys = [k for k in (self.trusted_key, self._agent_public()) if k is not None]
        from schedules.signing import key_id

        # verify with the key the file names, when it is one we trust; else let the first key say why not
        named = [k for k in keys if key_id(k) == signature.get("key_id")]
        return Schedule.load(path, public_key=(named or keys)[0])

    def _agent_key(self) -> tuple[Path, Path]:
        private, public = self.directory / "agent-signing.key", self.directory / "agent-signing.pub"
        if not private.is_file():
            self.directory.mkdir(parents=True, exist_ok=True)
            generate_keypair(self.directory, "agent-signing")
        return private, public

    def _agent_public(self) -> Any:
        return load_public_key(self._agent_key()[1])


def _request_inputs(request: Request) -> str:
    """What a verdict depends on besides the file name's budgets: the graph and the device profile."""
    device = hashlib.sha256(canonical_json(request.device.to_dict())).hexdigest()
    return f"{request.graph.fingerprint}/{device}"


def get_schedule(source: ScheduleSource, cache: ScheduleCache, request: Request) -> tuple[Schedule, str]:
    """The cached schedule when it still verifies, else a new one from ``source`` (verified and cached);
    returns it and where it came from.  A budget found infeasible is not solved again for the same graph,
    device profile and budgets: the verdict is kept beside the cache and raised again at once."""
    if source.cacheable:
        cache.raise_known_infeasible(request)
        cached = cache.load(request)
        if cached is not None:
            return cached, f"cache ({cache.path(request).name})"
    try:
        schedule = source.fetch(request)
    except InfeasibleBudgetError as exc:
        if source.cacheable:
            cache.store_infeasible(request, str(exc))
        raise
    request.check(schedule)
    return cache.store(request, schedule), source.description


class Reporter(Protocol):
    """Receives the agent's status (the JSON object ``poet-edge agent status --json`` prints) at every change."""

    def report(self, status: dict[str, Any]) -> None: ...


class NoReporter:
    """Reports nowhere: a device outside a fleet."""

    def report(self, status: dict[str, Any]) -> None:
        pass
