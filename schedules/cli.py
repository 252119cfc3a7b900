"""The planner's subcommands of ``poet-edge`` (:mod:`common.cli`): plan, draw, sweep, sign and verify schedules.

Registered in the ``poet_edge.commands`` entry-point group (``poet-edge COMMAND --help`` for each)::

    solve    plan one training step of a graph within memory and runtime budgets
    plot     draw a schedule as a stage x node timeline with memory over the step
    pareto   sweep memory budgets; energy against budget for POET and every baseline
    keys     make an Ed25519 key pair for signing schedules
    verify   check a schedule's signature, and that it fits and replays on its graph
    devices  list the built-in device profiles
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from schedules.budgets import (BudgetSearch, SweepPoint, budget_points, floor_text, smallest_feasible_budget,
                               store_all_peak, sweep)
from schedules.device import DeviceProfile, paging_time_ms, price_graph
from common.errors import CommandError
from schedules.errors import UnknownNameError
from common.cli import positive_float, positive_int, size_arg
from common.exit_codes import ExitCode
from schedules.graph import TrainingGraph
from schedules.plan import METHODS, MILP_METHODS, READ_AHEAD, PlanResult, plan
from schedules.plot import plot_pareto, plot_timeline  # matplotlib itself loads only when drawing
from schedules.progress import SolveProgressDisplay  # rich loads only on a terminal
from schedules.schedule import Schedule
from schedules.signing import generate_keypair, load_private_key, load_public_key, sign
from schedules.simulate import SimulationReport, simulate
from schedules.step_memory import OPTIMIZERS, TrainingSpec
from common.units import format_bytes, short_bytes

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

Planner = Callable[..., PlanResult]  # plan() with the graph and every setting but budget and method bound


# -- this package's subcommands ----------------------------------------------------
def add_commands(subparsers: Any) -> None:
    """Register ``solve``, ``plot``, ``pareto``, ``keys``, ``verify`` and ``devices``."""
    _add_solve(subparsers)
    _add_plot(subparsers)
    _add_pareto(subparsers)
    _add_keys(subparsers)
    _add_verify(subparsers)
    _add_devices(subparsers)


def _add_budget_options(p: argparse.ArgumentParser, *, memory: bool) -> None:
    p.add_argument("graph", metavar="GRAPH", help="training graph JSON (ours, or a POET reference graph)")
    p.add_argument("--device", metavar="NAME|FILE.json",
                   help="built-in device profile (see `poet-edge devices`) or a profile file; prices graphs "
                        "without energies and gives paging times")
    if memory:
        p.add_argument("--memory", type=size_arg, metavar="SIZE",
                       help="RAM budget: 3000000, 3MB (= 3,000,000 B), 1.5MiB; the step's whole memory with "
                            "--optimizer, activations alone without it; default unconstrained")
    p.add_argument("--runtime", type=positive_float, metavar="X",
                   help="runtime budget as a multiple of one plain step's compute time (e.g. 1.5); default no limit")
    p.add_argument("--solver", choices=("highs", "cbc"), default="highs", help="MILP solver (default highs)")
    p.add_argument("--threads", type=positive_int, default=1, help="solver threads (default 1)")
    p.add_argument("--count-paging-time", action="store_true",
                   help="count paging time in the runtime budget (devices whose paging does not overlap "
                        "compute; needs --device)")
    p.add_argument("--read-ahead", choices=tuple(READ_AHEAD),
                   help="keep room under the memory budget to read each page ahead: beside the node before its "
                        "use (node) or for as long as its read takes on --device's flash (read); by default "
                        "tried in that order only when the plan misses the runtime budget in the I/O timeline")
    step = p.add_argument_group(
        "whole-step memory", "with --optimizer the budget is everything the step adds to the loaded model: "
        "activations, gradients (updated in the backward pass as they become final), optimizer state (in RAM or "
        "on flash, as the plan decides) and the runtime's own memory; the graph needs its parameter layout "
        "(`poet-edge profile`)")
    step.add_argument("--optimizer", choices=OPTIMIZERS, help="plan the whole step for this optimizer")
    step.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (0: no state; default 0)")
    step.add_argument("--nesterov", action="store_true", help="SGD with Nesterov momentum")
    step.add_argument("--weight-decay", type=float, default=0.0, help="weight decay (default 0)")
    step.add_argument("--accumulation", type=positive_int, default=1, metavar="N",
                      help="micro-batches per step: every gradient is then held through the step (default 1)")
    step.add_argument("--clip", action="store_true",
                      help="clip gradients by global norm: gradients are then held to the end of the backward pass")
    step.add_argument("--no-state-paging", action="store_true", help="keep all optimizer state in RAM")


def _add_solve(subparsers: Any) -> None:
    p = subparsers.add_parser("solve", help="plan a schedule within memory and runtime budgets",
                              description="Solve POET's MILP (or a baseline) for one training step and write "
                                          "the schedule. An infeasible budget exits 1 and prints the smallest "
                                          "feasible memory budget.")
    _add_budget_options(p, memory=True)
    p.add_argument("--time-limit", type=positive_float, metavar="S", help="solver time limit, seconds")
    p.add_argument("--gap", type=float, default=1e-4, metavar="G", help="relative MIP gap to prove (default 1e-4)")
    p.add_argument("--baseline", metavar="NAME",
                   help="plan with a baseline instead of POET: " + ", ".join(METHODS[1:]))
    p.add_argument("--relax-and-round", action="store_true",
                   help="LP relaxation plus rounding, for graphs beyond exact reach")
    p.add_argument("--sign", metavar="KEYFILE", help="sign the schedule with this Ed25519 private key")
    p.add_argument("-o", "--output", default="schedule.json", metavar="FILE",
                   help="where to write the schedule (default schedule.json)")
    p.add_argument("--search-time", type=float, default=60.0, metavar="S",
                   help="when infeasible, seconds to spend finding the smallest feasible budget (0: skip)")
    p.set_defaults(handler=run_solve)


def _add_plot(subparsers: Any) -> None:
    p = subparsers.add_parser("plot", help="draw a schedule: stage x node timeline and memory over the step",
                              description="Draw SCHEDULE as a stage x node timeline (compute, recompute, "
                                          "page-out, page-in, resident in RAM, on flash; like the POET paper's "
                                          "Figure 2) above the resident bytes over the step against the budget.")
    p.add_argument("schedule", metavar="SCHEDULE", help="schedule JSON written by `poet-edge solve`")
    p.add_argument("--graph", required=True, metavar="GRAPH", help="the training graph the schedule was planned for")
    p.add_argument("--key", metavar="PUB", help="refuse the schedule unless signed by this public key")
    p.add_argument("--title", help="figure title (default: model, device, method, budget, energy)")
    p.add_argument("-o", "--output", default="timeline.png", metavar="FILE.png", help="image to write (default timeline.png)")
    p.set_defaults(handler=run_plot)


def _add_pareto(subparsers: Any) -> None:
    p = subparsers.add_parser("pareto", help="energy against memory budget for POET and every baseline",
                              description="Sweep memory budgets from the smallest feasible one to plain "
                                          "backpropagation's peak, plan POET and every baseline at each, print "
                                          "a table of energy per step and plot the curves.")
    _add_budget_options(p, memory=False)
    p.add_argument("--points", type=positive_int, default=8, help="number of budgets (default 8)")
    p.add_argument("--time-limit", type=positive_float, default=10.0, metavar="S",
                   help="time limit of each solve, seconds (default 10)")
    p.add_argument("--gap", type=float, default=0.005, metavar="G", help="relative MIP gap of each solve (default 0.005)")
    p.add_argument("--methods", metavar="A,B,...", help="comma-separated methods (default all: "
                   + ", ".join(METHODS) + ")")
    p.add_argument("--search-time", type=float, default=60.0, metavar="S",
                   help="seconds to spend finding the smallest feasible budget (default 60)")
    p.add_argument("-o", "--output", default="pareto.png", metavar="FILE.png", help="image to write (default pareto.png)")
    p.set_defaults(handler=run_pareto)


def _add_keys(subparsers: Any) -> None:
    p = subparsers.add_parser("keys", help="make an Ed25519 key pair for signing schedules",
                              description="Write NAME.key (private, mode 0600) and NAME.pub in DIR. "
                                          "Existing files are never overwritten.")
    p.add_argument("--dir", default=".", help="directory for the key files (default .)")
    p.add_argument("--name", default="schedule-signing", help="file name stem (default schedule-signing)")
    p.set_defaults(handler=run_keys)


def _add_verify(subparsers: Any) -> None:
    p = subparsers.add_parser("verify", help="check a schedule's signature, graph and replay",
                              description="Verify SCHEDULE's Ed25519 signature against PUB; with --graph also "
                                          "check it was planned for that graph and replay it in the simulator "
                                          "against its own budgets. Exits 5 when anything fails.")
    p.add_argument("schedule", metavar="SCHEDULE")
    p.add_argument("--key", required=True, metavar="PUB", help="trusted public key (.pub from `poet-edge keys`)")
    p.add_argument("--graph", metavar="GRAPH", help="training graph to check and replay the schedule against")
    p.add_argument("--device", metavar="NAME|FILE.json",
                   help="device profile for the replay (default: the schedule's device, when built in)")
    p.set_defaults(handler=run_verify)


def _add_devices(subparsers: Any) -> None:
    p = subparsers.add_parser("devices", help="list the built-in device profiles",
                              description="List the built-in device profiles usable with --device.")
    p.set_defaults(handler=run_devices)


# -- shared loading ----------------------------------------------------------------
def load_device(spec: str | None) -> DeviceProfile | None:
    """``None``, a built-in profile name, or a profile file (a path that exists or ends in ``.json``)."""
    if spec is None:
        return None
    if spec.lower().endswith(".json") or Path(spec).exists():
        return DeviceProfile.load(spec)
    return DeviceProfile.builtin(spec)


def load_graph(path: str) -> TrainingGraph:
    """Load a training graph file (ours or a POET reference graph)."""
    return TrainingGraph.load(path)


def check_writable(path: str) -> None:
    """Fail before a long solve or sweep, not after it, when ``path`` cannot be written.

    Opens the file for appending (an existing file is left as it is) or
    creates and removes it, so an immutable file, a read-only mount or a
    directory without write permission are found the way the write would
    find them.
    """
    target = Path(path)
    parent = target.resolve().parent
    if not parent.is_dir():
        raise CommandError(f"cannot write {path}: directory {parent} does not exist", ExitCode.BAD_FILE)
    if target.is_dir():
        raise CommandError(f"cannot write {path}: it is a directory; give a file name", ExitCode.BAD_FILE)
    existed = target.exists()
    try:
        with open(target, "ab"):
            pass
    except OSError as exc:
        raise CommandError(f"cannot write {path}: {exc.strerror or exc}", ExitCode.BAD_FILE) from exc
    if not existed:
        target.unlink(missing_ok=True)


def _plan_function(args: argparse.Namespace, graph: TrainingGraph, device: DeviceProfile | None) -> Planner:
    """``plan`` with the graph, device, runtime and solver settings of ``args`` bound."""
    if device is None and (not graph.has_energy or args.count_paging_time or args.read_ahead == "read"):
        need = "has no energy costs to price" if not graph.has_energy else \
            "needs paging times for --count-paging-time" if args.count_paging_time else \
            "needs read times for --read-ahead read"
        raise CommandError(f"{args.graph} {need}: pass --device NAME or --device FILE.json "
                           "(built-in names: `poet-edge devices`)", ExitCode.USAGE)
    return functools.partial(plan, graph, device=device, runtime_budget=args.runtime, solver=args.solver,
                             threads=args.threads, count_paging_time=args.count_paging_time,
                             read_ahead=args.read_ahead or False, training=training_spec(args, graph))


def training_spec(args: argparse.Namespace, graph: TrainingGraph) -> TrainingSpec | None:
    """The whole-step spec the options ask for (``None`` without ``--optimizer``)."""
    if getattr(args, "optimizer", None) is None:
        return None
    if not graph.parameters:
        raise CommandError(f"{args.graph} has no parameter layout, so --optimizer cannot budget its gradients and "
                           "optimizer state: profile the model again with this release (`poet-edge profile`)",
                           ExitCode.USAGE)
    return TrainingSpec.for_optimizer(args.optimizer, momentum=args.momentum, nesterov=args.nesterov,
                                      weight_decay=args.weight_decay, accumulation=args.accumulation, clip=args.clip,
                                      state_paging=not args.no_state_paging)


# -- solve -------------------------------------------------------------------------
def run_solve(args: argparse.Namespace) -> int:
    """``poet-edge solve``: plan, report, and write the (signed) schedule."""
    graph, device = load_graph(args.graph), load_device(args.device)
    method = args.baseline or "poet"
    if method not in METHODS:
        raise UnknownNameError(f"unknown baseline {method!r}; choose one of {', '.join(METHODS[1:])}")
    private_key = _load_signing_key(args.sign)
    check_writable(args.output)
    planner = _plan_function(args, graph, device)
    result = _solve_with_progress(planner, method, args)
    if not result.feasible:
        return _report_unsolved(result, graph, planner, method, args)
    schedule = result.schedule
    if private_key is not None:
        schedule = sign(schedule, private_key)
    size = schedule.save(args.output)
    print_summary(result, schedule, graph, args.output, size)
    if result.message:  # e.g. replanned with read-ahead room because the I/O timeline missed the budget
        print(f"note: {result.message}")
    return ExitCode.OK


def _load_signing_key(path: str | None) -> Ed25519PrivateKey | None:
    if path is None:
        return None

    return load_private_key(path)


def _solve_with_progress(planner: Planner, method: str, args: argparse.Namespace) -> PlanResult:
    label = f"{method} {Path(args.graph).stem} @ {short_bytes(args.memory) if args.memory else 'any memory'}"
    with SolveProgressDisplay(label) as display:
        return planner(memory_budget=args.memory, method=method, time_limit=args.time_limit, gap=args.gap,
                       relax_and_round=args.relax_and_round, progress=display)


def _report_unsolved(result: PlanResult, graph: TrainingGraph, planner: Planner, method: str,
                     args: argparse.Namespace) -> int:
    if result.status != "infeasible":
        raise CommandError(f"no schedule found in {result.solve_seconds:.1f} s (status {result.status}): "
                           "raise --time-limit", ExitCode.SOLVER_FAILED)
    print(f"infeasible: {result.message or 'no schedule within these budgets'} "
          f"(memory {format_bytes(args.memory)}, runtime {_runtime_text(args.runtime)}, method {method})")
    if args.runtime is not None and args.runtime < 1.0:
        print("no memory budget helps: the runtime budget is below one plain step's compute time (1.0)")
    elif args.memory is not None and args.search_time > 0:
        print_smallest_budget(graph, planner, method, args)
    return ExitCode.INFEASIBLE


def print_smallest_budget(graph: TrainingGraph, planner: Planner, method: str, args: argparse.Namespace,
                          suggest: bool = True) -> BudgetSearch:
    """Search for and print the smallest feasible memory budget for ``method``; return the search result."""
    print(f"searching for the smallest feasible memory budget (up to {args.search_time:.0f} s)...",
          file=sys.stderr, flush=True)
    search = smallest_feasible_budget(graph, _probe(planner, method), time_budget_s=args.search_time,
                                      probe_time_limit_s=min(15.0, args.search_time),
                                      training=planner.keywords.get("training"))
    if search.budget is None:
        print(f"no memory budget is feasible for {method}: {search.note}")
    else:
        if search.exact:
            how = "exact" if search.budget <= search.infeasible_below else \
                f"none below {format_bytes(search.infeasible_below)}"
        else:
            how = f"{search.note}; none found below {format_bytes(search.infeasible_below)}"
        print(f"smallest feasible memory budget: {'' if search.exact else 'about '}{format_bytes(search.budget)} "
              f"({how}; {search.probes} solves in {search.seconds:.1f} s)")
        if suggest:
            print(f"  try: --memory {search.budget}")
    return search


def _probe(planner: Planner, method: str, gap: float = 0.5) -> Callable[[int, float | None], PlanResult]:
    """A feasibility probe: any schedule will do, so the MIP gap is loose and the I/O-timeline check (which
    only ever swaps one feasible plan for another) is off."""
    def probe(budget: int, time_limit: float | None) -> PlanResult:
        return planner(memory_budget=budget, method=method, time_limit=time_limit, gap=gap, check_timeline=False)

    return probe


def _runtime_text(runtime: float | None) -> str:
    return "no limit" if runtime is None else f"{runtime:g}x plain step"


def print_summary(result: PlanResult, schedule: Schedule, graph: TrainingGraph, path: str | None,
                  size: int | None) -> None:
    """The result of a solve, one fact a line."""
    sim = result.simulation
    rows = [
        ("status", f"{result.status} ({schedule.solver.method}, {schedule.solver.solver})"),
        ("stopped", STOP_REASON_TEXT.get(result.stop_reason, result.stop_reason or "-")),
        ("objective", _objective_text(result)),
        ("solve time", f"{result.solve_seconds:.2f} s"),
        ("peak / budget", _peak_text(schedule)),
        ("runtime", _runtime_summary(schedule, graph.total_compute_ms + (schedule.step.update_ms if schedule.step else 0))),
        ("energy", f"{schedule.predicted_energy_j:.6g} J (compute {sim.compute_energy_j:.4g}, "
                   f"page-in {sim.pagein_energy_j:.4g}, page-out {sim.pageout_energy_j:.4g})"),
        ("work", f"{sim.recomputed_nodes} recomputes, {short_bytes(sim.bytes_paged_out)} paged out, "
                 f"{short_bytes(sim.bytes_paged_in)} paged in, {len(schedule.instructions)} instructions"),
        ("floor", floor_text(graph)),
    ]
    if schedule.step is not None:
        rows[4:4] = _step_rows(schedule)
    if path is not None:
        signed = f", signed (key {schedule.signature['key_id']})" if schedule.signature else ", unsigned"
        rows.append(("schedule", f"{path} ({size:,} bytes{signed})"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


STOP_REASON_TEXT = {
    "optimal": "proven optimal",
    "gap reached": "the gap asked for (--gap) was proven",
    "time limit": "at the time limit, before the gap asked for was proven: raise --time-limit for a tighter plan",
    "no time for branch and bound": "the LP relaxation left too little of --time-limit for branch and bound; the "
                                    "plan is the rounded relaxation: raise --time-limit for a tighter one",
    "relax and round": "LP relaxation and rounding, as asked (--relax-and-round)",
    "solver stopped early": "the solver stopped before the time limit without proving the gap",
    "infeasible": "no schedule within the budgets",
    "heuristic": "a baseline heuristic: one construction, no search",
}
"""What ``solve`` prints for each :attr:`PlanResult.stop_reason`."""


def _step_rows(schedule: Schedule) -> list[tuple[str, str]]:
    """What a whole-step schedule holds, part by part, and where its optimizer state lives."""
    step = schedule.step
    parts = ", ".join(f"{name} {short_bytes(value)}" for name, value in step.parts().items())
    state = (f"{short_bytes(step.paged_state_bytes)} of {short_bytes(step.paged_state_bytes + step.resident_state_bytes)} "
             f"on flash ({len(step.state_on_flash)} parameters)") if step.paged_state_bytes else "all in RAM"
    return [("training", step.training.describe()), ("parts (peaks)", parts), ("optimizer state", state)]


def _runtime_summary(schedule: Schedule, plain_ms: float) -> str:
    text = f"{schedule.predicted_runtime_ms:,.1f} ms"
    if plain_ms > 0:
        text += f" = {schedule.predicted_runtime_ms / plain_ms:.3f}x plain step"
        if schedule.runtime_budget_ms is not None:
            text += f" (budget {schedule.runtime_budget_ms / plain_ms:g}x)"
    if schedule.step is not None and schedule.step.update_ms:
        text += f"; the optimizer's updates {schedule.step.update_ms:,.1f} ms of it"
    return text


def _objective_text(result: PlanResult) -> str:
    text = f"{result.objective_j:.8g} J"
    if result.gap is not None:
        text += f" (gap {100 * result.gap:.3g}%"
        text += f", bound {result.bound_j:.8g} J)" if result.bound_j is not None else ")"
    return text


def _peak_text(schedule: Schedule) -> str:
    peak = f"{schedule.predicted_peak_bytes:,} B"
    if schedule.memory_budget is None:
        return f"{peak} / unconstrained"
    share = schedule.predicted_peak_bytes / schedule.memory_budget if schedule.memory_budget else 0.0
    return f"{peak} / {schedule.memory_budget:,} B ({100 * share:.1f}%)"


# -- plot --------------------------------------------------------------------------
def run_plot(args: argparse.Namespace) -> int:
    """``poet-edge plot``: draw the timeline and memory panels of a schedule."""
    schedule = load_schedule(args.schedule, args.key)
    graph = load_graph(args.graph)
    schedule.check_graph(graph)
    check_writable(args.output)
    path = plot_timeline(graph, schedule, args.output, title=args.title)
    print(f"wrote {path}")
    return ExitCode.OK


def load_schedule(path: str, key_path: str | None) -> Schedule:

    if key_path is None:
        return Schedule.load(path)

    return Schedule.load(path, public_key=load_public_key(key_path))


# -- pareto ------------------------------------------------------------------------
def run_pareto(args: argparse.Namespace) -> int:
    """``poet-edge pareto``: sweep budgets, print the energy table, plot the curves."""
    graph, device = load_graph(args.graph), load_device(args.device)
    methods = _pareto_methods(args.methods)
    check_writable(args.output)
    planner = _plan_function(args, graph, device)
    high = store_all_peak(graph, planner.keywords.get("training"))
    search = print_smallest_budget(graph, planner, "poet", args, suggest=False)
    if search.budget is None:
        return ExitCode.INFEASIBLE
    budgets = budget_points(search.budget, high, args.points)
    table = _ParetoTable(methods)
    points = sweep(budgets, methods, lambda m: _probe(planner, m, gap=args.gap), time_limit_s=args.time_limit,
                   on_point=table.add)
    title = (f"{graph.model or Path(args.graph).stem}: energy per step vs memory budget "
             f"(runtime {_runtime_text(args.runtime)})")
    path = plot_pareto(points, args.output, title=title, store_all_peak=high)
    print(f"wrote {path}")
    return ExitCode.OK


def _pareto_methods(spec: str | None) -> list[str]:
    if spec is None:
        return list(METHODS)
    methods = [m.strip() for m in spec.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise UnknownNameError(f"unknown method(s) {', '.join(unknown) or '(none given)'}; "
                               f"choose from {', '.join(METHODS)}")
    return methods


class _ParetoTable:
    """Prints one row per budget as soon as every method has been planned at it."""
    def __init__(self, methods: Sequence[str]) -> None:
        self.methods = list(methods)
        self.row: dict[str, SweepPoint] = {}
        self.width = max(11, *(len(m) for m in methods))
        print(f"{'budget':>12}  " + "  ".join(f"{m:>{self.width}}" for m in self.methods))

    def add(self, point: SweepPoint) -> None:
        self.row[point.method] = point
        if len(self.row) == len(self.methods):
            cells = [self._cell(self.row[m]) for m in self.methods]
            print(f"{short_bytes(point.budget):>12}  " + "  ".join(f"{c:>{self.width}}" for c in cells), flush=True)
            self.row = {}

    @staticmethod
    def _cell(point: SweepPoint) -> str:
        if point.energy_j is None:
            return "-" if point.status == "infeasible" else "timeout"
        mark = "*" if point.status == "feasible" and point.method in MILP_METHODS else ""
        return f"{point.energy_j:.5g} J{mark}"


# -- keys, verify, devices -----------------------------------------------------------
def run_keys(args: argparse.Namespace) -> int:
    """``poet-edge keys``: write a new Ed25519 key pair."""
    try:
        private_path, public_path = generate_keypair(args.dir, args.name)
    except FileExistsError as exc:
        raise CommandError(str(exc), ExitCode.BAD_FILE) from exc
    print(f"private key  {private_path}  (keep it secret; sign with `poet-edge solve --sign {private_path}`)")
    print(f"public key   {public_path}  (give it to devices; check with `poet-edge verify --key {public_path}`)")
    return ExitCode.OK


def run_verify(args: argparse.Namespace) -> int:
    """``poet-edge verify``: signature, then (with --graph) graph fingerprint and a replay."""
    schedule = load_schedule(args.schedule, args.key)
    print(f"signature   ok (key {schedule.signature['key_id']})")
    if args.graph is None:
        return ExitCode.OK
    graph = load_graph(args.graph)
    schedule.check_graph(graph)
    print(f"graph       ok ({graph.model or Path(args.graph).stem}, {graph.size} nodes)")
    report = _replay(graph, schedule, load_device(args.device) if args.device else _builtin_or_none(schedule.device))
    energy = f", energy {report.energy_j:.6g} J" if graph.has_energy or report.energy_j else ""
    print(f"replay      ok (peak {format_bytes(report.peak_memory_bytes)} within {format_bytes(schedule.memory_budget)}, "
          f"runtime {report.runtime_ms:,.1f} ms{energy})")
    return ExitCode.OK


def _builtin_or_none(name: str) -> DeviceProfile | None:
    return DeviceProfile.builtin(name) if name in DeviceProfile.builtin_names() else None


def _replay(graph: TrainingGraph, schedule: Schedule, device: DeviceProfile | None) -> SimulationReport:
    """Simulate against the schedule's own budgets, priced and with paging time as it was planned."""
    if device is not None:
        graph = price_graph(graph, device)  # energies the graph already carries are kept
    elif schedule.count_paging_time:
        raise CommandError(f"the schedule counts paging time on device {schedule.device!r}, which is not a "
                           "built-in profile: pass its profile with --device to replay its runtime", ExitCode.USAGE)
    paging = paging_time_ms(graph, device) if device is not None else None
    if schedule.count_paging_time:
        return simulate(graph, schedule, paging_time_ms=paging)
    return simulate(graph, schedule, io_time_ms=paging)  # beside compute: the I/O thread's time must fit


def run_devices(args: argparse.Namespace) -> int:
    """``poet-edge devices``: name and one line for each built-in profile."""
    for name in DeviceProfile.builtin_names():
        profile = DeviceProfile.builtin(name)
        print(f"{name:<18} {profile.description}")
    return ExitCode.OK

