"""Schedule pictures: stages reconstructed from instructions, timelines and Pareto plots written."""

import numpy as np

from schedules import METHODS, plan
from schedules.budgets import SweepPoint, memory_lower_bound
from schedules.plot import (
    COMPUTE,
    EMPTY,
    ON_FLASH,
    PAGE_IN,
    PAGE_OUT,
    RECOMPUTE,
    RESIDENT,
    curve_styles,
    dodge_offsets,
    flash_intervals,
    identical_to,
    instruction_positions,
    missing_points,
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


# -- the "on flash" band ---------------------------------------------------------------
def test_flash_band_ends_at_the_page_in_and_starts_again_at_the_next_page_out():
    instructions = [("compute", 0), ("page_out", 0), ("free", 0), ("compute", 1), ("page_in", 0),
                    ("compute", 2), ("page_out", 0), ("free", 0), ("page_in", 0)]
    stage_of = [0, 1, 1, 1, 3, 4, 5, 5, 7]
    assert flash_intervals(instructions, stage_of) == {0: [(1, 3), (5, 7)]}


def test_flash_band_of_a_copy_read_twice_waits_again_only_until_its_last_page_in():
    instructions = [("page_out", 0), ("free", 0), ("page_in", 0), ("free", 0), ("page_in", 0), ("free", 0)]
    assert flash_intervals(instructions, [1, 1, 3, 4, 6, 7]) == {0: [(1, 3), (4, 6)]}


def test_a_flash_copy_never_paged_in_draws_no_band():
    assert flash_intervals([("compute", 0), ("page_out", 0), ("free", 0), ("compute", 1)], [0, 1, 1, 1]) == {}


def test_timeline_band_stops_where_the_value_is_back_in_ram():
    graph = linear_graph(3)  # f0 f1 f2 loss g2 g1 g0
    instructions = [("compute", 0), ("page_out", 0), ("free", 0), ("compute", 1), ("compute", 2),
                    ("compute", 3), ("page_in", 0), ("compute", 4), ("free", 0),
                    ("compute", 5), ("compute", 6)]
    assert split_stages(instructions) == [0, 1, 1, 1, 2, 3, 3, 4, 4, 5, 6]
    t = stage_timeline(graph, instructions)
    row = list(t.states[0])
    assert row == [COMPUTE, PAGE_OUT, ON_FLASH, PAGE_IN, RESIDENT, EMPTY, EMPTY]


# -- Pareto plot ---------------------------------------------------------------------------
def _sweep() -> list[SweepPoint]:
    rows = {"poet": (7.9105, 7.9001, 7.8895), "remat-only": ("no_solution", 7.901, 7.8895),
            "paging-only": (7.9105, 7.9001, 7.8895), "store-all": ("infeasible", "infeasible", 7.8895),
            "checkpoint-all": ("infeasible", 10.493, 10.493), "sqrt-n": ("infeasible", 10.518, 10.518),
            "capuchin": (7.9105, 7.9001, 7.8895)}
    budgets = (262_144, 1_360_000, 2_453_760)
    points = []
    for k, budget in enumerate(budgets):
        for method, cells in rows.items():
            cell = cells[k]  # an energy, or the status of a budget without a schedule
            feasible = isinstance(cell, float)
            points.append(SweepPoint(method, budget, feasible, cell if feasible else None,
                                     "optimal" if feasible else cell, 1.0))
    return points


def test_methods_identical_to_an_earlier_one_say_so():
    notes = identical_to(_sweep())
    assert notes["paging-only"] == "same as poet" and notes["capuchin"] == "same as poet"
    assert notes["store-all"] == "same as poet"
    assert notes["remat-only"] == "same as poet at 2.45 MB"
    assert "poet" not in notes and "checkpoint-all" not in notes and "sqrt-n" not in notes


def test_coinciding_curves_get_distinct_sideways_shifts_and_others_stay_put():
    offsets = dodge_offsets(_sweep())
    assert offsets["poet"] == 0 and offsets["checkpoint-all"] == 0
    on_poet = [offsets[m] for m in ("poet", "remat-only", "paging-only", "store-all", "capuchin")]
    assert len(set(on_poet)) == len(on_poet)  # every curve lying on POET's has its own shift
    assert offsets["sqrt-n"] != offsets["checkpoint-all"]  # 10.518 J vs 10.493 J: within 1% of the axis


def test_missing_points_say_why():
    missing = {(m.method, m.budget): m for m in missing_points(_sweep())}
    assert set(missing) == {("remat-only", 262_144), ("store-all", 262_144), ("store-all", 1_360_000),
                            ("checkpoint-all", 262_144), ("sqrt-n", 262_144)}
    timeout, infeasible = missing["remat-only", 262_144], missing["store-all", 262_144]
    assert timeout.marker == "x" and "time limit" in timeout.reason
    assert infeasible.marker == "_" and "infeasible" in infeasible.reason
    odd = missing_points([SweepPoint("poet", 1, False, None, "error", 0.0)])[0]
    assert "error" in odd.reason


def test_pareto_plot_draws_a_store_all_peak_beyond_the_axis_and_a_method_never_feasible(tmp_path):
    points = _sweep() + [SweepPoint("never", b, False, None, "infeasible", 0.0) for b in (262_144, 2_453_760)]
    assert plot_pareto(points, tmp_path / "p.png", store_all_peak=5_000_000).read_bytes()[:8] == PNG


def test_every_method_has_its_own_colour_and_marker_whichever_others_are_drawn(tmp_path):
    every = curve_styles(METHODS)
    baselines = {m: style for m, style in every.items() if m != "poet"}
    assert "revolve" in baselines
    assert len({style["color"] for style in baselines.values()}) == len(baselines)
    assert len({style["marker"] for style in baselines.values()}) == len(baselines)
    some = curve_styles(["poet", "revolve", "mine"])
    assert some["revolve"] == every["revolve"] and some["poet"] == every["poet"]
    assert some["mine"]["color"] not in {baselines[m]["color"] for m in ("remat-only", "revolve")}
    points = _sweep() + [SweepPoint("revolve", b, e is not None, e, "feasible" if e else "infeasible", 0.1)
                         for b, e in ((262_144, None), (1_360_000, 8.9), (2_453_760, 7.8895))]
    assert plot_pareto(points, tmp_path / "p.png").read_bytes()[:8] == PNG
