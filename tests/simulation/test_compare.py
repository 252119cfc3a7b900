"""The simulation's comparison of what devices keep: the local-only model of the first run is a candidate in
every strategy's run, and the fleet's summary counts what each device kept and by how much."""

from __future__ import annotations

import io

import pytest

from simulation.compare import Comparison
from simulation.report import DeviceResult, SimulationReport


def device(name: str, global_: float, personal: float, local: float, selection: dict[str, float]) -> DeviceResult:
    return DeviceResult(name, "small", "rpi4", None, None, 1, 0.0, global_, personal, local, 10, 10,
                        selection=selection)


def test_every_strategy_keeps_the_best_of_its_own_models_and_the_first_runs_local_only_model() -> None:
    finetune = SimulationReport({}, [], [
        device("a", 0.50, 0.70, 0.60, {"global": 0.5, "personal": 0.8, "local": 0.6}),  # keeps personal
        device("b", 0.60, 0.55, 0.90, {"global": 0.5, "personal": 0.5, "local": 0.9}),  # keeps local
        device("c", 0.80, 0.70, 0.40, {"global": 0.9, "personal": 0.9, "local": 0.3}),  # tie: keeps global
    ], 1.0)
    fedbn = SimulationReport({}, [], [  # no local-only model of its own: the first run's is the same model
        device("a", 0.50, 0.40, -1.0, {"global": 0.7, "personal": 0.4}),
        device("b", 0.60, 0.65, -1.0, {"global": 0.5, "personal": 0.6}),
        device("c", 0.80, 0.85, -1.0, {"global": 0.6, "personal": 0.8}),
    ], 1.0)
    comparison = Comparison(0, {"finetune": finetune, "fedbn": fedbn}, {"a": 0.9, "b": 0.9, "c": 0.9})

    assert {n: c.kept for n, c in comparison.choices("finetune").items()} == {"a": "personal", "b": "local",
                                                                             "c": "global"}
    assert {n: c.kept for n, c in comparison.choices("fedbn").items()} == {"a": "global", "b": "local",
                                                                          "c": "personal"}
    figures = comparison.figures()
    assert figures["finetune kept"] == pytest.approx(100 * (0.70 + 0.90 + 0.80) / 3)
    assert figures["fedbn kept"] == pytest.approx(100 * (0.50 + 0.90 + 0.85) / 3)
    wins = comparison.wins("finetune")
    assert {c: n for c, (n, _, _) in wins.items()} == {"global": 1, "personal": 1, "local": 1}
    assert wins["local"][1] == pytest.approx(100 * (0.90 - 0.60))  # over the next best on its test half
    assert wins["personal"][1] == pytest.approx(100 * (0.70 - 0.60))
    out = io.StringIO()
    comparison.print(out)
    assert "finetune: each device keeps the best on half its held-out data, 80.0% on the other half; kept " \
           "global on 1" in out.getvalue()


def test_a_strategy_some_device_could_not_run_is_left_out_saying_why() -> None:
    run = SimulationReport({}, [], [device("a", 0.5, 0.6, 0.55, {"global": 0.5, "personal": 0.6, "local": 0.5})], 1.0)
    comparison = Comparison(0, {"finetune": run}, {"a": 0.9},
                            failed={"ditto": "1 of 3 devices failed (small-000: ditto holds the global model ...)"})
    out = io.StringIO()
    comparison.print(out)
    assert "ditto: failed, left out (1 of 3 devices failed (small-000: ditto holds" in out.getvalue()
    assert "ditto" not in comparison.figures() and comparison.to_json()["failed"] == comparison.failed


def test_with_the_held_out_samples_known_every_device_keeps_the_fleets_choice() -> None:
    # 20 selection samples each: device a alone favours personal by two samples; the fleet does not
    settings = {"data": {"holdout": 40}}
    finetune = SimulationReport(settings, [], [
        device("a", 0.50, 0.75, 0.70, {"global": 0.50, "personal": 0.80, "local": 0.70}),
        device("b", 0.60, 0.55, 0.90, {"global": 0.50, "personal": 0.50, "local": 0.90}),
        device("c", 0.80, 0.70, 0.60, {"global": 0.90, "personal": 0.60, "local": 0.60}),
    ], 1.0)
    fedbn = SimulationReport(settings, [], [  # pooled with the first run's local-only models (0.7, 0.9, 0.6)
        device("a", 0.50, 0.40, -1.0, {"global": 0.5, "personal": 0.85}),
        device("b", 0.60, 0.65, -1.0, {"global": 0.5, "personal": 1.0}),
        device("c", 0.80, 0.85, -1.0, {"global": 0.6, "personal": 0.75}),
    ], 1.0)
    comparison = Comparison(0, {"finetune": finetune, "fedbn": fedbn}, {"a": 0.9, "b": 0.9, "c": 0.9})
    kept = comparison.choices("finetune")
    assert {c.kept for c in kept.values()} == {"local"} and {c.by for c in kept.values()} == {"fleet"}
    assert comparison.figures()["finetune kept"] == pytest.approx(100 * (0.70 + 0.90 + 0.60) / 3)
    # ahead of the first run's local-only model on every device, by 10-15 points: confidently better
    assert {c.kept for c in comparison.choices("fedbn").values()} == {"personal"}
    out = io.StringIO()
    comparison.print(out)
    assert "finetune: the fleet keeps local, its baseline unless another is ahead on its devices' selection halves" \
        in out.getvalue()
