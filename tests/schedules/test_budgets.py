"""Searches over the memory budget: the bisection's answer is feasible and nothing below it is."""

import functools

import pytest

from schedules import PlanResult, plan
from schedules.budgets import (
    BUDGET_CLASS_BITS,
    budget_class,
    budget_points,
    memory_lower_bound,
    smallest_feasible_budget,
    store_all_peak,
    sweep,
)
from tests.schedules.graphs import linear_graph, required_bytes, resident_peak, unet_graph

GRAPHS = [linear_graph(5), unet_graph(2)]


def probe_for(graph, method: str, runtime: float | None = None):
    planner = functools.partial(plan, graph, method=method, runtime_budget=runtime)
    return lambda budget, time_limit: planner(memory_budget=budget, time_limit=time_limit)


def test_a_budget_class_is_at_most_the_budget_and_within_a_64th_of_it():
    budgets = [1, 2, 127, 128, 129, 255, 256, 5000, 5001, 10**6, 10**9 + 1, 3 * 2**30 - 1, 2**40 + 12345]
    for budget in budgets:
        cls = budget_class(budget)
        assert budget * (1 - 2 ** -(BUDGET_CLASS_BITS - 1)) <= cls <= budget, budget
        assert budget_class(cls) == cls  # a class is its own class
        assert bin(cls).rstrip("0").count("1") <= BUDGET_CLASS_BITS  # at most 7 significant bits
    assert [budget_class(b) for b in (1, 127, 128)] == [1, 127, 128]  # small budgets are exact
    assert budget_class(10**9) == budget_class(10**9 + 1) == budget_class(10**9 + 4096)  # a few bytes apart
    assert budget_class(10**9) < budget_class(int(10**9 * 1.02))  # 2 % apart: another class
    assert sorted(map(budget_class, budgets)) == list(map(budget_class, sorted(budgets)))  # monotone
    for bad in (0, -5):
        with pytest.raises(ValueError, match="positive"):
            budget_class(bad)


@pytest.mark.parametrize("graph", GRAPHS, ids=lambda g: g.model)
def test_anchors_match_independent_figures(graph):
    assert memory_lower_bound(graph) == required_bytes(graph)
    assert store_all_peak(graph) == resident_peak(graph)


@pytest.mark.parametrize("graph", GRAPHS, ids=lambda g: g.model)
@pytest.mark.parametrize("method, runtime", [("poet", 1.2), ("remat-only", 1.5), ("checkpoint-all", None),
                                             ("capuchin", 1.5), ("revolve", 1.5)])
def test_smallest_budget_is_feasible_and_tight(graph, method, runtime):
    probe = probe_for(graph, method, runtime)
    search = smallest_feasible_budget(graph, probe, rel_tolerance=0.0)
    if search.budget is None:  # this method has no schedule at any budget within the runtime limit
        assert not probe(store_all_peak(graph), None).feasible
        return
    assert search.exact
    assert probe(search.budget, None).feasible
    assert search.infeasible_below <= search.budget
    if search.infeasible_below > memory_lower_bound(graph):
        below = probe(search.infeasible_below - 1, None)
        assert not below.feasible and below.status == "infeasible"


def test_poet_with_free_paging_fits_the_lower_bound():
    graph = linear_graph(6)
    search = smallest_feasible_budget(graph, probe_for(graph, "poet"))
    assert search.budget == memory_lower_bound(graph) and search.exact and search.probes == 2


def test_store_all_needs_its_own_peak():
    graph = unet_graph(2)
    search = smallest_feasible_budget(graph, probe_for(graph, "store-all"), rel_tolerance=0.0)
    assert search.budget == store_all_peak(graph)


def test_probes_that_time_out_make_the_answer_approximate():
    graph = linear_graph(5)
    real = probe_for(graph, "poet")
    threshold = (memory_lower_bound(graph) + store_all_peak(graph)) // 2

    def slow_below_threshold(budget: int, time_limit: float | None) -> PlanResult:
        # A solver that gives up (no answer, no proof) on the harder, smaller budgets.
        if budget < threshold:
            return PlanResult(False, "no_solution", None, None, time_limit or 0.0, None, "poet")
        return real(budget, time_limit)

    search = smallest_feasible_budget(graph, slow_below_threshold, rel_tolerance=0.0)
    assert not search.exact and "time limit" in search.note
    assert search.budget is not None and real(search.budget, None).feasible  # approximate, but it works


def test_runtime_too_tight_for_any_budget():
    graph = linear_graph(5)
    search = smallest_feasible_budget(graph, probe_for(graph, "poet", runtime=0.9))
    assert search.budget is None and "runtime budget" in search.note


def test_budget_points_are_spread_and_distinct():
    assert budget_points(100, 200, 3) == [100, 150, 200]
    assert budget_points(100, 102, 8) == [100, 101, 102]
    assert budget_points(100, 200, 1) == [200]


def test_sweep_plans_every_method_at_every_budget():
    graph = linear_graph(4)
    budgets = budget_points(memory_lower_bound(graph), store_all_peak(graph), 3)
    seen = []
    points = sweep(budgets, ["poet", "store-all"], lambda m: probe_for(graph, m), on_point=seen.append)
    assert seen == points and len(points) == 6
    by = {(p.method, p.budget): p for p in points}
    top = budgets[-1]
    assert by["store-all", top].feasible and by["poet", top].energy_j <= by["store-all", top].energy_j + 1e-9
    assert not by["store-all", budgets[0]].feasible and by["store-all", budgets[0]].energy_j is None
    assert all(by["poet", b].feasible for b in budgets)


@pytest.mark.parametrize("method", ["poet", "checkpoint-all"])
def test_a_budget_below_the_floor_names_the_floor_on_this_cut_and_on_the_one_extraction_began_from(method):
    from dataclasses import replace

    from common.units import format_bytes

    reference = linear_graph(5)
    floor = memory_lower_bound(reference)
    below = plan(reference, memory_budget=floor - 1, method=method)
    assert not below.feasible and f"less than {format_bytes(floor)} on this cut" in below.message
    assert "refine" not in below.message  # a reference graph was not extracted here: no cut to refine
    coarse = replace(reference, cut=("a", "b"))  # extracted without refining
    assert "refine=True" in plan(coarse, memory_budget=floor - 1, method=method).message
    refined = replace(reference, cut=("a", "a.x", "b"), default_cut_floor_bytes=3 * floor)
    message = plan(refined, memory_budget=floor - 1, method=method).message
    assert f"{format_bytes(floor)} on this cut" in message and f"before refining, {format_bytes(3 * floor)}" in message
    # above the floor the budget is not the reason: no floor is named
    tight = plan(refined, memory_budget=floor, runtime_budget=0.5, method=method)
    assert not tight.feasible and "on this cut" not in tight.message
