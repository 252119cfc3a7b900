"""The walkthrough (`poet-edge walkthrough`) runs end to end and leaves a signed schedule and its pictures."""

import pytest

from schedules import Schedule, TrainingGraph, simulate
from schedules.budgets import store_all_peak
from demo.walkthrough import main, reference_graph_path, synthetic_graph
from schedules.signing import load_public_key


def check_outputs(out, graph_path):
    for name in ("schedule.json", "timeline.png", "pareto.png", "keys/demo.key", "keys/demo.pub"):
        assert (out / name).is_file(), name
    schedule = Schedule.load(out / "schedule.json", public_key=load_public_key(out / "keys" / "demo.pub"))
    assert simulate(TrainingGraph.load(graph_path), schedule).peak_bytes <= schedule.memory_budget


def test_synthetic_graph_is_valid_and_round_trips(tmp_path):
    graph = synthetic_graph(8)
    graph.save(tmp_path / "g.json")
    assert TrainingGraph.load(tmp_path / "g.json") == graph
    assert graph.size == 17 and len(graph.backward_nodes) == 8


def test_demo_plans_the_synthetic_graph_then_trains_a_model_on_this_machine(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--synthetic", "--out", str(out), "--points", "3", "--input", "4x3x32x32"]) == 0
    check_outputs(out, out / "synthetic_graph.json")
    # step 5: this machine's measured graph, planned below plain backpropagation's peak, run and checked
    graph = TrainingGraph.load(out / "resnet18_graph.json")
    schedule = Schedule.load(out / "resnet18_schedule.json", public_key=load_public_key(out / "keys" / "demo.pub"))
    assert schedule.memory_budget < store_all_peak(graph)
    assert simulate(graph, schedule).peak_memory_bytes <= schedule.memory_budget
    assert (out / "memory.png").read_bytes()[:4] == b"\x89PNG" and list((out / "swap").iterdir()) == []
    printed = capsys.readouterr().out
    assert "bit-identical to plain autograd" in printed and "demo finished" in printed
    assert main(["--synthetic", "--out", str(out), "--points", "3", "--no-device"]) == 0  # reuses the keys


@pytest.mark.slow
def test_demo_on_the_reference_graph(tmp_path, capsys):
    if reference_graph_path() is None:
        pytest.skip("POET reference graphs are not beside this checkout")
    out = tmp_path / "out"
    assert main(["--out", str(out)]) == 0
    check_outputs(out, reference_graph_path())
    assert "published objective" in capsys.readouterr().out
