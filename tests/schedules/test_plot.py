"""Schedule pictures: stages reconstructed from instructions, timelines and Pareto plots written."""

import numpy as np

from schedules import plan
from schedules.budgets import SweepPoint, memory_lower_bound
from schedules.plot import (
    COMPUTE,
    EMPTY,
    ON_FLASH,
    PAGE_IN,
    PAGE_OUT,
    RECOMPUTE,
    RESIDENT,
    instruction_positions,
    plot_pareto,
    plot_timeline,
    split_stages,
    stage_timeline,
)
from tests.schedules.graphs import linear_graph

PNG = b"\x89PNG\r\n\x1a\n"


def test_one_stage_per_node_with_recomputes_in_the_stage_that_needs_them():
    instructions = [("compute", 0), ("compute", 1), ("free", 0), ("page_out", 1), ("compute", 2),
                    ("free", 1), ("page_in", 1),  # stage 2's tail: free inputs, page in for stage 3
                    ("compute", 0), ("compute", 3), ("free", 0)]
    assert split_stages(instructions) == [0, 1, 1, 2, 2, 2, 2, 3, 3, 3]


def test_timeline_cells_tell_what_happened():
    graph = linear_graph(2)  # f0 f1 loss g1 g0
    instructions = [("compute", 0), ("page_out", 0), ("free", 0), ("compute", 1), ("compute", 2),
                    ("compute", 3), ("page_in", 0), ("compute", 4)]
    t = stage_timeline(graph, instructions)
    assert t.stages == graph.size
    assert [t.states[i, i] for i in range(graph.size)] == [COMPUTE] * graph.size
    assert t.states[0, 0] == COMPUTE  # page_out in the same stage does not hide the compute
    assert t.states[0, 1] == PAGE_OUT  # stage 1 began with paging node 0 out
    assert t.states[0, 2] == ON_FLASH and t.states[0, 3] == PAGE_IN and t.states[0, 4] == RESIDENT
    assert t.states[4, 0] == EMPTY


def test_recompute_is_its_own_colour():
    graph = linear_graph(2)
    instructions = [("compute", 0), ("compute", 1), ("free", 0), ("compute", 2), ("compute", 0),
                    ("compute", 3), ("compute", 4)]
    t = stage_timeline(graph, instructions)
    assert t.states[0, 3] == RECOMPUTE


def test_instruction_positions_fill_each_stage():
    xs = instruction_positions([0, 0, 1, 2, 2, 2])
    assert np.allclose(xs, [0.5, 1.0, 2.0, 2 + 1 / 3, 2 + 2 / 3, 3.0])


def test_plots_are_written(tmp_path):
    graph = linear_graph(6)
    result = plan(graph, memory_budget=memory_lower_bound(graph), runtime_budget=1.5)
    assert result.feasible
    timeline = plot_timeline(graph, result.schedule, tmp_path / "deep" / "t.png")
    assert timeline.read_bytes()[:8] == PNG
    points = [SweepPoint("poet", b, True, 1.0 + 1 / b, "optimal", 0.1) for b in (100, 200, 300)]
    points += [SweepPoint("store-all", 300, True, 1.0, "feasible", 0.0), SweepPoint("x", 100, False, None, "infeasible", 0)]
    pareto = plot_pareto(points, tmp_path / "p.png", store_all_peak=300)
    assert pareto.read_bytes()[:8] == PNG
