"""plan(): POET against every baseline, infeasibility as a result, every output checked by the simulator."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedules import METHODS, PlanResult, UnknownNameError, plan, simulate
from schedules.baselines import HEURISTIC_BASELINES
from tests.schedules.graphs import (
    linear_graph,
    required_bytes,
    resident_peak,
    training_dags,
    training_graph,
    unet_graph,
)
from tests.schedules.test_baselines import SKIP_GRAPH, STALL_GRAPH

TIME_LIMIT = 20.0  # seconds; the graphs here solve in well under one
GAP = 1e-4  # plan()'s default relative MIP gap: POET may sit this far above the optimum
SMALL_GRAPHS = [linear_graph(n) for n in (2, 3, 5, 7)] + [unet_graph(1), unet_graph(2), SKIP_GRAPH]


def budgets(graph, count: int = 4) -> list[int]:
    """``count`` memory budgets from the least any stage needs up to the unconstrained peak."""
    low, high = required_bytes(graph), resident_peak(graph)
    return sorted({low + (high - low) * k // (count - 1) for k in range(count)})


def checked(graph, result: PlanResult) -> PlanResult:
    """A feasible result's schedule must replay within its own budgets and predict what the replay says."""
    if result.feasible:
        report = simulate(graph, result.schedule)
        assert report.peak_bytes == result.schedule.predicted_peak_bytes
        assert report.energy_j == pytest.approx(result.schedule.predicted_energy_j)
        assert report.energy_j <= result.objective_j * (1 + 1e-9) + 1e-12  # dropped redundancy only lowers it
    else:
        assert result.schedule is None and result.status in ("infeasible", "no_solution")
    return result


def plan_all(graph, memory_budget, runtime_budget=None) -> dict[str, PlanResult]:
    """Every method of plan() on one graph and budget, each result checked."""
    return {method: checked(graph, plan(graph, memory_budget=memory_budget, runtime_budget=runtime_budget,
                                        method=method, time_limit=TIME_LIMIT))
            for method in METHODS}


def assert_poet_is_best(results: dict[str, PlanResult]) -> None:
    """POET's energy is within the MIP gap of every feasible method's (all are points of its search space)."""
    poet = results["poet"]
    for method, result in results.items():
        if result.feasible:
            assert poet.feasible, f"{method} found a schedule where POET did not: {result.message}"
            assert poet.objective_j <= result.schedule.predicted_energy_j * (1 + GAP) + 1e-12, method


@pytest.mark.parametrize("graph", SMALL_GRAPHS, ids=lambda g: f"{g.model}-T{g.size}")
def test_poet_is_never_worse_than_any_feasible_baseline(graph):
    for budget in budgets(graph):
        assert_poet_is_best(plan_all(graph, budget))


@pytest.mark.parametrize("graph", SMALL_GRAPHS[:3], ids=lambda g: g.model)
def test_poet_is_never_worse_under_a_runtime_budget(graph):
    for budget in budgets(graph, 3):
        assert_poet_is_best(plan_all(graph, budget, runtime_budget=1.2))


@pytest.mark.parametrize("graph", [linear_graph(4), unet_graph(2), SKIP_GRAPH], ids=lambda g: g.model)
def test_unconstrained_poet_equals_store_all(graph):
    store_all = checked(graph, plan(graph, method="store-all"))
    for budget in (None, resident_peak(graph)):
        poet = checked(graph, plan(graph, memory_budget=budget, time_limit=TIME_LIMIT))
        assert poet.status == "optimal"
        assert poet.objective_j == pytest.approx(store_all.objective_j, rel=GAP)
        assert store_all.objective_j == pytest.approx(sum(n.compute_j for n in graph.nodes))


@pytest.mark.parametrize("method", METHODS)
def test_an_infeasible_memory_budget_is_a_result_not_an_exception(method):
    graph = linear_graph(4)
    result = checked(graph, plan(graph, memory_budget=required_bytes(graph) - 1, method=method,
                                 time_limit=TIME_LIMIT))
    assert (result.feasible, result.status, result.schedule, result.objective_j) == (False, "infeasible", None, None)
    assert result.method == method and result.message


@pytest.mark.parametrize("method", METHODS)
def test_an_infeasible_runtime_budget_is_a_result_not_an_exception(method):
    graph = linear_graph(4)
    result = checked(graph, plan(graph, runtime_budget=0.9, method=method, time_limit=TIME_LIMIT))
    assert (result.feasible, result.status) == (False, "infeasible")


def test_the_milp_accounting_decides_where_paging_right_after_compute_would_help():
    """SKIP_GRAPH: below 2598 bytes only paging g3 out in the stage that computes it would fit; POET
    (and capuchin, which keeps to POET's accounting) cannot, so both answer infeasible there."""
    tight = plan_all(SKIP_GRAPH, 2597)
    assert not tight["poet"].feasible and tight["poet"].status == "infeasible"
    assert not tight["capuchin"].feasible
    fits = plan_all(SKIP_GRAPH, 2598)
    assert fits["poet"].feasible and fits["capuchin"].feasible
    assert_poet_is_best(fits)


@pytest.mark.parametrize("preds, sizes, times, loss_bytes, budget, optimum", [
    ([[], [0], [0]], [420, 97, 420], [2.0, 0.1, 2.0], 13, 1358, 1.2885),
    ([[], [0], [0, 1], [0, 1], [1]], [10, 378, 300, 21, 594], [5.0, 0.0, 0.5, 0.5, 5.0], 7, 1849, 3.46),
], ids=["T7", "T11"])
def test_poet_schedule_keeps_the_budget_the_milp_solved_for(preds, sizes, times, loss_bytes, budget, optimum):
    """Regressions found by the random-DAG search: the dense reference formulation proves ``optimum``
    here; the decoded MILP solution must replay within the budget, not be refused by the simulator."""
    graph = training_graph(preds, sizes, times, loss_bytes=loss_bytes)
    result = checked(graph, plan(graph, memory_budget=budget, runtime_budget=1.0, time_limit=TIME_LIMIT))
    assert result.feasible, result.message
    assert result.objective_j == pytest.approx(optimum, rel=GAP)


def test_warm_start_does_not_change_the_optimum():
    graph = unet_graph(2)
    budget = budgets(graph)[2]
    cold = plan(graph, memory_budget=budget, warm_start=False, time_limit=TIME_LIMIT)
    warm = plan(graph, memory_budget=budget, warm_start=True, time_limit=TIME_LIMIT)
    assert cold.status == warm.status == "optimal"
    assert warm.objective_j == pytest.approx(cold.objective_j, rel=GAP)


def test_at_the_floor_the_milp_starts_from_a_schedule_where_capuchin_has_none():
    graph = STALL_GRAPH
    floor = required_bytes(graph)
    assert not plan(graph, memory_budget=floor, method="capuchin").feasible
    seen = []
    result = checked(graph, plan(graph, memory_budget=floor, progress=seen.append, time_limit=TIME_LIMIT))
    assert result.feasible and result.schedule.predicted_peak_bytes <= floor
    assert seen[0].incumbent_j is not None  # reported before the solver runs: the warm start


def test_capuchin_uses_the_device_paging_times():
    graph = linear_graph(8)
    budget = math.ceil(0.8 * resident_peak(graph))
    result = checked(graph, plan(graph, device="rpi4", memory_budget=budget, method="capuchin"))
    assert result.feasible and result.schedule.device == "rpi4"


@pytest.mark.parametrize("method", ["poet", "capuchin"])
def test_paging_beside_compute_still_needs_io_time_within_the_runtime_budget(method):
    from dataclasses import replace

    from schedules import DeviceProfile
    from schedules.device import paging_time_ms

    from tests.schedules.test_milp import chain_graph

    graph = chain_graph(8, seed=1)  # energies under which paging beats recomputing
    budget, runtime = math.ceil(0.5 * resident_peak(graph)), 2.0
    fast = DeviceProfile.builtin("rpi4")  # pages on an I/O thread beside compute
    paged = checked(graph, plan(graph, device=fast, memory_budget=budget, runtime_budget=runtime, method=method))
    assert paged.feasible and simulate(graph, paged.schedule).bytes_paged_out > 0
    # flash so slow that a single transfer outlasts the whole step: paging is out, however well it overlaps
    slow = replace(fast, pagein_bandwidth_bps=1.0, pageout_bandwidth_bps=1.0)
    result = checked(graph, plan(graph, device=slow, memory_budget=budget, runtime_budget=runtime, method=method))
    if method == "poet":  # recomputation still fits: the MILP finds it
        report = simulate(graph, result.schedule, io_time_ms=paging_time_ms(graph, slow))
        assert report.bytes_paged_out == 0 and report.io_ms == 0
    else:  # the greedy baseline has nothing else to try
        assert not result.feasible and "no schedule within these budgets" in result.message


def _slow_flash(bandwidth_bps: float):
    from dataclasses import replace

    from schedules import DeviceProfile

    return replace(DeviceProfile.builtin("rpi4"), pagein_bandwidth_bps=bandwidth_bps, pageout_bandwidth_bps=bandwidth_bps)


def test_an_overlapped_plan_that_misses_its_runtime_budget_in_the_io_timeline_is_replanned():
    from schedules.timeline import timeline_step_ms
    from tests.schedules.test_milp import chain_graph

    graph, slow = chain_graph(8, seed=4), _slow_flash(3e5)
    budget, runtime_ms = required_bytes(graph), 1.5 * graph.total_compute_ms
    unchecked = checked(graph, plan(graph, slow, memory_budget=budget, runtime_budget=1.5, check_timeline=False))
    # the I/O-thread row holds (transfers fit the budget), yet frees wait for writes and page-ins for reads
    assert unchecked.feasible and timeline_step_ms(graph, unchecked.schedule, slow) > runtime_ms
    assert unchecked.timeline_ms is None
    result = checked(graph, plan(graph, slow, memory_budget=budget, runtime_budget=1.5))
    # room to read each page ahead is enough here: paging time need not be counted
    assert result.feasible and not result.schedule.count_paging_time and "read each page ahead" in result.message
    assert result.timeline_ms == timeline_step_ms(graph, result.schedule, slow) <= runtime_ms * (1 + 1e-9)


def test_a_read_longer_than_a_node_gets_room_for_as_long_as_it_takes():
    from schedules.timeline import timeline_step_ms
    from tests.schedules.test_milp import chain_graph

    graph, slow = chain_graph(8, seed=0), _slow_flash(1e5)
    budget, runtime_ms = required_bytes(graph), 1.5 * graph.total_compute_ms
    one_node = checked(graph, plan(graph, slow, memory_budget=budget, runtime_budget=1.5, read_ahead="node",
                                   check_timeline=False))
    assert timeline_step_ms(graph, one_node.schedule, slow) > runtime_ms  # reads outlast the room beside one node
    result = checked(graph, plan(graph, slow, memory_budget=budget, runtime_budget=1.5))
    assert "for as long as its read takes" in result.message and not result.schedule.count_paging_time
    assert result.timeline_ms == timeline_step_ms(graph, result.schedule, slow) <= runtime_ms * (1 + 1e-9)


def test_read_ahead_takes_node_or_read():
    from schedules.errors import PlannerError
    from tests.schedules.test_milp import chain_graph

    graph = chain_graph(5)
    with pytest.raises(UnknownNameError, match="node, read"):
        plan(graph, "rpi4", read_ahead="always")
    with pytest.raises(PlannerError, match="device profile"):
        plan(graph, None, read_ahead="read")


def test_an_overlapped_plan_is_kept_with_a_warning_when_counting_paging_finds_nothing():
    from schedules.timeline import timeline_step_ms
    from tests.schedules.test_milp import chain_graph

    graph, slow = chain_graph(8, seed=1), _slow_flash(3e5)
    result = checked(graph, plan(graph, slow, memory_budget=required_bytes(graph), runtime_budget=1.1))
    assert result.feasible and not result.schedule.count_paging_time
    step_ms = timeline_step_ms(graph, result.schedule, slow)
    assert step_ms > 1.1 * graph.total_compute_ms and f"{step_ms:.0f} ms" in result.message
    assert result.timeline_ms == step_ms
    assert "no plan with read-ahead room or paging time counted does better" in result.message


def test_the_time_limit_is_the_whole_calls_replanning_included():
    import time

    from tests.schedules.test_milp import chain_graph

    # gap 0 on 40 nodes: no solve proves its plan within the limit, so each would take all it is given; the
    # overlapped plan misses its runtime budget in the I/O timeline on this flash, so plan() wants to replan
    graph, slow, limit = chain_graph(20, seed=4), _slow_flash(3e5), 2.0
    started = time.monotonic()
    result = plan(graph, slow, memory_budget=required_bytes(graph), runtime_budget=1.5, gap=0.0, time_limit=limit)
    wall = time.monotonic() - started
    checked(graph, result)
    assert wall <= 1.05 * limit + 0.3 and result.solve_seconds <= wall
    assert result.feasible and result.stop_reason == "time limit"
    # On a quiet machine the first plan misses the I/O timeline and the limit cuts the replanning short; with
    # less CPU the first solve may end at a plan that fits, and then nothing is replanned.
    if result.timeline_ms > 1.5 * graph.total_compute_ms:
        assert "the time limit (2 s) ended the replanning" in result.message
    else:
        assert result.replans == 0 and "replanning" not in result.message


def test_settings_come_as_keywords_or_as_options_not_both():
    from schedules.errors import PlannerError
    from schedules.plan import PlanOptions

    graph = unet_graph(2)
    budget = budgets(graph)[2]
    as_keywords = plan(graph, memory_budget=budget, gap=1e-6, time_limit=TIME_LIMIT)
    as_options = plan(graph, memory_budget=budget, options=PlanOptions(gap=1e-6, time_limit=TIME_LIMIT))
    assert as_options.objective_j == pytest.approx(as_keywords.objective_j, rel=1e-9)
    assert as_options.stop_reason == as_keywords.stop_reason and as_options.stop_reason in ("optimal", "gap reached")
    with pytest.raises(PlannerError, match="not both"):
        plan(graph, memory_budget=budget, gap=1e-6, options=PlanOptions(time_limit=TIME_LIMIT))


def test_a_heuristic_says_it_did_not_search():
    assert plan(linear_graph(4), method="sqrt-n").stop_reason == "heuristic"


def test_the_unhidden_share_of_overlapped_paging_is_counted_in_the_runtime_budget():
    from dataclasses import replace

    from schedules import DeviceProfile
    from schedules.device import paging_time_ms

    from tests.schedules.test_milp import chain_graph

    graph = chain_graph(8, seed=1)  # energies under which paging beats recomputing
    budget = math.ceil(0.5 * resident_peak(graph))
    hidden = DeviceProfile.builtin("rpi4")  # overlaps, nothing measured: paging is free of time
    assert hidden.paging_overlaps_compute and hidden.paging_hidden_fraction is None
    free = checked(graph, plan(graph, hidden, memory_budget=budget, runtime_budget=1.2))
    paged = simulate(graph, free.schedule)
    assert paged.bytes_paged_out > 0 and free.simulation.runtime_ms == pytest.approx(paged.runtime_ms)
    half = replace(hidden, paging_hidden_fraction=0.5)
    result = checked(graph, plan(graph, half, memory_budget=budget, runtime_budget=1.2))
    counted = simulate(graph, result.schedule, paging_time_ms=paging_time_ms(graph, half))
    compute = simulate(graph, result.schedule).runtime_ms
    # the planner's replay charges half of the schedule's paging time, and the budget holds with it
    assert result.simulation.runtime_ms == pytest.approx(compute + 0.5 * (counted.runtime_ms - compute))
    assert result.simulation.runtime_ms <= 1.2 * graph.total_compute_ms * (1 + 1e-9)
    # counting a share of paging time does not lift the I/O thread's bound: all transfers still run on it
    slow = replace(half, paging_hidden_fraction=0.99, pagein_bandwidth_bps=1e3, pageout_bandwidth_bps=1e3)
    bounded = checked(graph, plan(graph, slow, memory_budget=budget, runtime_budget=2.0, check_timeline=False))
    assert bounded.feasible  # by recomputing: a single transfer outlasts the step
    assert simulate(graph, bounded.schedule, io_time_ms=paging_time_ms(graph, slow)).io_ms <= \
        2.0 * graph.total_compute_ms * (1 + 1e-9)
    exposed = replace(hidden, paging_hidden_fraction=0.0)  # as if the CPU drove the transfers
    as_counted = plan(graph, hidden, memory_budget=budget, runtime_budget=1.2, count_paging_time=True)
    assert plan(graph, exposed, memory_budget=budget, runtime_budget=1.2).objective_j == \
        pytest.approx(as_counted.objective_j, rel=GAP)


def test_unknown_method_is_refused():
    with pytest.raises(UnknownNameError, match="unknown method"):
        plan(linear_graph(2), method="magic")


def test_every_heuristic_is_a_plan_method():
    assert set(HEURISTIC_BASELINES) <= set(METHODS)
    assert {"poet", "remat-only", "paging-only", "store-all", "checkpoint-all", "sqrt-n", "capuchin",
            "revolve"} <= set(METHODS)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=training_dags(max_forward=4), position=st.floats(0.0, 1.0))
def test_every_planner_passes_the_simulator_on_random_dags(graph, position):
    low, high = required_bytes(graph), resident_peak(graph)
    assert_poet_is_best(plan_all(graph, math.ceil(low + position * (high - low))))
