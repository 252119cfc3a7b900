"""One simulated run's figures, built from the rounds the server stored: per round and per device; its plot."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common.keep_best import CANDIDATES, kept_name
from common.messages import ABSENT
from server.federated.rounds import RoundRow

# A simulated device's budget is a megabyte or so: the agent's 8 MiB tolerance would pass any peak.  The report
# judges peaks against a tolerance small against the budget instead: what RSS cannot resolve at that scale (a
# step's own Python objects, a page here and there) is a few percent.
MEMORY_TOLERANCE_FRACTION = 0.05
MEMORY_TOLERANCE_MIN_BYTES = 64 << 10


def memory_tolerance(budget_bytes: int) -> int:
    """What a peak may exceed ``budget_bytes`` by and still be within it."""
    return max(MEMORY_TOLERANCE_MIN_BYTES, int(MEMORY_TOLERANCE_FRACTION * budget_bytes))


@dataclass(frozen=True)
class RoundResult:
    """One federated round across the fleet."""

    round: int
    global_accuracy: float  # the aggregated model on every device's held-out data, weighted by samples
    train_loss: float  # mean over the devices that trained
    seconds: float  # wall time of the round (train and evaluate); round 1 from the run's submission
    trained: int = 0  # devices whose update was aggregated
    absent: int = 0  # devices sampled that sent no update (not charging, unplugged)


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
    global_accuracy: float  # the final global model on its own held-out data (the test half, after a personalization)
    personal_accuracy: float  # after fine-tuning (and with its personal layers)
    local_accuracy: float = -1.0  # the device alone with the same steps from the initial weights (-1: not run)
    steps: int = 0  # optimizer steps it trained: its rounds and its fine-tuning
    local_steps: int = -1  # the steps the local-only baseline trained (-1: not run): the same as ``steps``
    tuning_planned_bytes: int = -1  # the fine-tuning schedule's predicted whole-step peak (-1: no fine-tuning)
    tuning_peak_bytes: int = -1  # ... and as measured
    tuning_energy_j: float = 0.0  # the fine-tuning steps' energy
    kept: str = ""  # the candidate the device kept (common.keep_best), "" where it reported none
    kept_accuracy: float = -1.0
    # each candidate's accuracy on the selection half of its held-out data (the accuracies above are the test
    # half's): what the choice was made on
    selection: dict[str, float] = field(default_factory=dict)
    selection_loss: dict[str, float] = field(default_factory=dict)  # ... and each one's loss there (ties)

    @property
    def within_budget(self) -> bool:
        """Whether the measured peak is within the budget and :func:`memory_tolerance` (no budget: always)."""
        return self.budget_bytes is None or self.peak_bytes <= self.budget_bytes + memory_tolerance(self.budget_bytes)


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
        return mean([d.global_accuracy for d in self.devices])

    @property
    def mean_personal(self) -> float:
        return mean([d.personal_accuracy for d in self.devices])

    @property
    def mean_local(self) -> float:
        """Mean local-only accuracy (NaN where the run trained no local-only baseline)."""
        return mean([d.local_accuracy for d in self.devices if d.local_accuracy >= 0])

    @property
    def seconds_per_round(self) -> float:
        """Mean wall time of a round after the first (the first also waits for the engine: Ray, torch imports)."""
        return mean([r.seconds for r in self.rounds[1:] or self.rounds])

    def to_json(self) -> dict[str, Any]:
        return {"format": "poet-edge/simulation", "version": 1, "settings": self.settings, "seconds": self.seconds,
                "seconds_per_round": self.seconds_per_round,
                "mean_global_accuracy": self.mean_global, "mean_personal_accuracy": self.mean_personal,
                "mean_local_accuracy": self.mean_local, "rounds": [asdict(r) for r in self.rounds],
                "devices": [{**asdict(d), "within_budget": d.within_budget} for d in self.devices], **self.meta}

    def save_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")


def build_report(rows: list[RoundRow], node_configs: list[dict[str, Any]], settings: dict[str, Any],
                 started: float, finished: float) -> SimulationReport:
    """The report from the stored rows of one run and the fleet that produced them (rows of error replies, a
    device's ClientApp that failed, have no figures and are left out)."""
    absent: dict[int, int] = defaultdict(int)
    ends: dict[int, float] = defaultdict(float)  # when each round's last reply was recorded, absent ones too
    for row in rows:
        if row.phase in ("train", "evaluate"):
            ends[row.round] = max(ends[row.round], row.recorded_at)
        if ABSENT in row.metrics and row.phase == "train":
            absent[row.round] += 1
    rows = [r for r in rows if "error" not in r.metrics and ABSENT not in r.metrics]
    by_phase: dict[str, list[RoundRow]] = defaultdict(list)
    for row in rows:
        by_phase[row.phase].append(row)
    rounds = _rounds(by_phase, started, absent, ends)
    classes = {n["device-name"]: n for n in node_configs}
    devices = [_device(name, classes[name], [r for r in rows if r.device_name == name], rounds)
               for name in sorted(classes)]
    return SimulationReport(settings, rounds, devices, finished - started)


def _rounds(by_phase: dict[str, list[RoundRow]], started: float, absent: dict[int, int],
            ends: dict[int, float]) -> list[RoundResult]:
    results, previous = [], started
    for number in sorted({r.round for r in by_phase["train"]} | set(absent)):
        train = [r for r in by_phase["train"] if r.round == number]
        evaluate = [r for r in by_phase["evaluate"] if r.round == number]
        ended = ends.get(number) or previous
        weights = sum(r.metrics["num-examples"] for r in evaluate)
        accuracy = sum(r.metrics["accuracy"] * r.metrics["num-examples"] for r in evaluate) / weights if weights else -1
        results.append(RoundResult(number, accuracy, mean([r.metrics["train-loss"] for r in train]),
                                   ended - previous, len(train), absent.get(number, 0)))
        previous = ended
    return results


def _device(name: str, node: dict[str, Any], rows: list[RoundRow], rounds: list[RoundResult]) -> DeviceResult:
    trained = [r for r in rows if r.phase in ("train", "personalize")]
    # the keep row (the fleet's choice) repeats the personalize row's figures with the final choice
    final = next((r for r in rows if r.phase == "keep"), None) or next((r for r in rows if r.phase == "personalize"),
                                                                         None)
    last_eval = max((r for r in rows if r.phase == "evaluate"), key=lambda r: r.round, default=None)
    budget = int(trained[0].metrics["budget-bytes"]) if trained else -1
    global_accuracy = (final.metrics["global-accuracy"] if final else
                       last_eval.metrics["accuracy"] if last_eval else -1.0)
    return DeviceResult(name, str(node.get("device-class", "")), str(node.get("device-profile", "")),
                        trained[0].schedule_id if trained else None, None if budget < 0 else budget,
                        int(max((r.metrics["peak-bytes"] for r in trained), default=-1)),
                        sum(max(r.metrics["energy-j"], 0.0) for r in trained), float(global_accuracy),
                        float(final.metrics["personal-accuracy"]) if final else float(global_accuracy),
                        float(final.metrics.get("local-accuracy", -1.0)) if final else -1.0,
                        int(sum(r.metrics["steps"] for r in trained)),
                        int(final.metrics.get("local-steps-total", -1)) if final else -1,
                        int(final.metrics.get("planned-peak-bytes", -1)) if final else -1,
                        int(final.metrics["peak-bytes"]) if final else -1,
                        max(final.metrics["energy-j"], 0.0) if final else 0.0,
                        kept_name(final.metrics.get("kept")) or "" if final else "",
                        float(final.metrics.get("kept-accuracy", -1.0)) if final else -1.0,
                        {c: float(final.metrics[f"select-{c}-accuracy"]) for c in CANDIDATES
                         if f"select-{c}-accuracy" in final.metrics} if final else {},
                        {c: float(final.metrics[f"select-{c}-loss"]) for c in CANDIDATES
                         if f"select-{c}-loss" in final.metrics} if final else {})


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


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
