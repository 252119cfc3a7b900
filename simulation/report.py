"""The simulation's figures, built from the rounds the server stored: per round, per device, and the targets."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from server.rounds import RoundRow

GAP_TARGET_POINTS = 3.0  # personalized accuracy must beat the better of local-only and the global model by this
TIME_TARGET_S = 600.0  # 20 devices must finish within this
MEMORY_TOLERANCE_BYTES = 8 << 20  # agent.training.DEFAULT_TOLERANCE_BYTES (the report imports no torch)


@dataclass(frozen=True)
class RoundResult:
    """One federated round across the fleet."""

    round: int
    global_accuracy: float  # the aggregated model on every device's held-out data, weighted by samples
    train_loss: float  # mean over the devices that trained
    seconds: float  # wall time of the round (train and evaluate); round 1 from the run's submission


@dataclass(frozen=True)
class DeviceResult:
    """One virtual device over the whole run."""

    name: str
    device_class: str
    profile: str
    schedule_id: str | None
    budget_bytes: int | None
    peak_bytes: int
    energy_j: float  # train and fine-tune steps, as the device's schedule predicts them on its profile
    global_accuracy: float  # the final global model on its own held-out data
    personal_accuracy: float  # after fine-tuning (and with its personal layers)
    local_accuracy: float = -1.0  # the device alone with the same steps from the initial weights (-1: not run)

    @property
    def within_budget(self) -> bool:
        """Within the budget as the devices' memory check judges it: RSS resolves no finer than its tolerance
        (:data:`agent.training.DEFAULT_TOLERANCE_BYTES`), more than a tiny model's whole step."""
        return self.budget_bytes is None or self.peak_bytes <= self.budget_bytes + MEMORY_TOLERANCE_BYTES


@dataclass
class SimulationReport:
    """Everything ``poet-edge simulate`` prints, writes as JSON and plots."""

    settings: dict[str, Any]
    rounds: list[RoundResult]
    devices: list[DeviceResult]
    seconds: float
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def mean_global(self) -> float:
        return _mean([d.global_accuracy for d in self.devices])

    @property
    def mean_personal(self) -> float:
        return _mean([d.personal_accuracy for d in self.devices])

    @property
    def mean_local(self) -> float:
        """Mean local-only accuracy (NaN where the run trained no local-only baseline)."""
        return _mean([d.local_accuracy for d in self.devices if d.local_accuracy >= 0])

    @property
    def best_baseline(self) -> tuple[str, float]:
        """The stronger of the global model alone and local-only training, by mean accuracy."""
        local = self.mean_local
        if local == local and local > self.mean_global:
            return "local-only", local
        return "global", self.mean_global

    @property
    def gap_points(self) -> float:
        """Personalized accuracy minus the best baseline's, in percentage points, averaged over the devices."""
        return 100 * (self.mean_personal - self.best_baseline[1])

    @property
    def seconds_per_round(self) -> float:
        """Mean wall time of a round after the first (the first also waits for the engine: Ray, torch imports)."""
        return _mean([r.seconds for r in self.rounds[1:] or self.rounds])

    def to_json(self) -> dict[str, Any]:
        return {"format": "poet-edge/simulation", "version": 1, "settings": self.settings, "seconds": self.seconds,
                "seconds_per_round": self.seconds_per_round,
                "mean_global_accuracy": self.mean_global, "mean_personal_accuracy": self.mean_personal,
                "mean_local_accuracy": self.mean_local, "best_baseline": self.best_baseline[0],
                "gap_points": self.gap_points, "rounds": [asdict(r) for r in self.rounds],
                "devices": [{**asdict(d), "within_budget": d.within_budget} for d in self.devices], **self.meta}

    def save_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")


def build_report(rows: list[RoundRow], node_configs: list[dict[str, Any]], settings: dict[str, Any],
                 started: float, finished: float) -> SimulationReport:
    """The report from the stored rows of one run and the fleet that produced them (rows of error replies, a
    device's ClientApp that failed, have no figures and are left out)."""
    rows = [r for r in rows if "error" not in r.metrics]
    by_phase: dict[str, list[RoundRow]] = defaultdict(list)
    for row in rows:
        by_phase[row.phase].append(row)
    rounds = _rounds(by_phase, started)
    classes = {n["device-name"]: n for n in node_configs}
    devices = [_device(name, classes[name], [r for r in rows if r.device_name == name], rounds)
               for name in sorted(classes)]
    return SimulationReport(settings, rounds, devices, finished - started)


def _rounds(by_phase: dict[str, list[RoundRow]], started: float) -> list[RoundResult]:
    results, previous = [], started
    for number in sorted({r.round for r in by_phase["train"]}):
        train = [r for r in by_phase["train"] if r.round == number]
        evaluate = [r for r in by_phase["evaluate"] if r.round == number]
        ended = max(r.recorded_at for r in evaluate or train)
        weights = sum(r.metrics["num-examples"] for r in evaluate)
        accuracy = sum(r.metrics["accuracy"] * r.metrics["num-examples"] for r in evaluate) / weights if weights else -1
        results.append(RoundResult(number, accuracy, _mean([r.metrics["train-loss"] for r in train]),
                                   ended - previous))
        previous = ended
    return results


def _device(name: str, node: dict[str, Any], rows: list[RoundRow], rounds: list[RoundResult]) -> DeviceResult:
    trained = [r for r in rows if r.phase in ("train", "personalize")]
    final = next((r for r in rows if r.phase == "personalize"), None)
    last_eval = max((r for r in rows if r.phase == "evaluate"), key=lambda r: r.round, default=None)
    budget = int(trained[0].metrics["budget-bytes"]) if trained else -1
    global_accuracy = (final.metrics["global-accuracy"] if final else
                       last_eval.metrics["accuracy"] if last_eval else -1.0)
    return DeviceResult(name, str(node.get("device-class", "")), str(node.get("device-profile", "")),
                        trained[0].schedule_id if trained else None, None if budget < 0 else budget,
                        int(max((r.metrics["peak-bytes"] for r in trained), default=-1)),
                        sum(max(r.metrics["energy-j"], 0.0) for r in trained), float(global_accuracy),
                        float(final.metrics["personal-accuracy"]) if final else float(global_accuracy),
                        float(final.metrics.get("local-accuracy", -1.0)) if final else -1.0)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _interval(values: list[float]) -> tuple[float, float]:
    """``(mean, half-width of the 95% confidence interval)`` by Student's t; the half-width is NaN for one value."""
    mean = _mean(values)
    if len(values) < 2:
        return mean, float("nan")
    from scipy.stats import t  # scikit-learn's own dependency, in the sim extra

    spread = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    return mean, float(t.ppf(0.975, len(values) - 1)) * spread / len(values) ** 0.5


def print_report(report: SimulationReport, out: TextIO) -> None:
    """Per round, per device, then the targets, as plain text."""
    out.write(f"{'round':>5} {'global acc.':>11} {'train loss':>10} {'seconds':>8}\n")
    for r in report.rounds:
        out.write(f"{r.round:>5} {r.global_accuracy:>10.1%} {r.train_loss:>10.3f} {r.seconds:>8.2f}\n")
    out.write(f"\n{'device':<14} {'class':<7} {'profile':<17} {'peak / budget (B)':>22} {'energy J':>9} "
              f"{'global':>7} {'personal':>8} {'local':>7}\n")
    for d in report.devices:
        budget = f"{d.budget_bytes:,}" if d.budget_bytes is not None else "no limit"
        local = f"{d.local_accuracy:.1%}" if d.local_accuracy >= 0 else "-"
        out.write(f"{d.name:<14} {d.device_class:<7} {d.profile:<17} {f'{d.peak_bytes:,} / {budget}':>22} "
                  f"{d.energy_j:>9.2f} {d.global_accuracy:>6.1%} {d.personal_accuracy:>8.1%} {local:>7}\n")
    over = [d.name for d in report.devices if not d.within_budget]
    name, best = report.best_baseline
    local = f"local-only {report.mean_local:.1%}, " if report.mean_local == report.mean_local else ""
    out.write(f"\npersonalized {report.mean_personal:.1%} vs {local}global {report.mean_global:.1%} on average "
              f"(local-only: each device alone, the same steps from the same initial weights): "
              f"{report.gap_points:+.1f} points over {name} (target >= {GAP_TARGET_POINTS:.0f} over the better: "
              f"{'met' if report.gap_points >= GAP_TARGET_POINTS else 'NOT met'})\n")
    out.write(f"peak within budget (and the memory check's {MEMORY_TOLERANCE_BYTES / 2**20:.0f} MiB tolerance for what "
              f"RSS cannot resolve) on {len(report.devices) - len(over)} of {len(report.devices)} devices"
              + (f" (over: {', '.join(over)})" if over else "") + "\n")
    first = report.rounds[0].seconds if report.rounds else float("nan")
    out.write(f"{len(report.devices)} devices, {len(report.rounds)} rounds: {report.seconds:.1f} s "
              f"({report.seconds_per_round:.2f} s per round after the first; the first {first:.1f} s, "
              "starting the engine included)\n")


@dataclass
class SeedRuns:
    """The same simulation run with several seeds: the headline figures as their mean with a 95% confidence
    interval (Student's t over the seeds)."""

    reports: list[SimulationReport]

    def figures(self) -> dict[str, tuple[float, float]]:
        """Mean accuracies (in %) and the gap (in points), each ``(mean, 95% half-width)`` over the seeds."""
        return {"personalized": _interval([100 * r.mean_personal for r in self.reports]),
                "local-only": _interval([100 * r.mean_local for r in self.reports]),
                "global": _interval([100 * r.mean_global for r in self.reports]),
                "gap": _interval([r.gap_points for r in self.reports])}

    @property
    def target_met(self) -> bool:
        return _mean([r.gap_points for r in self.reports]) >= GAP_TARGET_POINTS

    def print(self, out: TextIO) -> None:
        """The seeds' headline figures side by side, then their mean and interval against the target."""
        out.write(f"\n{'seed':>5} {'personalized':>12} {'local-only':>10} {'global':>7} {'gap':>7}\n")
        for r in self.reports:
            out.write(f"{r.settings.get('seed', '?'):>5} {r.mean_personal:>12.1%} {r.mean_local:>10.1%} "
                      f"{r.mean_global:>7.1%} {r.gap_points:>+7.1f}\n")
        f = self.figures()
        out.write("mean over {} seeds (95% confidence interval): personalized {:.1f} +- {:.1f} %, local-only {:.1f} "
                  "+- {:.1f} %, global {:.1f} +- {:.1f} %; personalized over the better baseline {:+.1f} +- {:.1f} "
                  "points (target >= {:.0f}: {})\n".format(
                      len(self.reports), *f["personalized"], *f["local-only"], *f["global"], *f["gap"],
                      GAP_TARGET_POINTS, "met" if self.target_met else "NOT met"))

    def save_json(self, path: Path) -> None:
        f = self.figures()
        path.write_text(json.dumps({"format": "poet-edge/simulation-seeds", "version": 1,
                                    "mean": {k: v[0] for k, v in f.items()},
                                    "ci95": {k: v[1] for k, v in f.items()}, "target_met": self.target_met,
                                    "runs": [r.to_json() for r in self.reports]}, indent=2) + "\n")


def plot_report(report: SimulationReport, path: Path) -> None:
    """Four panels in one PNG: global accuracy per round, accuracy per device, peak vs budget, energy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    names = [d.name for d in report.devices]
    x = range(len(names))
    fig, ax = plt.subplots(2, 2, figsize=(13, 8))
    ax[0][0].plot([r.round for r in report.rounds], [100 * r.global_accuracy for r in report.rounds], marker="o")
    ax[0][0].set(title="Global model, held-out accuracy", xlabel="round", ylabel="%")
    ax[0][0].xaxis.set_major_locator(MaxNLocator(integer=True))
    ax[0][1].bar([i - 0.2 for i in x], [100 * d.global_accuracy for d in report.devices], 0.4, label="global")
    ax[0][1].bar([i + 0.2 for i in x], [100 * d.personal_accuracy for d in report.devices], 0.4, label="personalized")
    ax[0][1].set(title="Accuracy on each device's own data", ylabel="%")
    ax[0][1].legend()
    ax[1][0].bar(x, [d.peak_bytes / 1024 for d in report.devices], label="peak")
    ax[1][0].scatter(x, [(d.budget_bytes or d.peak_bytes) / 1024 for d in report.devices], color="red", marker="_",
                     s=200, label="budget (none: peak)")
    ax[1][0].set(title="Step memory (RSS growth) against budget", ylabel="KiB")
    ax[1][0].legend()
    ax[1][1].bar(x, [d.energy_j for d in report.devices])
    ax[1][1].set(title="Training energy per device (schedule's prediction)", ylabel="J")
    for a in (ax[0][1], ax[1][0], ax[1][1]):
        a.set_xticks(list(x), names, rotation=90, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
