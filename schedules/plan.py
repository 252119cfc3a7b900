"""``plan()``: one entry point for POET and every baseline, one result type.

An infeasible budget is an answer (``PlanResult(feasible=False)``), not an
exception.  Every schedule returned has been replayed by the simulator against
its budgets, so a feasible result is a checked result.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, replace
from typing import Callable

from schedules.baselines import HEURISTIC_BASELINES, BaselineProblem, page_every_gap
from schedules.device import DeviceProfile, paging_time_ms, price_graph
from schedules.errors import PlannerError, ScheduleViolation, SolverError, UnknownNameError
from schedules.floors import below_floor_text
from schedules.graph import TrainingGraph
from schedules.matrices import Instruction, Matrices, to_instructions
from schedules.milp import MilpOutcome, SolveProgress, solve_poet_milp
from schedules.milp.outcome import TIME_LIMIT
from schedules.schedule import Schedule, SolverInfo, StepPlan
from schedules.simulate import SimulationReport, simulate
from schedules.step_memory import StateCosts, StepLayout, StepMemory, TrainingSpec, state_costs, update_ms
from schedules.timeline import timeline_step_ms

# Methods solved by the MILP, with the (paging, remat) switches they use.
MILP_METHODS: dict[str, tuple[bool, bool]] = {"poet": (True, True), "remat-only": (False, True), "paging-only": (True, False)}
METHODS: tuple[str, ...] = (*MILP_METHODS, *HEURISTIC_BASELINES)


@dataclass(frozen=True)
class PlanResult:
    """The answer of :func:`plan`.

    ``status`` is ``optimal``, ``feasible`` (best found, see ``gap``),
    ``infeasible`` or ``no_solution`` (stopped before finding one).
    ``objective_j`` is the method's own objective (the MILP's, or the
    simulated energy for heuristics); ``schedule.predicted_energy_j`` is what
    the simulator predicts for the instructions, never more than it.
    """

    feasible: bool
    status: str
    objective_j: float | None
    gap: float | None
    solve_seconds: float
    schedule: Schedule | None
    method: str
    bound_j: float | None = None
    simulation: SimulationReport | None = None
    message: str = ""
    timeline_ms: float | None = None
    """The step time the executor's I/O timeline gives the schedule (:func:`schedules.timeline.timeline_step_ms`),
    where :func:`plan` checked it: an overlapped plan that pages, under a runtime budget."""
    stop_reason: str = ""
    """Why the search ended: for the MILP methods one of :data:`schedules.milp.STOP_REASONS` (``optimal``,
    ``gap reached``, ``time limit``, ``no time for branch and bound``, ``relax and round``, ``solver stopped
    early``, ``infeasible``); ``time limit`` too where the time limit ended :func:`plan`'s replanning; for
    the heuristic baselines :data:`HEURISTIC`."""
    replans: int = 0
    """How many more solves :func:`plan` ran after its first plan missed the runtime budget in the I/O timeline."""


HEURISTIC = "heuristic"
"""``PlanResult.stop_reason`` of a heuristic baseline: one construction, no search."""

# plan() replans only while this much of its time limit is left: a shorter solve would rarely find a plan
RETRY_MIN_SECONDS = 1.0  # seconds
RETRY_MIN_SHARE = 0.05  # share of the time limit


@dataclass(frozen=True)
class PlanOptions:
    """How :func:`plan` searches: the solver settings, the same for its first solve and every replanning.

    ``time_limit`` is the whole call's: heuristics, every solve and every
    timeline check come out of it.  The other fields are as :func:`plan`
    documents its keywords of the same names.
    """

    solver: str = "highs"
    time_limit: float | None = None
    gap: float = 1e-4
    threads: int = 1
    warm_start: bool = True
    relax_and_round: bool = False
    count_paging_time: bool = False
    read_ahead: bool | str = False
    check_timeline: bool = True
    progress: Callable[[SolveProgress], None] | None = None


class _Deadline:
    """What is left of one :func:`plan` call's time limit, on the monotonic clock."""

    def __init__(self, limit: float | None) -> None:
        self.limit = limit
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def remaining(self) -> float | None:
        return None if self.limit is None else max(self.limit - self.elapsed(), 0.0)

    def solve_limit(self) -> float | None:
        """Seconds the next MILP solve may take: what is left, less a little for replaying its plan."""
        left = self.remaining()
        if left is None:
            return None
        return max(left - min(0.01 * self.limit, 0.5), 0.01)

    def allows_replanning(self) -> bool:
        """True while enough is left for another solve to be worth starting."""
        left = self.remaining()
        return left is None or left >= max(RETRY_MIN_SECONDS, RETRY_MIN_SHARE * self.limit)


def plan(
    graph: TrainingGraph,
    device: DeviceProfile | str | None = None,
    memory_budget: float | None = None,
    runtime_budget: float | None = None,
    method: str = "poet",
    solver: str = "highs",
    time_limit: float | None = None,
    gap: float = 1e-4,
    threads: int = 1,
    warm_start: bool = True,
    relax_and_round: bool = False,
    count_paging_time: bool = False,
    read_ahead: bool | str = False,
    check_timeline: bool = True,
    progress: Callable[[SolveProgress], None] | None = None,
    options: PlanOptions | None = None,
    training: TrainingSpec | None = None,
) -> PlanResult:
    """Plan one training step of ``graph`` within the budgets.

    Parameters
    ----------
    graph:
        The training graph; node energies already present are used as they are,
        missing ones are priced with ``device``.
    device:
        A :class:`DeviceProfile` or a built-in name (``rpi4``, ...).  Needed when
        the graph has no energies, for ``count_paging_time`` and for the
        paging-aware baselines.
    memory_budget:
        Bytes allowed in RAM: with ``training``, everything the step adds to
        the loaded model (activations, gradients, optimizer state, the
        runtime's own memory); without it, activations alone (POET's budget,
        as for the reference graphs).  ``None`` means unconstrained.
    runtime_budget:
        Allowed step time as a multiple of one plain step's compute time
        (``graph.total_compute_ms``); ``None`` means no limit.
    method:
        ``"poet"`` or a baseline name from :data:`METHODS`.
    solver, time_limit, gap, threads, warm_start, relax_and_round:
        MILP controls: ``highs`` or ``cbc``; seconds for the whole call (the
        warm start's heuristics, every solve and every replanning below share
        them); relative MIP gap; solver threads; start from the best feasible
        heuristic; LP relaxation plus rounding for graphs beyond exact reach.
    count_paging_time:
        Count paging time in the runtime budget (devices whose paging does not
        overlap compute); off by default, as in the published formulation.
        Off, paging with a device profile runs beside compute on the
        executor's one I/O thread, and the plan must still leave that thread
        time for every transfer within the runtime budget (the published
        formulation prices paging as free of time, so on slow flash its plans
        wait for writes); the share of paging time the profile measured not
        hidden behind compute (``paging_hidden_fraction``) is counted.
    read_ahead:
        Leave room under the memory budget to read each page in ahead of its
        ``page_in`` (see :func:`schedules.milp.solve_poet_milp`): ``"node"`` (or
        ``True``) beside the computation just before it; ``"read"`` beside as
        many computations before it as the device's read of the page takes
        (slow flash; more memory kept for reads, less for the plan).
    check_timeline:
        With paging beside compute and a runtime budget, replay a MILP plan
        in the executor's I/O timeline (:func:`schedules.timeline.timeline_step_ms`:
        frees wait for their writes, page-ins for their reads).  A plan that
        misses the runtime budget there (a page-in with no room to be read
        ahead, slow flash) is planned again with ``read_ahead="node"``, then
        ``"read"``, then with paging time counted, each solve with what is
        left of ``time_limit``; the first that meets the budget in the
        timeline is kept, else the fastest there, with a message.  When too
        little of the time limit is left for another solve, replanning stops
        and the message says so.  The timeline's step time is in ``timeline_ms``.
    progress:
        Called with :class:`SolveProgress` while the MILP runs.
    options:
        All of the settings above from ``solver`` on, as one :class:`PlanOptions`
        (then leave those keywords at their defaults).
    training:
        Plan the step's whole memory for this optimizer and training
        (:mod:`schedules.step_memory`; the graph needs its parameter layout):
        the plan also decides which parameters' optimizer state lives on
        flash, and the schedule says so and predicts each part (``step``).
        The MILP methods choose the state's residency; a heuristic keeps it all
        in RAM where that fits, else pages all it can.  ``remat-only`` pages
        nothing, optimizer state included.
    """
    given = PlanOptions(solver, time_limit, gap, threads, warm_start, relax_and_round, count_paging_time,
                        read_ahead, check_timeline, progress)
    if options is not None and given != PlanOptions():
        raise PlannerError("pass the solver settings either as options= or as keywords, not both")
    options = options or given
    return _plan(graph, device, memory_budget, runtime_budget, method, options, _Deadline(options.time_limit),
                 training)


def _plan(graph: TrainingGraph, device: DeviceProfile | str | None, memory_budget: float | None,
          runtime_budget: float | None, method: str, options: PlanOptions, deadline: _Deadline,
          training: TrainingSpec | None = None) -> PlanResult:
    """:func:`plan` with its settings bundled and its deadline running (shared by every replanning)."""
    if method not in METHODS:
        raise UnknownNameError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    profile = DeviceProfile.builtin(device) if isinstance(device, str) else device
    graph = _priced(graph, profile)
    step, costs = _step_memory(graph, training, memory_budget, profile, method)
    paging_ms = paging_time_ms(graph, profile) if profile is not None else None
    count_paging_time = options.count_paging_time
    if count_paging_time and paging_ms is None:
        raise PlannerError("count_paging_time needs a device profile to know paging times; pass device=")
    read_ahead = _read_ahead_mode(options.read_ahead)
    if read_ahead == "read" and paging_ms is None:
        raise PlannerError('read_ahead="read" needs a device profile to know read times; pass device=')
    # the optimizer's updates run beside no node: the step's time is the nodes' plus theirs, the budget a
    # multiple of a plain step's (its nodes and its updates), and the nodes get what the updates leave of it
    update = update_ms(step, profile) if step is not None else 0.0
    step_budget_ms = None if runtime_budget is None else runtime_budget * (graph.total_compute_ms + update)
    runtime_ms = None if step_budget_ms is None else step_budget_ms - update
    problem = BaselineProblem(graph, memory_budget, runtime_ms, _counted_paging_ms(profile, paging_ms, count_paging_time),
                              paging_ms)
    context = _Context(graph, profile, problem, count_paging_time, method, options.solver, step, costs, update)
    if method in HEURISTIC_BASELINES:
        return _plan_heuristic(context, method)
    if options.time_limit is not None and not options.time_limit > 0:
        raise SolverError(f"the time limit must be positive seconds, got {options.time_limit}")
    paging, remat = MILP_METHODS[method]
    start = _best_heuristic(context) if options.warm_start else None
    outcome = solve_poet_milp(
        graph, memory_budget=memory_budget, runtime_budget_ms=runtime_ms, paging=paging, remat=remat,
        solver=options.solver, time_limit=deadline.solve_limit(), gap=options.gap, threads=options.threads,
        warm_start=start, relax_and_round=options.relax_and_round, paging_time_ms=problem.counted_paging_ms,
        io_time_ms=problem.paging_ms, read_ahead=read_ahead is not None,
        read_ahead_ms=paging_ms[0] if read_ahead == "read" else None, progress=options.progress,
        step=step, state_costs=costs,
    )
    result = _from_milp(context, outcome)
    if not (options.check_timeline and paging and result.feasible and runtime_ms is not None and profile is not None
            and profile.paging_overlaps_compute and not count_paging_time):
        return result
    def timeline(schedule: Schedule) -> float:
        return timeline_step_ms(graph, schedule, profile) + update

    step_ms = timeline(result.schedule)
    if step_ms <= step_budget_ms * (1 + 1e-9):
        return replace(result, timeline_ms=step_ms)
    replan = functools.partial(_plan, graph, profile, memory_budget, runtime_budget, method, deadline=deadline,
                               training=training)
    return _replanned(result, step_ms, step_budget_ms, replan, timeline, options, read_ahead, deadline)


def _step_memory(graph: TrainingGraph, training: TrainingSpec | None, memory_budget: float | None,
                 profile: DeviceProfile | None, method: str) -> tuple[StepMemory | None, StateCosts | None]:
    """The whole step's accounting for ``training`` (``None`` plans activations alone), and its paging priced."""
    if training is None:
        return None, None
    spec = training.with_chunk_for(memory_budget)
    if method == "remat-only" and spec.state_paging:  # Checkmate's remedy: nothing goes to flash
        spec = replace(spec, state_paging=False)
    step = StepMemory.build(graph, spec)
    if not (step.groups and spec.state_paging):
        return step, None
    if profile is None:
        raise PlannerError("optimizer state on flash is priced with the device's paging: pass device= (or plan "
                           "with state_paging=False)")
    return step, state_costs(step, profile)



def _replanned(result: PlanResult, step_ms: float, runtime_ms: float, replan: Callable[..., PlanResult],
               timeline: Callable[[Schedule], float], options: PlanOptions, read_ahead: str | None,
               deadline: _Deadline) -> PlanResult:
    """Plan again with more read-ahead room, then with paging time counted, while the time limit leaves
    room; keep the first plan ``timeline`` puts within the runtime budget, else the fastest there."""
    seconds, candidates = result.solve_seconds, [(step_ms, result, "")]
    modes = list(READ_AHEAD)
    roomier = modes[modes.index(read_ahead) + 1:] if read_ahead else modes  # the rooms not tried yet
    retries = [({"read_ahead": mode}, READ_AHEAD[mode]) for mode in roomier]
    retries.append(({"count_paging_time": True, "read_ahead": read_ahead or False}, "with paging time counted"))
    tried = 0
    for changes, how in retries:
        if not deadline.allows_replanning():
            break
        again = replan(options=replace(options, check_timeline=False, **changes))
        tried += 1
        seconds += again.solve_seconds
        if not again.feasible:
            continue
        again_ms = timeline(again.schedule)
        candidates.append((again_ms, again, how))
        if again_ms <= runtime_ms * (1 + 1e-9):
            break
    best_ms, best, how = min(candidates, key=lambda c: c[0])
    message = _replanning_message(best is result, how, step_ms, best_ms, runtime_ms, tried, len(retries))
    if best_ms <= runtime_ms * (1 + 1e-9) or tried == len(retries):
        return replace(best, solve_seconds=seconds, timeline_ms=best_ms, message=message, replans=tried)
    message += (f"; the time limit ({options.time_limit:g} s) ended the replanning after {tried} of {len(retries)} "
                "tries: raise it for a plan that may meet the budget")
    return replace(best, solve_seconds=seconds, timeline_ms=best_ms, message=message, stop_reason=TIME_LIMIT,
                   replans=tried)


def _replanning_message(kept_first: bool, how: str, step_ms: float, best_ms: float, runtime_ms: float,
                        tried: int, retries: int) -> str:
    """What replanning found: the plan kept and the step times in the executor's I/O timeline."""
    if kept_first:
        found = ("no plan with read-ahead room or paging time counted does better" if tried == retries
                 else "no time was left to plan it again" if tried == 0
                 else "no plan tried in the time limit does better")
        return (f"the executor's I/O timeline puts this plan at {step_ms:.0f} ms, over the runtime budget of "
                f"{runtime_ms:.0f} ms, and {found}; expect the step to run that long")
    over = "" if best_ms <= runtime_ms * (1 + 1e-9) else "; still over it: expect the step to run that long"
    return (f"planned {how}: the overlapped plan takes {step_ms:.0f} ms in the executor's I/O timeline, "
            f"this one {best_ms:.0f} ms, against the runtime budget of {runtime_ms:.0f} ms{over}")


READ_AHEAD = {"node": "with room to read each page ahead",
              "read": "with room to read each page ahead for as long as its read takes"}
"""Read-ahead room :func:`plan` can keep (``read_ahead=``), least memory first, and how its message says so."""


def _read_ahead_mode(read_ahead: bool | str) -> str | None:
    """``None`` (the published model), ``"node"`` or ``"read"``; ``True`` means ``"node"``."""
    if read_ahead is False or read_ahead is None:
        return None
    if read_ahead is True:
        return "node"
    if read_ahead not in READ_AHEAD:
        raise UnknownNameError(f"unknown read_ahead {read_ahead!r}; choose one of {', '.join(READ_AHEAD)} "
                               "(or True for 'node')")
    return read_ahead


def _counted_paging_ms(device: DeviceProfile | None, paging_ms, count_paging_time: bool):
    """The paging time the runtime budget pays: all of it when asked; where paging overlaps compute, the share a
    profile measured not hidden behind it; else none (the published formulation)."""
    if paging_ms is None:
        return None
    if count_paging_time:
        return paging_ms
    exposed = device.exposed_paging_fraction if device.paging_overlaps_compute else 0.0
    if exposed <= 0.0:
        return None
    return tuple([exposed * ms for ms in column] for column in paging_ms)


@dataclass(frozen=True)
class _Context:
    graph: TrainingGraph
    device: DeviceProfile | None
    problem: BaselineProblem
    count_paging_time: bool
    method: str
    solver: str
    step: StepMemory | None = None
    costs: StateCosts | None = None
    update_ms: float = 0.0  # the optimizer's updates: beside no node, added to the nodes' step time

    def infeasible(self, message: str) -> str:
        """``message``, and where the memory budget is below the graph's floor, the floor on this cut and on the
        other (:func:`schedules.floors.below_floor_text`): no solver setting helps there, a larger budget or a
        finer cut does."""
        training = self.step.spec if self.step is not None else None
        floors = below_floor_text(self.graph, self.problem.memory_budget, training)
        return message if floors is None else f"{message}: {floors}"

    def layout(self, matrices: Matrices) -> StepLayout | None:
        """The whole-step layout ``matrices`` decide (``None`` when planning activations alone)."""
        return None if self.step is None else self.step.layout(matrices.state_on_flash, self.costs)

    def heuristic_layouts(self) -> list[tuple[frozenset[int], BaselineProblem]]:
        """The state residencies a heuristic tries, each with the problem it plans activations for: all state
        in RAM, then (where state may be paged) all of it on flash.  The budget left for activations is what
        the step holds beside them at its fullest stage, update transients included: a heuristic does not
        know stages, the simulator then checks the plan exactly."""
        if self.step is None:
            return [(frozenset(), self.problem)]
        choices = [self.step.layout(())]
        if self.step.groups and self.step.spec.state_paging:
            choices.append(self.step.all_on_flash())
        out = []
        for layout in choices:
            budget = self.problem.memory_budget
            if budget is not None:
                beside = max(layout.fixed_at(t) for t in range(self.graph.size))
                budget = budget - beside - max(self.step.update_bytes, default=0)
                if budget <= 0:
                    continue
            out.append((layout.state_on_flash, replace(self.problem, memory_budget=budget)))
        return out


def _priced(graph: TrainingGraph, device: DeviceProfile | None) -> TrainingGraph:
    if graph.has_energy:
        return graph
    if device is None:
        raise PlannerError(
            "the graph carries no energy costs; pass device= (a DeviceProfile or a built-in name such as 'rpi4') "
            "so they can be priced")
    return price_graph(graph, device)


def _plan_heuristic(ctx: _Context, method: str) -> PlanResult:
    started = time.perf_counter()
    result = None
    for on_flash, problem in ctx.heuristic_layouts():
        matrices = HEURISTIC_BASELINES[method](problem)
        if matrices is None:
            continue
        result = _checked_result(ctx, replace(matrices, state_on_flash=on_flash), status="feasible", objective=None,
                                 gap=None, bound=None, seconds=time.perf_counter() - started, stop_reason=HEURISTIC)
        if result.feasible:
            return result
    if result is not None:
        return result
    return PlanResult(False, "infeasible", None, None, time.perf_counter() - started, None, method,
                      message=ctx.infeasible(f"{method} has no schedule within these budgets"),
                      stop_reason=HEURISTIC)


def _best_heuristic(ctx: _Context) -> Matrices | None:
    """The heuristic schedule of least energy that fits the budgets: the MILP's warm start.  Beside the
    baselines, :func:`~schedules.baselines.page_every_gap` is tried: near the floor it is often the only one."""
    best: tuple[float, Matrices] | None = None
    for on_flash, problem in ctx.heuristic_layouts():
        for baseline in (*HEURISTIC_BASELINES.values(), page_every_gap):
            matrices = baseline(problem)
            if matrices is None:
                continue
            matrices = replace(matrices, state_on_flash=on_flash)
            try:
                report = _simulate(ctx, to_instructions(ctx.graph, matrices), ctx.layout(matrices))
            except ScheduleViolation:
                continue
            if best is None or report.energy_j < best[0]:
                best = (report.energy_j, matrices)
    return None if best is None else best[1]


def _from_milp(ctx: _Context, outcome: MilpOutcome) -> PlanResult:
    if outcome.matrices is None:
        message = (ctx.infeasible("the memory/runtime budgets admit no schedule") if outcome.status == "infeasible"
                   else "the solver stopped before finding any schedule; raise the time limit")
        return PlanResult(False, outcome.status, None, None, outcome.solve_seconds, None, ctx.method,
                          bound_j=outcome.bound_j, message=message, stop_reason=outcome.stop_reason)
    return _checked_result(ctx, outcome.matrices, status=outcome.status, objective=outcome.objective_j,
                           gap=outcome.gap, bound=outcome.bound_j, seconds=outcome.solve_seconds,
                           stop_reason=outcome.stop_reason)


def _simulate(ctx: _Context, instructions: list[Instruction], layout: StepLayout | None = None) -> SimulationReport:
    return simulate(ctx.graph, instructions, memory_budget=ctx.problem.memory_budget,
                    runtime_budget_ms=ctx.problem.runtime_budget_ms, paging_time_ms=ctx.problem.counted_paging_ms,
                    io_time_ms=ctx.problem.paging_ms, step=layout)


def _checked_result(ctx: _Context, matrices: Matrices, *, status: str, objective: float | None,
                    gap: float | None, bound: float | None, seconds: float, stop_reason: str) -> PlanResult:
    instructions = to_instructions(ctx.graph, matrices)
    layout = ctx.layout(matrices)
    try:
        report = _simulate(ctx, instructions, layout)
    except ScheduleViolation as exc:
        if ctx.method in MILP_METHODS:
            # The MILP proved this plan fits; a replay that disagrees is a bug, not a budget problem.
            raise SolverError(f"the {ctx.method} MILP's plan failed the simulator ({exc}); please report this "
                              "with the graph file and budgets") from exc
        return PlanResult(False, "infeasible", None, None, seconds, None, ctx.method,
                          message=ctx.infeasible(f"{ctx.method} does not fit the budgets ({exc})"),
                          stop_reason=stop_reason)
    objective = report.energy_j if objective is None else objective
    schedule = Schedule(
        instructions=tuple(instructions),
        graph_fingerprint=ctx.graph.fingerprint,
        graph_size=ctx.graph.size,
        model=ctx.graph.model,
        device=ctx.device.name if ctx.device is not None else ctx.graph.source or "graph-costs",
        memory_budget=None if ctx.problem.memory_budget is None else int(ctx.problem.memory_budget),
        runtime_budget_ms=None if ctx.problem.runtime_budget_ms is None else ctx.problem.runtime_budget_ms + ctx.update_ms,
        predicted_peak_bytes=report.peak_memory_bytes,  # what the budget bounds: values plus workspace
        predicted_runtime_ms=report.runtime_ms + ctx.update_ms,
        predicted_energy_j=report.energy_j,
        solver=SolverInfo(method=ctx.method, solver=ctx.solver if ctx.method in MILP_METHODS else "heuristic",
                          status=status, objective_j=objective, gap=gap, seconds=seconds),
        count_paging_time=ctx.count_paging_time,
        step=None if layout is None else step_plan(layout, report, ctx.update_ms),
    )
    return PlanResult(True, status, objective, gap, seconds, schedule, ctx.method, bound_j=bound, simulation=report,
                      stop_reason=stop_reason)


def step_plan(layout: StepLayout, report: SimulationReport, update: float = 0.0) -> StepPlan:
    """What a whole-step schedule records of its plan and predicts part by part (``update``: the optimizer's
    updates' milliseconds)."""
    memory = layout.memory
    return StepPlan(training=memory.spec, state_on_flash=layout.parameters_on_flash,
                    activation_peak_bytes=report.activation_peak_bytes, gradient_peak_bytes=layout.gradient_peak_bytes,
                    resident_state_bytes=layout.resident_state_bytes, paged_state_bytes=layout.paged_state_bytes,
                    runtime_bytes=memory.runtime_bytes, update_ms=update)
