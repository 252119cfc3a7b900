"""Flower's cost per round on a device: cold ClientApps (a fresh process per message) against the warm runner.

    python -m benchmarks.flower_overhead [--devices 2 --rounds 4 --local-steps 20]

Runs the same federation twice on a real deployment on 127.0.0.1 (the server's
SuperLink with TLS and SuperNode authentication, ``--devices`` agents on fake
sysfs trees training the digits model under their own budgets; demo.flower_fleet):
first with ``[flower] warm_clientapps = false`` (Flower starts ``flwr-clientapp``
for each message: Python, Flower, torch, the agent's model and data), then with
the warm runner (each ClientApp forked ready-loaded).  Each reply's
``startup-seconds`` is the time from the ClientApp's launch to its handler:
what Flower costs the device per message before the work starts.  A round is
two messages per device (train, evaluate); the target is at most 1 s per round
per device, training excluded.

Of a warm ClientApp's start-up, most is Flower's transfer of the message (the
weights) from the SuperLink to the SuperNode, which the runner waits for before
forking (its log says how long, per ClientApp): a cold ClientApp pays it too,
hidden behind its imports.  The benchmark prints that share and the start-up
beyond it.

Also printed: the mean wall time of a round beyond its longest training, which
includes Flower's fixed polling (an idle SuperNode asks the SuperLink for
messages every 3 s; the ServerApp collects replies every 3 s) that neither
mode changes; and the warm runner's resident memory per device.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from agent.federated.runner import FORKED_AFTER
from demo.flower_fleet import PLAIN_PEAK_BYTES, Fleet, run_id_of, wait_for
from engine.training import DEFAULT_TOLERANCE_BYTES as MEMORY_TOLERANCE_BYTES  # what the memory check allows

TARGET_SECONDS_PER_ROUND = 1.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flower_overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=2, help="agents in the deployment (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=4, help="federated rounds per mode (default: %(default)s)")
    parser.add_argument("--local-steps", type=int, default=20, help="training steps per device per round")
    args = parser.parse_args(argv)
    budgets = {f"pi-{i}": f"{int(PLAIN_PEAK_BYTES * (0.88 + 0.12 * i / max(args.devices - 1, 1)))}B"
               for i in range(args.devices)}
    results = {}
    with tempfile.TemporaryDirectory(prefix="poet-flower-bench-", dir="/var/tmp") as tmp:
        for mode in ("cold", "warm"):
            print(f"== {mode}: {args.devices} devices, {args.rounds} rounds of {args.local_steps} steps ...", flush=True)
            results[mode] = measure(Path(tmp) / mode, budgets, mode == "warm", args)
    report(results, args)
    return 0


def measure(root: Path, budgets: dict[str, str], warm: bool, args: argparse.Namespace) -> dict[str, Any]:
    """One federation on a fresh deployment; the figures of its rows."""
    root.mkdir(parents=True)
    fleet = Fleet(root, budgets, warm=warm)
    try:
        fleet.start()
        for name in fleet.names:
            done = fleet.register(name)
            if done.returncode:
                raise SystemExit(f"cannot register {name}: {done.stderr}")
            fleet.start_agent(name)
        fleet.wait_online(180)
        runner_mb = _runner_rss_mb(fleet) if warm else None
        output = root / "federate.log"
        started = time.monotonic()
        federate = fleet.federate(output, "--rounds", str(args.rounds), "--min-nodes", str(args.devices),
                                  "--local-steps", str(args.local_steps), "--personalization", "none",
                                  "--round-timeout", "300")
        wait_for(lambda: federate.poll() is not None, 300 * (args.rounds + 1), "the federated run")
        wall = time.monotonic() - started
        if federate.returncode:
            raise SystemExit(f"poet-edge server federate failed:\n{output.read_text()}")
        rows = [r for r in fleet.rows(run_id_of(output)) if "error" not in r.metrics]
        arrivals = [_arrivals(fleet.flower_file(name, "clientapps.log")) for name in fleet.names] if warm else []
    finally:
        fleet.close()
    startups = [r.metrics["startup-seconds"] for r in rows]
    per_round = {}
    for r in rows:
        per_round[(r.round, r.device_name)] = per_round.get((r.round, r.device_name), 0.0) + r.metrics["startup-seconds"]
    train_at = {r.round: r.recorded_at for r in rows if r.phase == "train"}
    training = {rnd: max(r.metrics["seconds"] for r in rows if r.phase == "train" and r.round == rnd)
                for rnd in train_at}
    beyond = [train_at[rnd] - train_at[rnd - 1] - training[rnd] for rnd in sorted(train_at) if rnd - 1 in train_at]
    return {"startups": startups, "per_round": list(per_round.values()), "beyond": beyond, "wall": wall,
            "runner_mb": runner_mb, "arrivals": [seconds for device in arrivals for seconds in device], "peaks_ok": all(r.metrics["peak-bytes"] <= r.metrics["budget-bytes"] + MEMORY_TOLERANCE_BYTES
                                                    for r in rows if r.phase == "train")}


def _arrivals(runner_log: Path) -> list[float]:
    """Seconds from each ClientApp's launch to its fork (the message's arrival), from the warm runner's log."""
    found = re.findall(rf"forked ([0-9.]+) s after its launch \({re.escape(FORKED_AFTER)}\)",
                       runner_log.read_text(errors="replace"))
    return [float(seconds) for seconds in found]


def _runner_rss_mb(fleet: Fleet) -> float:
    """The warm runners' mean resident memory, MB (one per device)."""
    import psutil

    sizes = []
    for name in fleet.names:
        for process in psutil.Process(fleet.agents[name].pid).children(recursive=True):
            try:
                if "agent.federated.runner" in " ".join(process.cmdline()):
                    sizes.append(process.memory_info().rss / 1e6)
            except psutil.Error:
                pass
    return statistics.mean(sizes) if sizes else float("nan")


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    cold, warm = results["cold"], results["warm"]

    def row(label: str, a: float, b: float, unit: str = "s") -> None:
        ratio = a / b if b else float("inf")
        print(f"{label:<48} {a:>9.3f} {unit:<2} {b:>9.3f} {unit:<2} {ratio:>7.1f}x")

    print(f"\n{'figure':<48} {'cold':>12} {'warm':>12} {'cold/warm':>8}")
    row("ClientApp start-up per message, median", statistics.median(cold["startups"]),
        statistics.median(warm["startups"]))
    row("ClientApp start-up per message, max", max(cold["startups"]), max(warm["startups"]))
    row("Flower's cost per round per device, mean", statistics.mean(cold["per_round"]),
        statistics.mean(warm["per_round"]))
    row("Flower's cost per round per device, max", max(cold["per_round"]), max(warm["per_round"]))
    if cold["beyond"] and warm["beyond"]:
        row("round wall time beyond its training, mean", statistics.mean(cold["beyond"]),
            statistics.mean(warm["beyond"]))
    row("whole run", cold["wall"], warm["wall"])
    print(f"warm runner resident memory per device: {warm['runner_mb']:.0f} MB")
    print(f"every training step within its device's budget: cold {cold['peaks_ok']}, warm {warm['peaks_ok']}")
    mean = statistics.mean(warm["per_round"])
    transfer = 2 * statistics.mean(warm["arrivals"]) if warm["arrivals"] else float("nan")
    print(f"warm, per round per device: {transfer:.3f} s waiting for the SuperNode to receive the two messages "
          f"(Flower's transfer), {mean - transfer:.3f} s of start-up beyond it")
    for label, value in (("with the transfer", mean), ("beyond the transfer", mean - transfer)):
        verdict = "met" if value <= TARGET_SECONDS_PER_ROUND else "NOT met"
        print(f"target: Flower's cost per round per device at most {TARGET_SECONDS_PER_ROUND:g} s, {label} "
              f"(warm mean {value:.3f} s over {len(warm['per_round'])} device-rounds): {verdict}")


if __name__ == "__main__":
    raise SystemExit(main())
