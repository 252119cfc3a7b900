"""``poet-edge simulate``: a fleet of virtual devices of several memory classes, federated and personalized.

::

    poet-edge simulate --devices 20 --rounds 5 --samples 16 --label-alpha 1 --json sim.json --plot sim.png
    poet-edge simulate --personalization all --samples 16,64,256   # strategies side by side, a size sweep
    poet-edge simulate --devices 1000 --fraction 0.02 --availability night --dropout 0.1 --personalization finetune

Each strategy is held against local-only training, the global model alone and centralized training on the
pooled data (:mod:`simulation.compare`).  Registered in the ``poet_edge.commands`` entry-point group; cheap
to import.  The
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
from agent.federated.virtual import STDLIB_TEXT
from common.cli import positive_int
from common.errors import CommandError
from common.exit_codes import ExitCode
from simulation.fleet import DEFAULT_DATA, parse_classes

def add_commands(subparsers: Any) -> None:
    """Register ``simulate``."""
    from common.runconfig import AVAILABILITY

    p = subparsers.add_parser("simulate", help="federate a fleet of virtual devices with Flower (digits)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=positive_int, default=20, help="virtual devices (default 20)")
    p.add_argument("--classes", type=parse_classes, metavar="PROFILE:FRACTION,...",
                   help="device classes: a built-in profile and the memory budget as a fraction of a plain "
                        "step's whole memory (default rpi4:0.55,rpi5:0.7,jetson-orin-nano:1)")
    p.add_argument("--rounds", type=positive_int, default=5, help="federated rounds (default 5)")
    p.add_argument("--local-steps", type=positive_int, default=10, help="steps per device per round (default 10)")
    p.add_argument("--finetune-steps", type=int, default=30, help="personalization steps per device (default 30)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    p.add_argument("--personalization", type=_strategies, default=("finetune",), metavar="STRATEGY,...",
                   help="strategies to compare, each in a run of its own: finetune (FedAvg, then local "
                        "fine-tuning), fedper (heads stay on the devices), fedbn (BatchNorm stays on the devices), "
                        "ditto (a personal model trained beside the global one each round, pulled towards it), "
                        "biases-norms (FedAvg, then only biases and norms fine-tuned: no gradients or optimizer "
                        "state for the other weights), or all (default finetune; finetune always runs: its global "
                        "model is the global baseline)")
    p.add_argument("--ditto-lambda", type=float, default=0.1, metavar="LAMBDA",
                   help="ditto: how strongly each personal model is pulled towards the global one (default 0.1)")
    p.add_argument("--dataset", metavar="DIR", default="",
                   help="train on this data set, a directory Hugging Face datasets' save_to_disk wrote (FEMNIST, "
                        "CIFAR-10, ...; nothing is downloaded), instead of the shipped digits")
    p.add_argument("--label-column", metavar="NAME", default="",
                   help="the data set's label column (default: its one ClassLabel column)")
    p.add_argument("--partition-by", metavar="COLUMN", default="",
                   help="natural partitions: each device is one value of this column of the data set (FEMNIST's "
                        "writer_id), tested on its own held-out images; samples and label skew then stay 0")
    p.add_argument("--samples", type=_sizes, metavar="N,...",
                   help=f"training images per device (default {DEFAULT_DATA.samples}, 0 with --partition-by; 0: "
                        "each device a whole partition of the training pool); several sizes make a sweep")
    p.add_argument("--label-alpha", type=float,
                   help="Dirichlet label skew across devices, smaller is more skewed (default "
                        f"{DEFAULT_DATA.label_alpha:g}, 0 with --partition-by; 0: every device the natural mix)")
    p.add_argument("--quantity-skew", type=float, default=0.0, metavar="SIGMA",
                   help="spread of the devices' training-set sizes: a log-normal draw with SIGMA whose mean is "
                        "the samples (default 0: all equal)")
    p.add_argument("--viewpoints", type=float, metavar="DEGREES",
                   help=f"the devices' camera angles spread over this many degrees (default "
                        f"{DEFAULT_DATA.viewpoints:g} for the digits, 0 for a --dataset; 360: all the way round)")
    p.add_argument("--viewpoint-centre", type=float, default=0.0, metavar="DEGREES",
                   help="the angle the devices' viewpoints spread about (default 0: upright, as the vendor's "
                        "pretraining digits; 90: every camera on its side, a shift the whole fleet shares)")
    p.add_argument("--fraction", type=float, default=1.0,
                   help="share of the devices sampled (by the seed) to train and evaluate each round (default 1)")
    p.add_argument("--min-devices", type=positive_int, default=2, help="the fewest a round samples (default 2)")
    p.add_argument("--availability", choices=AVAILABILITY, default="always",
                   help="always, or night: a device trains only while charging 22:00-07:00 in its own time zone "
                        "(time zones spread round the clock; rounds --round-hours apart)")
    p.add_argument("--round-hours", type=float, default=1.0, help="simulated hours between rounds (default 1)")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="chance that an available device is unplugged partway through a round (default 0)")
    p.add_argument("--straggle", type=float, default=0.0,
                   help="chance that an available device finishes only part of its steps in time (default 0)")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--pretrain", type=int, default=0, metavar="STEPS",
                       help="start from a vendor's model: the fleet's model trained STEPS steps on the digits no "
                            "device holds, upright, before the run (each seed its own; kept in the profile cache "
                            "as .safetensors, for `poet-edge server versions import`); default 0: seeded weights")
    start.add_argument("--initial-weights", type=Path, metavar="FILE",
                       help="start every run from these weights (.safetensors, .npz or .pt of the fleet's model, "
                            "such as `poet-edge server versions export latest --out FILE` writes)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, split, batches and sampling (default 0)")
    p.add_argument("--seeds", type=positive_int, default=3,
                   help="runs, with seeds SEED, SEED+1, ...: the figures are their mean with a 95%% confidence "
                        "interval (default 3)")
    p.add_argument("--cpus-per-device", type=positive_int, default=1, metavar="N",
                   help="cores Ray reserves for each virtual device; devices train at once = cores / N (default 1)")
    p.add_argument("--database", metavar="URL", default="",
                   help="record the rounds in this server database (default: a temporary SQLite file)")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the per-round and per-device figures")
    p.add_argument("--plot", type=Path, metavar="PNG", help="draw accuracy, memory and energy (the first run)")
    p.set_defaults(handler=run_simulate)


def _strategies(text: str) -> tuple[str, ...]:
    from simulation.compare import STRATEGIES, strategies_in_order

    chosen = [s.strip() for s in text.split(",") if s.strip()]
    if chosen == ["all"]:
        chosen = list(STRATEGIES)
    unknown = [s for s in chosen if s not in STRATEGIES]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown) or text!r}: choose from {', '.join(STRATEGIES)} or all")
    return strategies_in_order(chosen)


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of whole numbers") from exc
    if not sizes or min(sizes) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: digits per device are 0 (a whole partition) or more")
    return sizes


def _or(value: Any, default: Any) -> Any:
    """An option's value, or its default where it was not given."""
    return default if value is None else value


def _share(data: Any) -> str:
    """What each device trains on, for the progress lines."""
    if data.dataset == STDLIB_TEXT:
        return f"{data.samples or 'all'} windows of one standard-library package's source per device"
    if data.partition_by:
        return f"each device one {data.partition_by}'s images of {Path(data.dataset).name}"
    what = f"{Path(data.dataset).name} images" if data.dataset else "digits"
    return f"{data.samples or 'a partition of'} {what} per device"


def _vendor(args: argparse.Namespace, data: Any, seed: int) -> Path:
    """The vendor's model for this fleet and seed (:mod:`agent.vendor`), pretrained once and kept in the
    profile cache: a function of the fleet, the seed, the steps and the learning rate."""
    import hashlib

    import torch

    from agent.vendor import pretrain
    from simulation.profile import profile_cache, profile_once

    what = repr((args.devices, data, seed, args.pretrain, args.lr, torch.__version__))
    kind = "text" if data.dataset == STDLIB_TEXT else "images"
    path = profile_cache() / "vendor" / f"{kind}-{hashlib.sha256(what.encode()).hexdigest()[:16]}.safetensors"
    if not path.is_file():
        # the vendor trains the whole model: the profile of the devices' (an adapters' one for text) is not its
        graph = None if data.dataset == STDLIB_TEXT else profile_once(seed, dataset=data.dataset,
                                                                       label_column=data.label_column)
        vendor = pretrain(args.devices, data, seed, args.pretrain, args.lr, path, graph)
        print(f"-- {vendor.describe()}", flush=True)
    else:
        print(f"-- pretrained by the vendor ({args.pretrain} steps on {kind} no device holds): {path}", flush=True)
    return path


def run_simulate(args: argparse.Namespace) -> int:
    """Run the comparison for each size and seed, print the figures, write JSON and the plot when asked."""
    from agent.digits import BATCH_SIZE, device_dataset, fleet_workload, vendor_dataset
    from agent.errors import DataError, WeightsError
    from agent.federated.virtual import FleetData
    from common.errors import RunConfigError
    from simulation.compare import SeedRuns, Sweep, compare
    from simulation.fleet import DEFAULT_CLASSES
    from simulation.report import plot_report
    from simulation.run import SimulationSettings

    natural = args.partition_by or args.dataset == STDLIB_TEXT  # split by writer or package: no label skew
    datas = [FleetData(n, _or(args.label_alpha, 0.0 if natural else DEFAULT_DATA.label_alpha),
                       _or(args.viewpoints, 0.0 if args.dataset else DEFAULT_DATA.viewpoints),
                       quantity_skew=args.quantity_skew, dataset=args.dataset, label_column=args.label_column,
                       partition_by=args.partition_by, viewpoint_centre=args.viewpoint_centre)
             for n in _or(args.samples, (0,) if args.partition_by else (DEFAULT_DATA.samples,))]
    settings = SimulationSettings(args.devices, args.classes or DEFAULT_CLASSES, args.rounds, args.local_steps,
                                  args.finetune_steps, args.lr, args.personalization[0], datas[0], args.seed,
                                  args.database, args.cpus_per_device, args.fraction, args.min_devices,
                                  args.availability, args.round_hours, args.dropout, args.straggle,
                                  ditto_lambda=args.ditto_lambda)
    if args.pretrain < 0:
        raise CommandError(f"--pretrain takes 0 steps or more, got {args.pretrain}", ExitCode.USAGE)
    if args.initial_weights is not None:
        settings = replace(settings, initial_weights=str(args.initial_weights.resolve()))
    try:
        for data in datas:  # every value checked before anything starts
            data.check(args.devices, BATCH_SIZE)
            replace(settings, data=data).run_config("")
            if data.dataset:  # readable, with images for every device (the digits always have them)
                device_dataset(args.devices - 1, args.devices, data=data, seed=args.seed)
            if args.pretrain:  # images left to pretrain on
                vendor_dataset(args.devices, data=data, seed=args.seed)
            if settings.initial_weights:  # weights of this fleet's model
                fleet_workload(data, args.seed, initial_weights=settings.initial_weights)
    except (FederationError, RunConfigError, DataError, WeightsError) as exc:
        raise CommandError(str(exc), ExitCode.USAGE) from exc
    setups = []
    for data in datas:
        comparisons = []
        for seed in range(args.seed, args.seed + args.seeds):
            print(f"== {_share(data)}, seed {seed} ({seed - args.seed + 1} of {args.seeds})", flush=True)
            run = replace(settings, data=data, seed=seed)
            if args.pretrain:
                run = replace(run, initial_weights=str(_vendor(args, data, seed)))
            comparisons.append(compare(run, args.personalization, sys.stdout))
            comparisons[-1].print(sys.stdout)
        setups.append(SeedRuns(data.samples, comparisons))
        setups[-1].print(sys.stdout)
    sweep = Sweep(setups)
    if len(setups) > 1:
        sweep.print(sys.stdout)
    if args.json:
        sweep.save_json(args.json)
    if args.plot:
        plot_report(setups[0].comparisons[0].baseline_run, args.plot)
    return 0
