"""``poet-edge simulate`` end to end on a small fleet in Flower's simulation engine: figures, JSON, picture."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from schedules.cli import main
from schedules.errors import CommandError
from schedules.graph import TrainingGraph
from simulation.fleet import DEFAULT_CLASSES, classes_config, fleet_node_configs, parse_classes


def test_a_small_fleet_prints_accuracy_memory_and_energy_over_seeds_and_writes_json_and_png(tmp_path, capsys,
                                                                                            monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the graph each seed is profiled to, once
    out, png = tmp_path / "sim.json", tmp_path / "sim.png"
    before = {p.pid for p in psutil.Process().children(recursive=True)}  # earlier tests' helpers, not ours
    small = ["simulate", "--devices", "3", "--rounds", "2", "--local-steps", "3", "--finetune-steps", "5",
             "--database", f"sqlite:///{tmp_path / 'server.db'}"]
    code = main([*small, "--seeds", "2", "--json", str(out), "--plot", str(png)])
    assert code == 0
    text = capsys.readouterr().out
    assert "personalized" in text and "on 3 of 3 devices" in text and "local-only" in text
    assert "mean over 2 seeds (95% confidence interval)" in text
    seeds = json.loads(out.read_text())
    assert seeds["format"] == "poet-edge/simulation-seeds" and [r["settings"]["seed"] for r in seeds["runs"]] == [0, 1]
    gaps = [r["gap_points"] for r in seeds["runs"]]
    assert seeds["mean"]["gap"] == pytest.approx(sum(gaps) / 2) and seeds["ci95"]["gap"] >= 0
    assert seeds["target_met"] == (seeds["mean"]["gap"] >= 3)
    report = seeds["runs"][0]
    # every device also trained alone with the same steps: the baseline the personalized model is held against
    assert all(0 <= d["local_accuracy"] <= 1 for d in report["devices"])
    best = max(report["mean_global_accuracy"], report["mean_local_accuracy"])
    assert report["gap_points"] == pytest.approx(100 * (report["mean_personal_accuracy"] - best))
    assert report["format"] == "poet-edge/simulation" and len(report["rounds"]) == 2
    assert report["settings"]["data"] == {"samples": 16, "label_alpha": 1.0, "viewpoints": 90.0, "holdout": 40}
    assert [d["device_class"] for d in report["devices"]] == ["large", "medium", "small"]
    assert all(d["within_budget"] and d["energy_j"] > 0 for d in report["devices"])
    assert len({d["budget_bytes"] for d in report["devices"]}) == 3  # each class its own budget (None: no limit)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not left  # the SuperLink, SuperExec and Ray are gone
    # the same seed again gives the same accuracies, budgets and energies (the same plans), device by device
    assert main([*small, "--seed", "1", "--seeds", "1", "--json", str(out)]) == 0
    again = json.loads(out.read_text())["runs"][0]["devices"]
    figures = ("global_accuracy", "personal_accuracy", "local_accuracy", "energy_j", "budget_bytes")
    assert [[d[k] for k in figures] for d in again] == [[d[k] for k in figures] for d in seeds["runs"][1]["devices"]]


def test_the_digits_model_is_profiled_once_and_profiled_again_when_its_graph_is_damaged(tmp_path, capsys) -> None:
    from simulation.profile import profile_once

    path = profile_once(0, tmp_path)
    assert "profiled the digits model on this machine once" in capsys.readouterr().err
    kept = path.read_bytes()
    assert profile_once(0, tmp_path) == path and path.read_bytes() == kept  # node times as first measured
    assert not capsys.readouterr().err
    path.write_text("{not json")
    assert TrainingGraph.load(profile_once(0, tmp_path)).fingerprint == TrainingGraph.from_dict(json.loads(kept)).fingerprint


def test_fleet_data_that_cannot_be_made_is_a_usage_error_before_anything_starts(capsys) -> None:
    assert main(["simulate", "--devices", "3", "--samples", "4"]) == 2
    assert "samples 4 is fewer than a batch of 16" in capsys.readouterr().err


def test_classes_parse_and_devices_cycle_through_them() -> None:
    classes = parse_classes("rpi4:0.6, rpi5")
    assert [(c.profile, c.budget_fraction) for c in classes] == [("rpi4", 0.6), ("rpi5", 1.0)]
    assert classes_config(classes) == "c0=rpi4:0.6,c1=rpi5:1.0"  # what the ClientApps read from the run config
    nodes = fleet_node_configs(5, DEFAULT_CLASSES)
    assert [n["device-class"] for n in nodes] == ["small", "medium", "large", "small", "medium"]
    assert [n["device-name"] for n in nodes][:2] == ["small-000", "medium-001"]
    assert len({n["partition-id"] for n in nodes}) == 5
    with pytest.raises(CommandError):
        parse_classes("rpi4:zero")


def test_the_report_judges_peaks_with_the_devices_own_memory_tolerance() -> None:
    from agent.training import DEFAULT_TOLERANCE_BYTES
    from simulation.report import MEMORY_TOLERANCE_BYTES

    assert MEMORY_TOLERANCE_BYTES == DEFAULT_TOLERANCE_BYTES


def test_a_failed_device_is_named_and_the_runs_logs_are_kept(tmp_path, capsys) -> None:
    code = main(["simulate", "--devices", "2", "--rounds", "1", "--local-steps", "2", "--finetune-steps", "0",
                 "--classes", "rpi4:0.05,jetson-orin-nano:1", "--database", f"sqlite:///{tmp_path / 'server.db'}"])
    err = capsys.readouterr().err
    assert code != 0 and "1 of 2 devices failed (c0-000" in err  # the class whose budget fits no schedule
    assert "none fits below" in err  # and why, with the smallest budget that might
    kept = err.split("logs are kept in ")[-1].split()[0]
    assert list(Path(kept).rglob("*.log"))  # what explains it outlives the run's scratch folder
