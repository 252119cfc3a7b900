import json
from dataclasses import replace

import pytest

from schedules.errors import FormatError, UnsupportedVersionError
from schedules.graph import Node, TrainingGraph


def tiny_graph() -> TrainingGraph:
    """x -> a -> loss, with backward nodes for a and x."""
    nodes = (
        Node("x", "forward", "input", 0.0, 100),
        Node("a", "forward", "layer1", 2.0, 200),
        Node("loss", "loss", "loss", 1.0, 4),
        Node("grad_a", "backward", "layer1", 3.0, 200),
        Node("grad_x", "backward", "input", 1.0, 100),
    )
    edges = ((0, 1), (1, 2), (2, 3), (1, 3), (0, 3), (3, 4), (0, 4))
    return TrainingGraph(nodes=nodes, edges=edges, fixed_bytes=1000, model="tiny")


def test_reference_graphs_load_unchanged(poet_graphs):
    for path in sorted(poet_graphs.glob("*.json")):
        raw = json.loads(path.read_text())
        g = TrainingGraph.load(path)
        assert g.size == raw["T"]
        assert set(g.edges) == {tuple(e) for e in raw["edges"]}  # each listed dependency, once
        assert sorted(g.backward_nodes) == sorted(raw["backward"])
        assert [n.compute_j for n in g.nodes] == raw["compute_j"]
        # cost_cpu_ms holds seconds (FLOPs / FLOP/s); we keep milliseconds.
        assert [n.compute_ms for n in g.nodes] == [1000.0 * c for c in raw["cost_cpu_ms"]]
        assert [n.kind for n in g.nodes].count("loss") == 1
        assert g.fixed_bytes == int(raw["param_bytes"])
        assert g.has_energy


def test_round_trip_keeps_everything(tmp_path):
    g = tiny_graph()
    g.save(tmp_path / "g.json")
    again = TrainingGraph.load(tmp_path / "g.json")
    assert again == g
    assert again.fingerprint == g.fingerprint


def test_last_use_follows_forward_consumers_to_backward():
    g = tiny_graph()
    # x is read by grad_x (stage 4); a by grad_a (stage 3); loss by grad_a.
    assert g.last_use == (4, 3, 3, 4, 4)


def test_fingerprint_ignores_costs_but_not_structure():
    g = tiny_graph()
    slower = g.with_nodes(n.__class__(**{**n.__dict__, "compute_ms": n.compute_ms * 2}) for n in g.nodes)
    assert slower.fingerprint == g.fingerprint
    bigger = g.with_nodes(n.__class__(**{**n.__dict__, "bytes": n.bytes + 1}) for n in g.nodes)
    assert bigger.fingerprint != g.fingerprint


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["edges"].append([3, 1]), "goes backwards"),
        (lambda d: d["edges"].append([0, 9]), "outside"),
        (lambda d: d["edges"].append([0, 1]), "twice"),
        (lambda d: d["nodes"][1].update(kind="sideways"), "kind must be one of"),
        (lambda d: d["nodes"][1].update(bytes=-5), "bytes must be >= 0"),
        (lambda d: d["nodes"][1].update(compute_ms=float("nan")), "finite"),
        (lambda d: d["nodes"][4].update(kind="forward"), "before the first backward"),
        (lambda d: d.update(format="something-else"), "not a training graph"),
    ],
)
def test_malformed_graphs_are_rejected(mutate, message):
    data = tiny_graph().to_dict()
    mutate(data)
    with pytest.raises(FormatError, match=message):
        TrainingGraph.from_dict(data)


def test_unknown_version_is_refused():
    data = tiny_graph().to_dict()
    data["version"] = 99
    with pytest.raises(UnsupportedVersionError, match="version 99"):
        TrainingGraph.from_dict(data)


def test_unreadable_and_non_json_files_get_clear_errors(tmp_path):
    with pytest.raises(FormatError, match="cannot read"):
        TrainingGraph.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(FormatError, match="not valid JSON"):
        TrainingGraph.load(tmp_path / "bad.json")


def test_workspace_round_trips_and_stays_out_of_the_fingerprint(tmp_path):
    g = tiny_graph()
    heavy = g.with_nodes([replace(n, workspace_bytes=300) if n.name == "grad_a" else n for n in g.nodes])
    heavy.save(tmp_path / "g.json")
    assert TrainingGraph.load(tmp_path / "g.json") == heavy
    assert heavy.fingerprint == g.fingerprint  # a measurement of the machine, like time: same model
    old_file = g.to_dict()
    for node in old_file["nodes"]:
        del node["workspace_bytes"]  # a graph written before workspaces existed
    assert TrainingGraph.from_dict(old_file) == g
    with pytest.raises(FormatError, match="workspace_bytes"):
        g.with_nodes([replace(n, workspace_bytes=-1) for n in g.nodes])


def test_a_misspelt_field_is_refused_not_read_as_its_default():
    data = tiny_graph().to_dict()
    data["nodes"][1]["workspace_byte"] = 4096
    with pytest.raises(FormatError, match="unknown field.*workspace_byte"):
        TrainingGraph.from_dict(data)
    data = tiny_graph().to_dict()
    data["fixed_byte"] = 1
    with pytest.raises(FormatError, match="unknown field.*fixed_byte"):
        TrainingGraph.from_dict(data)


def test_node_names_are_unique_and_energies_non_negative():
    g = tiny_graph()
    with pytest.raises(FormatError, match="both named"):
        g.with_nodes([g.nodes[0], replace(g.nodes[1], name=g.nodes[0].name), *g.nodes[2:]])
    with pytest.raises(FormatError, match="energies must be non-negative"):
        g.with_nodes([replace(g.nodes[0], pagein_j=-1.0), *g.nodes[1:]])


def test_the_fingerprint_does_not_depend_on_the_order_edges_are_listed():
    g = tiny_graph()
    assert replace(g, edges=tuple(reversed(g.edges))).fingerprint == g.fingerprint
