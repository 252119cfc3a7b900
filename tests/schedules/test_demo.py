"""The demo (`make demo`) runs end to end and leaves a signed schedule and its pictures."""

import pytest

from schedules import Schedule, TrainingGraph, simulate
from schedules.demo import main, reference_graph_path, synthetic_graph
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


def test_demo_on_the_synthetic_graph(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--synthetic", "--out", str(out), "--points", "3"]) == 0
    check_outputs(out, out / "synthetic_graph.json")
    assert "demo finished" in capsys.readouterr().out
    assert main(["--synthetic", "--out", str(out), "--points", "3"]) == 0  # a second run reuses the keys


@pytest.mark.slow
def test_demo_on_the_reference_graph(tmp_path, capsys):
    if reference_graph_path() is None:
        pytest.skip("POET reference graphs are not beside this checkout")
    out = tmp_path / "out"
    assert main(["--out", str(out)]) == 0
    check_outputs(out, reference_graph_path())
    assert "published objective" in capsys.readouterr().out
