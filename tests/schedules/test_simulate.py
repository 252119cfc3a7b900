"""The simulator: replays accept valid schedules, measure them, and reject every broken rule by instruction."""

from dataclasses import replace

import pytest

from schedules.errors import ScheduleViolation
from schedules.simulate import simulate
from tests.schedules.graphs import linear_graph, resident_peak

# linear_graph(2): f0 (100 B) -> f1 (400 B) -> loss (4 B); g1 (400 B) reads f1, f0, loss; g0 (100 B) reads f0, g1.
F0, F1, LOSS, G1, G0 = range(5)
GRAPH = linear_graph(2)
STORE_ALL = [("compute", F0), ("compute", F1), ("compute", LOSS), ("compute", G1), ("free", F1), ("free", LOSS),
             ("compute", G0), ("free", F0), ("free", G1), ("free", G0)]


def replace_at(schedule, position, *instructions):
    """``schedule`` with the instruction at ``position`` replaced by ``instructions``."""
    return [*schedule[:position], *instructions, *schedule[position + 1:]]


def test_graph_is_the_one_the_hand_schedules_assume():
    assert [n.bytes for n in GRAPH.nodes] == [100, 400, 4, 400, 100]
    assert GRAPH.predecessors[G1] == (F0, F1, LOSS) and GRAPH.predecessors[G0] == (F0, G1)


def test_store_all_replay_measures_peak_runtime_and_energy():
    report = simulate(GRAPH, STORE_ALL)
    assert report.peak_bytes == 904 == resident_peak(GRAPH)
    assert report.runtime_ms == pytest.approx(GRAPH.total_compute_ms)
    assert report.energy_j == pytest.approx(sum(n.compute_j for n in GRAPH.nodes))
    assert report.recomputed_nodes == 0 and report.bytes_paged_out == 0
    assert report.resident_bytes[-1] == 0 and len(report.resident_bytes) == len(STORE_ALL)


def test_paging_is_charged_and_does_not_free_by_itself():
    paged = [("compute", F0), ("compute", F1), ("page_out", F0), ("free", F0), ("compute", LOSS),
             ("page_in", F0), *STORE_ALL[3:]]
    report = simulate(GRAPH, paged, paging_time_ms=([1.0] * 5, [2.0] * 5))
    assert report.resident_bytes[2] == 500  # page_out keeps the value resident until freed
    assert report.resident_bytes[3] == 400
    assert report.bytes_paged_out == report.bytes_paged_in == 100
    nodes = GRAPH.nodes
    assert report.energy_j == pytest.approx(sum(n.compute_j for n in nodes) + nodes[F0].pagein_j + nodes[F0].pageout_j)
    assert report.runtime_ms == pytest.approx(GRAPH.total_compute_ms + 3.0)


def test_overlapped_paging_runs_on_the_io_thread_within_the_runtime_budget():
    paged = [("compute", F0), ("compute", F1), ("page_out", F0), ("free", F0), ("compute", LOSS),
             ("page_in", F0), *STORE_ALL[3:]]
    io = ([30.0] * 5, [20.0] * 5)
    report = simulate(GRAPH, paged, io_time_ms=io)
    assert report.runtime_ms == pytest.approx(GRAPH.total_compute_ms)  # beside compute: no time added
    assert report.io_ms == pytest.approx(50.0)
    with pytest.raises(ScheduleViolation, match="I/O thread busy 50 ms, longer than the runtime budget of 49"):
        simulate(GRAPH, paged, io_time_ms=io, runtime_budget_ms=max(49.0, GRAPH.total_compute_ms))
    assert simulate(GRAPH, paged, io_time_ms=io, runtime_budget_ms=max(50.0, GRAPH.total_compute_ms)).io_ms == 50.0


def test_recomputation_is_counted():
    recomputing = [("compute", F0), ("compute", F1), ("free", F0), ("compute", LOSS), ("compute", F0),
                   *STORE_ALL[3:]]
    report = simulate(GRAPH, recomputing)
    assert report.recomputed_nodes == 1
    assert report.energy_j == pytest.approx(sum(n.compute_j for n in GRAPH.nodes) + GRAPH.nodes[F0].compute_j)


@pytest.mark.parametrize(
    "schedule, position, words",
    [
        pytest.param(replace_at(STORE_ALL, 1), 1, ["compute 2", "inputs [1] are not resident"], id="missing-input"),
        pytest.param(replace_at(STORE_ALL, 4, ("compute", G1)), 4, ["compute 3", "already resident"],
                     id="compute-resident"),
        pytest.param(replace_at(STORE_ALL, 4, ("free", G1), ("compute", G1)), 5,
                     ["compute 3", "backward node computed a second time"], id="backward-twice"),
        pytest.param(replace_at(STORE_ALL, 1, ("compute", F1), ("free", F0), ("page_in", F0)), 3,
                     ["page_in 0", "never paged out"], id="page-in-without-page-out"),
        pytest.param(replace_at(STORE_ALL, 1, ("page_out", F0), ("page_out", F0)), 2,
                     ["page_out 0", "already on flash"], id="page-out-twice"),
        pytest.param(replace_at(STORE_ALL, 1, ("free", F1)), 1, ["free 1", "not resident"], id="free-absent"),
        pytest.param(replace_at(STORE_ALL, 1, ("page_out", F1)), 1, ["page_out 1", "not resident"],
                     id="page-out-absent"),
        pytest.param(replace_at(STORE_ALL, 1, ("swap", F1)), 1, ["unknown op 'swap'"], id="unknown-op"),
        pytest.param(replace_at(STORE_ALL, 1, ("compute", 9)), 1, ["node 9 is not in the graph"], id="unknown-node"),
    ],
)
def test_broken_schedules_are_rejected_naming_the_instruction(schedule, position, words):
    with pytest.raises(ScheduleViolation) as caught:
        simulate(GRAPH, schedule)
    assert caught.value.position == position
    assert f"instruction {position}" in str(caught.value)
    for word in words:
        assert word in str(caught.value)


def test_over_budget_is_rejected_at_the_instruction_that_overflows():
    with pytest.raises(ScheduleViolation) as caught:
        simulate(GRAPH, STORE_ALL, memory_budget=903)
    assert caught.value.position == 3
    assert "instruction 3 (compute 3): 904 resident bytes exceed the budget of 903" in str(caught.value)
    assert simulate(GRAPH, STORE_ALL, memory_budget=904).peak_bytes == 904


def test_a_backward_node_never_computed_is_rejected():
    with pytest.raises(ScheduleViolation, match=r"backward nodes \[4\] are never computed") as caught:
        simulate(GRAPH, STORE_ALL[:4])
    assert caught.value.position is None


def test_runtime_over_budget_is_rejected():
    total = GRAPH.total_compute_ms
    assert simulate(GRAPH, STORE_ALL, runtime_budget_ms=total).runtime_ms == pytest.approx(total)
    with pytest.raises(ScheduleViolation, match="exceeds the runtime budget"):
        simulate(GRAPH, STORE_ALL, runtime_budget_ms=total * 0.99)


def test_workspace_counts_while_its_node_computes_and_is_given_back():
    heavy = GRAPH.with_nodes([replace(n, workspace_bytes=50) if i == G1 else n for i, n in enumerate(GRAPH.nodes)])
    report = simulate(heavy, STORE_ALL)
    assert report.resident_bytes == simulate(GRAPH, STORE_ALL).resident_bytes  # the values are what they were
    assert report.working_bytes[3] == 954  # compute g1: 904 resident + its 50 bytes of workspace
    assert report.working_bytes[4:] == report.resident_bytes[4:]  # given back once g1 is done
    assert (report.peak_bytes, report.peak_memory_bytes) == (904, 954)
    with pytest.raises(ScheduleViolation, match="904 resident bytes and 50 of workspace exceed the budget of 953"):
        simulate(heavy, STORE_ALL, memory_budget=953)
    assert simulate(heavy, STORE_ALL, memory_budget=954).peak_memory_bytes == 954
