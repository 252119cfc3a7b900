"""Personalization strategies side by side with honest baselines, over seeds and over data sizes.

For one seed, :func:`compare` runs the federation once per strategy on the same fleet
(the same data, classes, schedules and steps) and adds the references every strategy
is held against:

- **local-only**: each device alone, from the same initial weights, with exactly the
  steps it trained in the run (trained by the devices in the first run);
- **global**: FedAvg's global model alone, no personal parts (the ``finetune`` run's
  global model, which is why that run always comes first);
- **centralized**: one model trained on the whole fleet's pooled data for as many steps
  as the fleet trained (:mod:`simulation.centralized`): the upper reference.

The headline is the **gap**: the mean accuracy over devices of the strategy best on average
over the seeds, minus the better of local-only and global, in points.  :class:`SeedRuns` gives every figure as
a mean over seeds with a 95% Student-t interval; :class:`Sweep` repeats it for several
training-set sizes, showing where federation pays and where a device's own data is
enough.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from common.runconfig import PERSONALIZATIONS
from common.errors import CommandError
from common.keep_best import CANDIDATES, Choice, choose, fleet_choice, interleaved_halves
from simulation.report import MEMORY_TOLERANCE_FRACTION, MEMORY_TOLERANCE_MIN_BYTES, SimulationReport, mean

STRATEGIES = tuple(p for p in PERSONALIZATIONS if p != "none")
BASELINES = ("local-only", "global", "centralized")
GAP_TARGET_POINTS = 3.0  # the best strategy must beat the better of local-only and the global model by this
MEMORY_NOTE = (f"a tolerance of {MEMORY_TOLERANCE_FRACTION:.0%} of the budget, at least "
               f"{MEMORY_TOLERANCE_MIN_BYTES >> 10} KiB, for what RSS cannot resolve")


def strategies_in_order(chosen: list[str]) -> tuple[str, ...]:
    """``chosen`` with ``finetune`` first (added where missing): its global model is the global baseline."""
    return ("finetune", *(s for s in dict.fromkeys(chosen) if s != "finetune"))


@dataclass
class Comparison:
    """One seed: each strategy's run and the centralized reference's accuracy per device."""

    seed: int
    runs: dict[str, SimulationReport]  # strategy -> its run; the first is finetune
    centralized: dict[str, float]  # device name -> accuracy
    failed: dict[str, str] = field(default_factory=dict)  # strategy -> why some device could not run it

    @property
    def baseline_run(self) -> SimulationReport:
        return next(iter(self.runs.values()))

    def figures(self) -> dict[str, float]:
        """Mean accuracy over devices in % for each baseline and strategy, and the gap in points."""
        base = self.baseline_run
        figures = {"local-only": 100 * base.mean_local, "global": 100 * base.mean_global,
                   "centralized": 100 * mean(list(self.centralized.values()))}
        figures.update({strategy: 100 * run.mean_personal for strategy, run in self.runs.items()})
        for strategy in self.runs:
            kept = self.choices(strategy)
            if kept:
                figures[f"{strategy} kept"] = 100 * mean([c.kept_accuracy for c in kept.values()])
        figures["gap"] = max(figures[s] for s in self.runs) - max(figures["local-only"], figures["global"])
        return figures

    @property
    def best_strategy(self) -> str:
        figures = self.figures()
        return max(self.runs, key=lambda s: figures[s])

    def choices(self, strategy: str) -> dict[str, Choice]:
        """What each device keeps after ``strategy``'s run (:mod:`common.keep_best`): its global and personal
        models, and the local-only model the first run trained (the same model: the same initial weights, data
        and steps), the one the fleet chose on every device's selection half pooled, reported on the test half
        (the run's own devices chose without the first run's local-only model, so the choice is made again)."""
        base = {d.name: d for d in self.baseline_run.devices}
        figures = {}
        for d in self.runs[strategy].devices:
            if not {"global", "personal"} <= set(d.selection):
                continue
            selection = {"global": d.selection["global"], "personal": d.selection["personal"]}
            test = {"global": d.global_accuracy, "personal": d.personal_accuracy}
            loss = {c: d.selection_loss[c] for c in ("global", "personal") if c in d.selection_loss}
            alone = base.get(d.name)
            if alone is not None and "local" in alone.selection and alone.local_accuracy >= 0:
                selection["local"], test["local"] = alone.selection["local"], alone.local_accuracy
                if "local" in alone.selection_loss:
                    loss["local"] = alone.selection_loss["local"]
            figures[d.name] = selection, test, loss
        samples = self._selection_samples(strategy)
        fleet = (fleet_choice([(selection, samples) for selection, _, _ in figures.values()],
                              [loss for _, _, loss in figures.values()]) if samples else None)
        return {name: choose(selection, test, loss, samples=samples, fleet=fleet)
                for name, (selection, test, loss) in figures.items()}

    def _selection_samples(self, strategy: str) -> int | None:
        """The held-out samples each device chose on: half its held-out digits (FleetData.holdout)."""
        holdout = self.runs[strategy].settings.get("data", {}).get("holdout")
        return len(interleaved_halves(int(holdout))[0]) if holdout else None

    def wins(self, strategy: str) -> dict[str, tuple[int, float, float]]:
        """Per candidate: on how many devices it was kept, and by how much it beat the best other candidate on
        those devices' test halves, in points (mean, 95% half-width over the devices)."""
        by_candidate: dict[str, list[float]] = {c: [] for c in CANDIDATES}
        for choice in self.choices(strategy).values():
            others = [v for c, v in choice.test.items() if c != choice.kept]
            by_candidate[choice.kept].append(100 * (choice.kept_accuracy - max(others)) if others else 0.0)
        return {c: (len(v), *interval(v)) for c, v in by_candidate.items() if v}

    def tuning(self) -> dict[str, dict[str, float]]:
        """Per strategy, the fine-tuning's mean planned step peak (bytes) and its energy over the fleet (J)."""
        return {s: {"planned_peak_bytes": mean([d.tuning_planned_bytes for d in run.devices
                                                if d.tuning_planned_bytes >= 0]),
                    "energy_j": sum(d.tuning_energy_j for d in run.devices)} for s, run in self.runs.items()}

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "figures": self.figures(), "tuning": self.tuning(), "failed": self.failed,
                "centralized": self.centralized,
                "runs": {strategy: run.to_json() for strategy, run in self.runs.items()}}

    def print(self, out: TextIO) -> None:
        """The FedAvg run's rounds, every device's figures, and the strategies against the baselines."""
        base = self.baseline_run
        out.write(f"{'round':>5} {'global acc.':>11} {'train loss':>10} {'trained':>7} {'absent':>6} {'seconds':>8}\n")
        for r in base.rounds:
            accuracy = f"{r.global_accuracy:>10.1%}" if r.global_accuracy >= 0 else f"{'-':>10}"  # none trained
            out.write(f"{r.round:>5} {accuracy} {r.train_loss:>10.3f} {r.trained:>7} {r.absent:>6} "
                      f"{r.seconds:>8.2f}\n")
        strategies = list(self.runs)
        out.write(f"\n{'device':<14} {'class':<7} {'peak / budget (B)':>22} {'energy J':>9} {'local':>6} {'global':>6} "
                  f"{'central':>7} " + " ".join(f"{s:>8}" for s in strategies) + "\n")
        by_name = {s: {d.name: d for d in run.devices} for s, run in self.runs.items()}
        for d in base.devices:
            budget = f"{d.budget_bytes:,}" if d.budget_bytes is not None else "no limit"
            local = f"{d.local_accuracy:.1%}" if d.local_accuracy >= 0 else "-"
            personal = " ".join(f"{by_name[s][d.name].personal_accuracy:>8.1%}" if d.name in by_name[s] else
                                f"{'-':>8}" for s in strategies)
            out.write(f"{d.name:<14} {d.device_class:<7} {f'{d.peak_bytes:,} / {budget}':>22} {d.energy_j:>9.2f} "
                      f"{local:>6} {d.global_accuracy:>6.1%} {self.centralized.get(d.name, float('nan')):>7.1%} "
                      f"{personal}\n")
        f = self.figures()
        out.write("\nmean over devices: " + ", ".join(f"{k} {f[k]:.1f}%" for k in (*BASELINES, *strategies))
                  + f"; best strategy {self.best_strategy} {f['gap']:+.1f} points over the better of local-only "
                  f"and global (target >= {GAP_TARGET_POINTS:.0f})\n")
        for strategy in self.runs:
            wins = self.wins(strategy)
            if wins:
                fleet = {c.kept for c in self.choices(strategy).values() if c.by == "fleet"}
                who = (f"the fleet keeps {fleet.pop()}, its baseline unless another is ahead on its devices' "
                       "selection halves with 95% confidence (in accuracy, or in loss at no less accuracy)"
                       if fleet else "each device keeps the best on half its held-out data")
                out.write(f"{strategy}: {who}, "
                          f"{f.get(f'{strategy} kept', float('nan')):.1f}% on the other half; kept "
                          + ", ".join(f"{c} on {n} ({m:+.1f} +- {h:.1f} points over the next best)"
                                      for c, (n, m, h) in wins.items()) + "\n")
        for strategy, reason in self.failed.items():
            out.write(f"{strategy}: failed, left out ({reason})\n")
        for strategy, run in self.runs.items():
            over = [d.name for d in run.devices if not d.within_budget]
            planned = mean([d.tuning_planned_bytes for d in run.devices if d.tuning_planned_bytes >= 0])
            out.write(f"{strategy}: peak within budget (with {MEMORY_NOTE}) on {len(run.devices) - len(over)} of "
                      f"{len(run.devices)} devices" + (f" (over: {', '.join(over)})" if over else "")
                      + f"; fine-tuning planned at {planned / 1024:,.0f} KiB a step on average, "
                      f"{sum(d.tuning_energy_j for d in run.devices):.1f} J; all training "
                      f"{sum(d.energy_j for d in run.devices):.1f} J; {run.seconds:.1f} s"
                      + (" with the local-only baselines" if run is base else "")
                      + f", {run.seconds_per_round:.2f} s per round after the first\n")


def compare(settings: Any, strategies: tuple[str, ...], out: TextIO = sys.stdout) -> Comparison:
    """Run each strategy on the fleet of ``settings`` (:class:`simulation.run.SimulationSettings`) with its seed,
    then the centralized reference; the devices train the local-only baseline in the first run only."""
    from simulation.centralized import centralized_accuracies
    from simulation.fleet import fleet_node_configs
    from simulation.profile import profile_once
    from simulation.run import simulate

    runs: dict[str, SimulationReport] = {}
    failed: dict[str, str] = {}
    for i, strategy in enumerate(strategies):
        out.write(f"-- {strategy}: {settings.devices} devices, seed {settings.seed}\n")
        out.flush()
        try:
            runs[strategy] = simulate(replace(settings, personalization=strategy, local_baseline=i == 0))
        except CommandError as exc:
            if i == 0:  # the baselines come from the first run: nothing to compare without it
                raise
            failed[strategy] = str(exc)
            out.write(f"{strategy} failed, left out of the comparison: {exc}\n")
    steps = sum(d.steps for d in runs[strategies[0]].devices)
    accuracies = centralized_accuracies(settings.devices, settings.data, settings.seed, steps, settings.lr,
                                        profile_once(settings.seed, dataset=settings.data.dataset,
                                                     label_column=settings.data.label_column),
                                        settings.initial_weights)
    names = [n["device-name"] for n in fleet_node_configs(settings.devices, settings.classes)]
    return Comparison(settings.seed, runs, dict(zip(names, accuracies)), failed)


def interval(values: list[float]) -> tuple[float, float]:
    """``(mean, half-width of the 95% confidence interval)`` by Student's t; the half-width is NaN for one value."""
    centre = mean(values)
    if len(values) < 2:
        return centre, float("nan")
    from scipy.stats import t  # scikit-learn's own dependency, in the sim extra

    spread = (sum((v - centre) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    return centre, float(t.ppf(0.975, len(values) - 1)) * spread / len(values) ** 0.5


@dataclass
class SeedRuns:
    """One setup over several seeds: every figure as its mean with a 95% confidence interval over the seeds."""

    samples: int
    comparisons: list[Comparison]

    def figures(self) -> dict[str, tuple[float, float]]:
        """Each baseline's and strategy's mean accuracy as ``(mean, 95% half-width)`` over the seeds, and the
        ``gap`` of :attr:`best_strategy`: its accuracy minus the better of local-only and global, seed by seed.
        (The best strategy is chosen once, by its mean: taking each seed's best would flatter the gap.)"""
        seeds = [c.figures() for c in self.comparisons]
        keys = dict.fromkeys(k for f in seeds for k in f if k != "gap")  # a strategy that failed in a seed is absent
        figures = {k: interval([f[k] for f in seeds if k in f]) for k in keys}
        best = self.best_strategy
        figures["gap"] = interval([f[best] - max(f["local-only"], f["global"]) for f in seeds if best in f])
        kept = f"{best} kept"
        figures["kept gap"] = interval([f[kept] - max(f["local-only"], f["global"]) for f in seeds if kept in f])
        return figures

    @property
    def best_strategy(self) -> str:
        """The strategy with the best mean accuracy over the seeds."""
        seeds = [c.figures() for c in self.comparisons]
        strategies = dict.fromkeys(s for c in self.comparisons for s in c.runs)
        return max(strategies, key=lambda s: mean([f[s] for f in seeds if s in f]))

    @property
    def target_met(self) -> bool:
        return self.figures()["gap"][0] >= GAP_TARGET_POINTS

    def print(self, out: TextIO) -> None:
        """The seeds side by side, then their mean and interval against the target."""
        f, best = self.figures(), self.best_strategy
        keys = [k for k in f if k not in ("gap", "kept gap")]
        out.write(f"\n{'seed':>5} " + " ".join(f"{k:>11}" for k in keys) + f" {'gap':>7}\n")
        for c in self.comparisons:
            seed = c.figures()
            gap = seed.get(best, float("nan")) - max(seed["local-only"], seed["global"])
            out.write(f"{c.seed:>5} " + " ".join(f"{seed.get(k, float('nan')):>10.1f}%" for k in keys)
                      + f" {gap:>+7.1f}\n")
        out.write(f"mean over {len(self.comparisons)} seeds (95% confidence interval), {self.samples or 'a whole partition of'} training samples per "
                  "device: " + ", ".join(f"{k} {f[k][0]:.1f} +- {f[k][1]:.1f} %" for k in keys)
                  + f"; the best strategy on average, {best}, over the better of local-only and global "
                  f"{f['gap'][0]:+.1f} +- {f['gap'][1]:.1f} points (target >= {GAP_TARGET_POINTS:.0f}: "
                  f"{'met' if self.target_met else 'NOT met'})\n")
        if f["kept gap"][0] == f["kept gap"][0]:  # not NaN: the devices reported what they kept
            out.write(f"the model each device keeps after {best}, over the better of local-only and global: "
                      f"{f['kept gap'][0]:+.1f} +- {f['kept gap'][1]:.1f} points (target >= 0: "
                      f"{'met' if f['kept gap'][0] >= -1e-9 else 'NOT met'})\n")  # the same figure summed apart

    def to_json(self) -> dict[str, Any]:
        f = self.figures()
        return {"samples": self.samples, "best_strategy": self.best_strategy, "mean": {k: v[0] for k, v in f.items()},
                "ci95": {k: v[1] for k, v in f.items()}, "target_met": self.target_met,
                "seeds": [c.to_json() for c in self.comparisons]}


@dataclass
class Sweep:
    """The same comparison at several training-set sizes (digits per device)."""

    setups: list[SeedRuns]

    def print(self, out: TextIO) -> None:
        """One line per size: the mean of every figure over the seeds, and the gap with its interval."""
        keys = list(dict.fromkeys(k for setup in self.setups for k in setup.figures() if k not in ("gap", "kept gap")))
        out.write(f"\n{'digits/device':>13} " + " ".join(f"{k:>11}" for k in keys)
                  + f" {'best':>12} {'gap (95% CI)':>16} {'kept gap':>16}\n")
        for setup in self.setups:
            f = setup.figures()
            gap = f"{f['gap'][0]:+.1f} +- {f['gap'][1]:.1f}"
            kept = f"{f['kept gap'][0]:+.1f} +- {f['kept gap'][1]:.1f}"
            out.write(f"{setup.samples:>13} " + " ".join(f"{f.get(k, (float('nan'),))[0]:>10.1f}%" for k in keys)
                      + f" {setup.best_strategy:>12} {gap:>16} {kept:>16}\n")

    def save_json(self, path: Path) -> None:
        path.write_text(json.dumps({"format": "poet-edge/simulation", "version": 2,
                                    "setups": [s.to_json() for s in self.setups]}, indent=2) + "\n")
