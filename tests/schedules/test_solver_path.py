"""The solver path on the installed HiGHS and PuLP: every quick case of ``benchmarks.solver`` solves.

A HiGHS release can refuse a model over coefficients it calls too large, or
print on standard output; these tests fail on such a release before a user
does.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.solver import QUICK_CASES, case_budgets
from schedules.graph import TrainingGraph
from schedules.plan import plan
from schedules.simulate import simulate
from tests.conftest import reference_graph_dir


@pytest.mark.parametrize("name,memory,factor", QUICK_CASES, ids=[f"{n}-{m}-{f}" for n, m, f in QUICK_CASES])
def test_every_quick_case_solves_to_optimality_and_its_schedule_replays(name, memory, factor) -> None:
    graph = TrainingGraph.load(reference_graph_dir() / f"{name}.json")
    budget, runtime_ms = case_budgets(graph, memory, factor)
    result = plan(graph, memory_budget=budget, runtime_budget=factor, time_limit=60)
    assert result.status == "optimal", result.message
    report = simulate(graph, result.schedule, memory_budget=budget, runtime_budget_ms=runtime_ms)
    assert report.peak_memory_bytes <= budget
    assert report.energy_j <= result.objective_j * (1 + 1e-6)


@pytest.mark.parametrize("name,memory,factor", QUICK_CASES, ids=[f"{n}-{m}-{f}" for n, m, f in QUICK_CASES])
def test_every_quick_case_relaxes_and_rounds_to_a_plan_no_better_than_the_optimum(name, memory, factor) -> None:
    graph = TrainingGraph.load(reference_graph_dir() / f"{name}.json")
    budget, _ = case_budgets(graph, memory, factor)
    exact = plan(graph, memory_budget=budget, runtime_budget=factor, time_limit=60)
    rounded = plan(graph, memory_budget=budget, runtime_budget=factor, time_limit=60, relax_and_round=True)
    assert rounded.feasible
    assert rounded.objective_j >= exact.objective_j * (1 - 1e-6)


def test_solving_writes_nothing_on_standard_output() -> None:
    graph_file = reference_graph_dir() / "vgg16_cifar_m4.json"
    code = ("import sys; from schedules import TrainingGraph, plan; "
            f"plan(TrainingGraph.load({str(graph_file)!r}), memory_budget=1_500_000, runtime_budget=1.0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
