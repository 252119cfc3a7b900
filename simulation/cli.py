"""``poet-edge simulate``: a fleet of virtual devices of several memory classes, federated and personalized.

::

    poet-edge simulate --devices 20 --rounds 5 --samples 16 --label-alpha 1 --json sim.json --plot sim.png

Registered in the ``poet_edge.commands`` entry-point group; cheap to import.  The
run happens in Flower's simulation engine (:mod:`simulation.engine`; needs
``pip install 'poet-edge[sim]'``, which brings Ray).  Exit 0 when the run completes, whether or
not the printed targets are met.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.errors import FederationError
from schedules.cli import positive_int
from schedules.errors import CommandError
from schedules.exit_codes import ExitCode
from simulation.fleet import DEFAULT_DATA, parse_classes

PERSONALIZATIONS = ("none", "finetune", "fedper", "fedbn")


def add_commands(subparsers: Any) -> None:
    """Register ``simulate``."""
    p = subparsers.add_parser("simulate", help="federate a fleet of virtual devices with Flower (digits)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=positive_int, default=20, help="virtual devices (default 20)")
    p.add_argument("--classes", type=parse_classes, metavar="PROFILE:FRACTION,...",
                   help="device classes: a built-in profile and the memory budget as a fraction of a plain "
                        "step's whole memory (default rpi4:0.5,rpi5:0.7,jetson-orin-nano:1)")
    p.add_argument("--rounds", type=positive_int, default=5, help="federated rounds (default 5)")
    p.add_argument("--local-steps", type=positive_int, default=10, help="steps per device per round (default 10)")
    p.add_argument("--finetune-steps", type=int, default=30, help="personalization steps per device (default 30)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    p.add_argument("--personalization", choices=PERSONALIZATIONS, default="finetune",
                   help="finetune: FedAvg then local fine-tuning; fedper: heads stay on the devices; fedbn: "
                        "BatchNorm stays on the devices; none (default finetune)")
    p.add_argument("--samples", type=int, default=DEFAULT_DATA.samples,
                   help=f"training digits per device (default {DEFAULT_DATA.samples}; 0: each device a whole "
                        "partition of the training pool)")
    p.add_argument("--label-alpha", type=float, default=DEFAULT_DATA.label_alpha,
                   help="Dirichlet label skew across devices, smaller is more skewed (default "
                        f"{DEFAULT_DATA.label_alpha:g}; 0: every device the natural mix)")
    p.add_argument("--viewpoints", type=float, default=DEFAULT_DATA.viewpoints, metavar="DEGREES",
                   help=f"the devices' camera angles spread over this many degrees (default "
                        f"{DEFAULT_DATA.viewpoints:g}; 360: all the way round)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, split and batches (default 0)")
    p.add_argument("--seeds", type=positive_int, default=3,
                   help="runs, with seeds SEED, SEED+1, ...: the figures are their mean with a 95%% confidence "
                        "interval (default 3)")
    p.add_argument("--cpus-per-device", type=positive_int, default=1, metavar="N",
                   help="cores Ray reserves for each virtual device; devices train at once = cores / N (default 1)")
    p.add_argument("--database", metavar="URL", default="",
                   help="record the rounds in this server database (default: a temporary SQLite file)")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the per-round and per-device figures")
    p.add_argument("--plot", type=Path, metavar="PNG", help="draw accuracy, memory and energy")
    p.set_defaults(handler=run_simulate)


def run_simulate(args: argparse.Namespace) -> int:
    """Run the simulation, print the figures, write JSON and the plot when asked."""
    from agent.digits import BATCH_SIZE
    from agent.virtual import FleetData
    from simulation.fleet import DEFAULT_CLASSES
    from simulation.report import SeedRuns, plot_report, print_report
    from simulation.run import SimulationSettings, simulate

    data = FleetData(args.samples, args.label_alpha, args.viewpoints)
    try:
        data.check(args.devices, BATCH_SIZE)
    except FederationError as exc:
        raise CommandError(str(exc), ExitCode.USAGE) from exc
    settings = SimulationSettings(args.devices, args.classes or DEFAULT_CLASSES, args.rounds, args.local_steps,
                                  args.finetune_steps, args.lr, args.personalization, data, args.seed,
                                  args.database, args.cpus_per_device)
    reports = []
    for seed in range(args.seed, args.seed + args.seeds):
        if args.seeds > 1:
            print(f"== seed {seed} ({seed - args.seed + 1} of {args.seeds})", flush=True)
        reports.append(simulate(replace(settings, seed=seed)))
        print_report(reports[-1], sys.stdout)
    runs = SeedRuns(reports)
    if args.seeds > 1:
        runs.print(sys.stdout)
    if args.json:
        runs.save_json(args.json)
    if args.plot:
        plot_report(reports[0], args.plot)
    return 0
