"""Fleet-size benchmark: time per federated round against the number of virtual devices, in one run.

Each fleet size runs ``poet-edge simulate`` (one seed, as a program: a user's command) in Flower's
simulation engine with the same number of devices sampled per round (``--per-round``, default 20), so the
rows differ only in the fleet the server and the engine hold: the devices asked their names once (the
seeded sampler), the partition of the data over the fleet (grown by augmentation where the fleet needs more
digits than the data set has), and the engine's bookkeeping of every virtual SuperNode.  No fine-tuning
steps: after the rounds every device only evaluates the global model (and its local-only baseline, the few
steps it trained), which the whole run's time includes.

Printed side by side: devices, devices per round, the first round (starting the engine and learning the
devices' names included), the mean of the later rounds, that mean against the smallest fleet's, the whole
Flower run, and the whole command (profiling and the centralized reference included).  Run
``python -m benchmarks.fleet_scale`` (sizes 100, 300, 1000: about 10 minutes on 2 cores; ``--sizes 20,1000``
to choose).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Run each fleet size, print the table, write ``--json`` when asked."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,300,1000", help="fleet sizes (default 100,300,1000)")
    parser.add_argument("--per-round", type=int, default=20, help="devices sampled per round (default 20)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per fleet (default 4)")
    parser.add_argument("--json", type=Path, help="write the figures")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="poet-fleet-scale-") as scratch:
        for devices in (int(s) for s in args.sizes.split(",")):
            print(f"-- {devices} devices, {args.per_round} per round", flush=True)
            out = Path(scratch) / f"{devices}.json"
            started = time.perf_counter()
            subprocess.run([str(Path(sys.executable).parent / "poet-edge"), "simulate", "--devices", str(devices),
                            "--fraction", repr(min(1.0, args.per_round / devices)), "--min-devices",
                            str(args.per_round), "--rounds", str(args.rounds), "--finetune-steps", "0",
                            "--seeds", "1", "--json", str(out)], check=True, stdout=subprocess.DEVNULL)
            run = json.loads(out.read_text())["setups"][0]["seeds"][0]["runs"]["finetune"]
            rounds = run["rounds"]
            rows.append({"devices": devices, "per_round": rounds[0]["trained"] + rounds[0]["absent"],
                         "first_round_s": rounds[0]["seconds"], "round_s": run["seconds_per_round"],
                         "run_s": run["seconds"], "command_s": time.perf_counter() - started,
                         "global_accuracy": rounds[-1]["global_accuracy"]})
    base = rows[0]["round_s"]
    print(f"\n{'devices':>8} {'per round':>9} {'first round s':>13} {'round s':>8} {'x smallest':>10} "
          f"{'run s':>7} {'command s':>9}")
    for r in rows:
        print(f"{r['devices']:>8} {r['per_round']:>9} {r['first_round_s']:>13.1f} {r['round_s']:>8.2f} "
              f"{r['round_s'] / base:>10.2f} {r['run_s']:>7.1f} {r['command_s']:>9.1f}")
    if args.json:
        args.json.write_text(json.dumps({"format": "poet-edge/fleet-scale", "version": 1, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
