"""``poet-edge simulate`` end to end on a small fleet in Flower's simulation engine: figures, JSON, picture."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from schedules.cli import main
from schedules.errors import CommandError
from simulation.fleet import DEFAULT_CLASSES, classes_config, fleet_node_configs, parse_classes


def test_a_small_fleet_prints_accuracy_memory_and_energy_and_writes_json_and_png(tmp_path, capsys) -> None:
    out, png = tmp_path / "sim.json", tmp_path / "sim.png"
    before = {p.pid for p in psutil.Process().children(recursive=True)}  # earlier tests' helpers, not ours
    code = main(["simulate", "--devices", "3", "--rounds", "2", "--local-steps", "3", "--finetune-steps", "5",
                 "--json", str(out), "--plot", str(png), "--database", f"sqlite:///{tmp_path / 'server.db'}"])
    assert code == 0
    text = capsys.readouterr().out
    assert "personalized" in text and "on 3 of 3 devices" in text and "local-only" in text
    report = json.loads(out.read_text())
    # every device also trained alone with the same steps: the baseline the personalized model is held against
    assert all(0 <= d["local_accuracy"] <= 1 for d in report["devices"])
    best = max(report["mean_global_accuracy"], report["mean_local_accuracy"])
    assert report["gap_points"] == pytest.approx(100 * (report["mean_personal_accuracy"] - best))
    assert report["format"] == "poet-edge/simulation" and len(report["rounds"]) == 2
    assert [d["device_class"] for d in report["devices"]] == ["large", "medium", "small"]
    assert all(d["within_budget"] and d["energy_j"] > 0 for d in report["devices"])
    assert len({d["budget_bytes"] for d in report["devices"]}) == 3  # each class its own budget (None: no limit)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not left  # the SuperLink, SuperExec and Ray are gone


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
    kept = err.split("logs are kept in ")[-1].split()[0]
    assert list(Path(kept).rglob("*.log"))  # what explains it outlives the run's scratch folder
