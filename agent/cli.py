"""``poet-edge profile`` and ``poet-edge validate``: measure this machine, then hold a schedule to it.

::

    poet-edge profile  --model resnet18 --input 32x3x64x64 --swap-dir /mnt/sd/swap \\
                       -o graph.json --device-out device.json
    poet-edge solve    graph.json --device device.json --memory 40MB -o schedule.json
    poet-edge validate --model resnet18 --input 32x3x64x64 --schedule schedule.json --graph graph.json \\
                       --device device.json --swap-dir /mnt/sd/swap --steps 5 --plot memory.png

Registered in the ``poet_edge.commands`` entry-point group (see
:mod:`common.cli`); errors exit with their own codes
(:mod:`common.exit_codes`).  This module imports neither torch nor the model zoo: the
handlers do, so ``poet-edge --help`` stays fast.  Both commands make glibc
keep large blocks on mmap (:func:`engine.rss.return_freed_memory`)
before measuring, so a profile's times and a validation's are taken under the
same allocator and a step's peak RSS is honest.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator, TextIO

from agent.zoo_names import ZOO_INPUTS
from common.cli import positive_int
from schedules.cli import check_writable, load_device, load_schedule
from common.errors import CommandError
from common.exit_codes import ExitCode


def add_commands(subparsers: Any) -> None:
    """Register ``profile`` and ``validate``."""
    _add_profile(subparsers)
    _add_validate(subparsers)


def _add_model_options(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", metavar="NAME",
                       help=f"zoo model: {', '.join(ZOO_INPUTS)}")
    which.add_argument("--module", metavar="PKG.MOD:FACTORY",
                       help="your own model: FACTORY() returns an nn.Module or an engine.workload.Workload")
    p.add_argument("--input", metavar="SHAPE", help="batch shape, batch first: 32x3x64x64, or 8x128 for bert "
                                                   "(default: the zoo model's)")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and batch (default 0)")
    p.add_argument("--max-nodes", type=positive_int, metavar="N",
                   help="merge cheap segments until the graph has at most N nodes; the model, --input, --seed and "
                        "--max-nodes of profile and validate must be the same for the graph to match")
    p.add_argument("--threads", type=positive_int, metavar="N", help="torch compute threads (default torch's)")
    p.add_argument("--chunked-loss", action="store_true",
                   help="language models: compute the next-token loss a few tokens at a time, never holding all "
                        "the logits (for large vocabularies). NOT bit-identical to plain cross-entropy: the same "
                        "math summed in another order; the model's name in the graph says '(chunked loss)'. "
                        "Give it to profile and validate alike")


def _add_meter_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--meter", choices=("auto", "ina3221", "rapl", "serial", "estimate"), default="auto",
                   help="energy meter (default auto: INA3221, RAPL, a serial meter if --serial-url, else estimate)")
    p.add_argument("--serial-url", metavar="PORT", help="serial power meter port, e.g. /dev/rfcomm0")
    p.add_argument("--serial-protocol", default="UM25C", metavar="P", help="UM24C, UM25C, UM34C or csv (default UM25C)")


def _add_profile(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "profile", help="measure a model's training graph and this machine's costs",
        description="Measure on this machine: every node's compute time (warm-up, then the median of repeated "
                    "runs) and bytes; page-out and page-in bandwidth and latency of the swap directory at the "
                    "graph's page sizes (through the executor's page files, cache dropped); whether paging "
                    "overlaps compute; idle, compute and paging power from the best energy meter, else "
                    "estimates. Writes a priced training graph and a device profile for `poet-edge solve`.")
    _add_model_options(p)
    p.add_argument("--swap-dir", required=True, metavar="PATH", help="directory on the flash/SD the executor pages to")
    p.add_argument("-o", "--output", default="graph.json", metavar="FILE", help="training graph (default graph.json)")
    p.add_argument("--device-out", default="device.json", metavar="FILE",
                   help="device profile (default device.json)")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed runs per node after a warm-up (default 5)")
    p.add_argument("--no-refine", dest="refine", action="store_false",
                   help="keep the default cut: do not cut finer where the activation floor is set (faster to "
                        "profile and to solve, a higher floor)")
    p.add_argument("--power-like", metavar="NAME|FILE.json",
                   help="without a meter, take nominal powers from this device profile (e.g. rpi4) instead of "
                        "a generic host estimate")
    _add_meter_options(p)
    p.set_defaults(handler=run_profile)


def _add_validate(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "validate", help="run a schedule on its model and compare predictions with measurements",
        description="Run SCHEDULE on the model for --steps steps (after --warmup) and print predicted against "
                    "measured step time, peak bytes (ledger and RSS), bytes paged and energy in total and per "
                    "node class (compute, page-in, page-out; from a meter, else the device profile's nominal "
                    "powers, labelled as an estimate), each with the error in percent; optionally plot resident "
                    "memory over the step.")
    _add_model_options(p)
    p.add_argument("--schedule", required=True, metavar="FILE", help="schedule from `poet-edge solve`")
    p.add_argument("--graph", required=True, metavar="FILE", help="the graph the schedule was planned for")
    p.add_argument("--device", metavar="NAME|FILE.json",
                   help="device profile to predict with (paging overlap, powers); default the schedule's device "
                        "when built in")
    p.add_argument("--key", metavar="PUB", help="refuse the schedule unless signed by this public key")
    p.add_argument("--swap-dir", metavar="PATH", help="directory the executor pages to (needed when it pages)")
    p.add_argument("--steps", type=positive_int, default=3, help="measured steps (default 3)")
    p.add_argument("--warmup", type=int, default=1, metavar="N", help="steps run first, not measured (default 1)")
    p.add_argument("--plot", metavar="FILE.png", help="plot predicted vs measured resident memory over the step")
    p.add_argument("--check-exact", action="store_true",
                   help="first run one step against plain loss.backward() on a copy of the model and require the "
                        "loss, gradients, buffers and RNG state to be identical bit for bit (exit 6 otherwise)")
    _add_meter_options(p)
    p.set_defaults(handler=run_validate)


# -- profile -----------------------------------------------------------------------------
DEVICE_MODULES = ("torch", "crc32c")
"""What ``profile`` and ``validate`` need beyond the planner: the ``device`` extra."""


def require_device_extra(command: str) -> None:
    """Refuse ``command`` with what to install when the device extra is missing (a server's install)."""
    missing = [name for name in DEVICE_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise CommandError(f"poet-edge {command} runs the model on this machine and needs {', '.join(missing)}: "
                           "pip install 'poet-edge[device]'", ExitCode.USAGE)


def run_profile(args: argparse.Namespace) -> int:
    """``poet-edge profile``: measure, write the graph and device profile, print the figures and sources."""
    require_device_extra("profile")
    for path in (args.output, args.device_out):
        check_writable(path)
    estimate_device = load_device(args.power_like) if args.power_like else None
    workload = _workload(args)
    from engine.profile import device_estimate, profile_workload

    estimate = device_estimate(estimate_device) if estimate_device is not None else None
    with StageProgress(f"profile {workload.name}") as progress:
        profile, _ = profile_workload(
            workload.model, workload.example, workload.loss_fn, args.swap_dir, name=workload.name,
            repeats=args.repeats, max_nodes=args.max_nodes, segments=workload.segments,
            meter_config=_meter_config(args), estimate=estimate, progress=progress, refine=args.refine)
    profile.graph.save(args.output)
    profile.device.save(args.device_out)
    width = max(len(row[0]) for row in profile.summary())
    for figure, value, source in profile.summary():
        print(f"{figure:<{width}}  {value:<28}  {source}")
    print(f"wrote {args.output} ({profile.graph.size} nodes) and {args.device_out} ({profile.device.name})")
    print(f"next: poet-edge solve {args.output} --device {args.device_out} --memory SIZE")
    return ExitCode.OK


def _workload(args: argparse.Namespace) -> Any:
    """Set up torch as asked and build the workload."""
    import torch

    from engine.rss import return_freed_memory
    from agent.zoo import load_workload, parse_shape

    return_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = parse_shape(args.input) if args.input else None
    return load_workload(args.model or args.module, shape, seed=args.seed, chunked_loss=args.chunked_loss)


def _meter_config(args: argparse.Namespace) -> Any:
    from engine.energy import MeterConfig

    return MeterConfig(kind=args.meter, serial_url=args.serial_url, serial_protocol=args.serial_protocol)


# -- validate ----------------------------------------------------------------------------
def run_validate(args: argparse.Namespace) -> int:
    """``poet-edge validate``: run the schedule, print predicted vs measured, plot memory."""
    require_device_extra("validate")
    from schedules.device import DeviceProfile
    from schedules.graph import TrainingGraph

    schedule = load_schedule(args.schedule, args.key)
    graph = TrainingGraph.load(args.graph)
    schedule.check_graph(graph)
    device = load_device(args.device) if args.device else (
        DeviceProfile.builtin(schedule.device) if schedule.device in DeviceProfile.builtin_names() else None)
    if args.plot:
        check_writable(args.plot)
    workload = _workload(args)
    from engine.extract import segments_matching

    segments = segments_matching(workload, graph, args.max_nodes, source=args.graph)
    from engine.validate import plot_memory, validate

    with _meter(args, device) as meter:
        report = validate(workload, graph, segments, schedule, swap_dir=args.swap_dir, steps=args.steps,
                          warmup=args.warmup, device=device, meter=meter, parity=args.check_exact)
    print(f"{workload.name}: {args.steps} steps after {args.warmup} warm-up, schedule {args.schedule} "
          f"({schedule.solver.method}, budget {_mb(schedule.memory_budget)})")
    print(report.table())
    if args.plot:
        print(f"wrote {plot_memory(report, args.plot, title=f'{workload.name}: resident memory over one step')}")
    if report.parity is not None and not report.parity.exact:
        raise CommandError(f"the executor's step is not exact: {report.parity.summary()}", ExitCode.NOT_EXACT)
    return ExitCode.OK


def _mb(value: int | None) -> str:
    return "unconstrained" if value is None else f"{value / 1e6:,.2f} MB"


@contextmanager
def _meter(args: argparse.Namespace, device: Any) -> Iterator[Any]:
    """The best meter found, else the estimate from ``device``'s nominal powers, else ``None`` (no energy rows).

    The estimate is labelled as one in the report; ``--meter estimate`` asks for it outright.
    """
    from engine.energy import EnergyMeterError, detect_meter
    from engine.profile import device_estimate

    powers = device_estimate(device).powers if device is not None else None
    try:
        detection = detect_meter(_meter_config(args), powers=powers)
    except EnergyMeterError:
        if args.meter != "auto":
            raise  # the meter asked for by name is not there: say so (exit 8)
        yield None
        return
    with detection.meter as meter:
        yield meter


# -- progress --------------------------------------------------------------------------
class StageProgress:
    """Progress of a multi-stage measurement: a live bar on a terminal, plain lines elsewhere.

    Used as the ``progress(stage, done, total)`` callback of
    :func:`engine.profile.profile_workload`.
    """

    def __init__(self, label: str, stream: TextIO | None = None, live: bool | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.live = _isatty(self.stream) if live is None else live
        self.started = time.monotonic()
        self._bar: Any = None
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> "StageProgress":
        self.started = time.monotonic()
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=Console(file=self.stream), transient=True)
            self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
            self._bar = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self._bar is None:
            if done in (0, total):
                state = "done" if done == total else "..."
                print(f"{self.label}: {stage} {state} ({time.monotonic() - self.started:.1f} s)",
                      file=self.stream, flush=True)
            return
        if stage not in self._tasks:
            self._tasks[stage] = self._bar.add_task(f"{self.label}: {stage}", total=total)
        self._bar.update(self._tasks[stage], completed=done, total=total)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
