"""The reduced POET MILP against the dense published formulation, and its contract.

The dense reference (:mod:`benchmarks.reference_milp`) is the oracle: on every
instance small enough to solve both ways, the optimum must be the same.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from benchmarks import reference_milp as reference
from schedules.errors import ScheduleViolation, SolverError
from schedules.graph import Node, TrainingGraph
from schedules.matrices import Matrices, to_instructions
from schedules.milp import (
    MilpOutcome, PoetFormulation, SolveProgress, build_pulp_problem, canonical_plan, plan_energy, solve_poet_milp,
)
from schedules.simulate import simulate
from tests.conftest import reference_graph_dir
from tests.schedules.graphs import with_workspace

EXACT = 1e-9  # gap asked of both solvers when optima are compared
SAME = 1e-6  # relative difference allowed between the two optima


def reference_graph(name: str) -> TrainingGraph:
    return TrainingGraph.load(reference_graph_dir() / f"{name}.json")


def chain_graph(n: int, seed: int = 0) -> TrainingGraph:
    """A linear network of ``n`` forward nodes (the last is the loss) and its ``n`` backward nodes.

    Backward node ``n + k`` is the gradient of forward node ``f = n - 1 - k``: it
    reads the previous gradient, ``f`` and ``f``'s input, like POET's linear
    graphs.  Every other forward node is cheap (an activation), so both
    recomputation and paging pay off somewhere.
    """
    rng = np.random.default_rng(seed)
    T = 2 * n
    edges = {(i, i + 1) for i in range(T - 1)}
    for k in range(n):
        f = n - 1 - k
        edges |= {(f, n + k)} | ({(f - 1, n + k)} if f >= 1 else set())
    nodes = []
    for i in range(T):
        kind = "backward" if i >= n else ("loss" if i == n - 1 else "forward")
        ms = float(rng.uniform(0.02, 0.1) if i % 2 and i < n else rng.uniform(0.5, 3.0))
        size = int(rng.integers(100, 1000))
        nodes.append(Node(name=f"n{i}", kind=kind, segment=str(i), compute_ms=ms, bytes=size,
                          compute_j=ms * 0.01, pagein_j=size * 1e-5, pageout_j=size * 2e-5))
    return TrainingGraph(nodes=tuple(nodes), edges=tuple(sorted(edges)), model=f"chain{n}")


def store_all_plan(graph: TrainingGraph) -> Matrices:
    """Plain backpropagation: compute once, keep each value until its last consumer."""
    m = Matrices.empty(graph.size)
    np.fill_diagonal(m.R, True)
    for i in range(graph.size):
        m.SRam[i + 1 : max(graph.successors[i], default=i) + 1, i] = True
    return m


def store_all_peak(graph: TrainingGraph) -> float:
    """The memory plain backpropagation needs, as the published model counts it."""
    return max(reference_peaks(graph, store_all_plan(graph)))


def well_scaled(graph: TrainingGraph) -> tuple[TrainingGraph, float]:
    """The graph with joules scaled so that store-all costs 1 J, and the scale.

    The published formulation states costs in raw joules; on ``linear_a72``
    (millijoules in all) they fall below HiGHS' tolerances and the dense
    solve stops above the optimum (at 4000 B: 0.0065926655 J against
    0.0065924163 J).  The oracle is therefore run on this copy.
    """
    scale = 1.0 / sum(n.compute_j for n in graph.nodes)
    nodes = (replace(n, compute_j=n.compute_j * scale, pagein_j=n.pagein_j * scale, pageout_j=n.pageout_j * scale)
             for n in graph.nodes)
    return graph.with_nodes(nodes), scale


def exact_pair(graph: TrainingGraph, gap: float = EXACT, **budgets) -> tuple[MilpOutcome, object]:
    """Our solve and the dense reference's (on the well-scaled copy, reported back in joules)."""
    ours = solve_poet_milp(graph, gap=gap, **budgets)
    scaled, scale = well_scaled(graph)
    dense = reference.solve_reference(scaled, gap=gap, **budgets)
    joules = None if dense.objective_j is None else dense.objective_j / scale
    return ours, replace(dense, objective_j=joules)


def assert_same_optimum(ours: MilpOutcome, dense) -> None:
    assert dense.status == "optimal"
    assert ours.status == "optimal"
    assert ours.objective_j == pytest.approx(dense.objective_j, rel=SAME)


def assert_feasible_in_published_model(graph: TrainingGraph, m: Matrices, **budgets) -> None:
    """Fix the dense model's decisions to ``m``: it must stay feasible with the same energy."""
    scaled, scale = well_scaled(graph)
    dense = reference.ReferenceMilp(scaled, **budgets)
    for name in ("R", "SRam", "SSd", "MIn", "MOut"):
        grid, values = getattr(dense, name), getattr(m, name)
        for t in range(graph.size):
            for i in range(graph.size):
                grid[t][i].lowBound = grid[t][i].upBound = int(values[t, i])
    result = dense.solve()
    assert result.status == "optimal"
    assert result.objective_j / scale == pytest.approx(plan_energy(graph, m), rel=1e-9)


# -- the matrices obey the published constraints -----------------------------------------


def reference_peaks(graph: TrainingGraph, m: Matrices) -> list[float]:
    """Peak of the published U recurrence in each stage (plus a computing node's workspace), from the matrices."""
    T, size = graph.size, [n.bytes for n in graph.nodes]
    peaks = []
    for t in range(T):
        current = float(sum(size[i] for i in range(T) if m.SRam[t, i]))
        peak = current
        for k in range(T):
            if not m.R[t, k]:
                continue
            current += size[k]
            peak = max(peak, current + graph.nodes[k].workspace_bytes)
            for i in graph.predecessors[k]:
                kept = t + 1 < T and m.SRam[t + 1, i]
                if not kept and not any(m.R[t, j] for j in graph.successors[i] if j > k):
                    current -= size[i]
        peaks.append(peak)
    return peaks


def assert_valid(graph: TrainingGraph, m: Matrices, memory_budget: float | None = None,
                 runtime_budget_ms: float | None = None) -> None:
    """Every constraint of the published formulation, checked with numpy."""
    T = graph.size
    lower = np.tril(np.ones((T, T), dtype=bool))
    strict = np.tril(np.ones((T, T), dtype=bool), -1)
    assert m.R.diagonal().all()
    assert not (m.R & ~lower).any() and not (m.MIn & ~lower).any() and not (m.MOut & ~lower).any()
    assert not (m.SRam & ~strict).any() and not (m.SSd & ~strict).any()
    for u, v in graph.edges:
        assert not (m.R[:, v] & ~(m.R[:, u] | m.SRam[:, u])).any(), f"edge {(u, v)}"
    assert not (m.SRam[1:] & ~(m.SRam[:-1] | m.R[:-1] | m.MIn[:-1])).any()
    assert not (m.SSd[1:] & ~(m.SSd[:-1] | m.MOut[:-1])).any()
    assert not (m.MIn & ~m.SSd).any() and not (m.MOut & ~m.SRam).any()
    for b in graph.backward_nodes:
        assert m.R[:, b].sum() == 1
    if memory_budget is not None:
        assert max(reference_peaks(graph, m)) <= memory_budget * (1 + 1e-9)
    if runtime_budget_ms is not None:
        ms = np.array([n.compute_ms for n in graph.nodes])
        assert (m.R.sum(axis=0) @ ms) <= runtime_budget_ms * (1 + 1e-9)


# -- optimum equals the dense reference ------------------------------------------------------


@pytest.mark.parametrize("memory", [6000, 4500, 4000])
def test_linear_reference_graph_has_the_dense_optimum(memory: int) -> None:
    graph = reference_graph("linear_a72")
    budgets = dict(memory_budget=memory, runtime_budget_ms=1.2 * graph.total_compute_ms)
    ours, dense = exact_pair(graph, **budgets)
    assert_same_optimum(ours, dense)
    assert_valid(graph, ours.matrices, memory, budgets["runtime_budget_ms"])
    assert_feasible_in_published_model(graph, ours.matrices, **budgets)


@pytest.mark.parametrize("seed, fraction, factor, workspace", [
    (1, 0.6, 1.2, 0.0), (1, 0.7, 1.05, 0.0), (8, 0.6, None, 0.0), (0, 0.7, 1.5, 0.0), (7, 0.6, 1.1, 0.0),
    (2, 0.6, 1.5, 0.0),
    (2, 0.75, 1.05, 0.0),  # HiGHS 1.15 presolve lost this optimum when U was free below with equality rows
    # backward nodes holding a workspace while they compute (our rows U[t,k] + w_k R[t,k] <= budget)
    (0, 0.7, 1.5, 0.8), (1, 0.6, 1.5, 0.8), (2, 0.8, 1.5, 0.8), (4, 0.7, 1.5, 0.8), (3, 0.6, 1.5, 0.8),
])
def test_synthetic_chain_has_the_dense_optimum(seed: int, fraction: float, factor: float | None,
                                               workspace: float) -> None:
    graph = with_workspace(chain_graph(7, seed=seed), workspace)
    budgets = dict(memory_budget=fraction * store_all_peak(graph),
                   runtime_budget_ms=None if factor is None else factor * graph.total_compute_ms)
    ours, dense = exact_pair(graph, **budgets)
    if dense.status == "infeasible":
        assert ours.status == "infeasible"
        return
    assert_same_optimum(ours, dense)
    assert_valid(graph, ours.matrices, **budgets)
    assert_feasible_in_published_model(graph, ours.matrices, **budgets)
    replay = simulate(graph, to_instructions(graph, ours.matrices), memory_budget=budgets["memory_budget"])
    assert (replay.peak_memory_bytes > replay.peak_bytes) == bool(workspace)  # the workspace was there and fit


@pytest.mark.parametrize("paging, remat", [(False, True), (True, False)])
def test_switches_have_the_dense_optimum(paging: bool, remat: bool) -> None:
    graph = chain_graph(6, seed=8)
    budgets = dict(memory_budget=0.7 * store_all_peak(graph), runtime_budget_ms=1.5 * graph.total_compute_ms,
                   paging=paging, remat=remat)
    ours, dense = exact_pair(graph, **budgets)
    assert ours.status == dense.status
    if dense.status == "optimal":
        assert ours.objective_j == pytest.approx(dense.objective_j, rel=SAME)


def test_a_plan_blind_to_workspace_breaks_the_budget_the_aware_plan_keeps() -> None:
    blind_graph = chain_graph(7, seed=1)
    graph = with_workspace(blind_graph)
    budgets = dict(memory_budget=0.7 * store_all_peak(graph), runtime_budget_ms=1.5 * graph.total_compute_ms)
    blind = solve_poet_milp(blind_graph, **budgets)
    aware = solve_poet_milp(graph, **budgets)
    with pytest.raises(ScheduleViolation, match="of workspace exceed the budget"):
        simulate(graph, to_instructions(graph, blind.matrices), memory_budget=budgets["memory_budget"])
    simulate(graph, to_instructions(graph, aware.matrices), memory_budget=budgets["memory_budget"])
    assert aware.objective_j >= blind.objective_j * (1 - 1e-9)


# -- the contract ------------------------------------------------------------------------


@pytest.mark.parametrize("graph", [chain_graph(6), "linear_a72"], ids=["chain", "linear_a72"])
def test_unconstrained_budget_gives_the_store_all_energy(graph) -> None:
    graph = reference_graph(graph) if isinstance(graph, str) else graph
    outcome = solve_poet_milp(graph, memory_budget=None, runtime_budget_ms=None)
    assert outcome.status == "optimal"
    assert outcome.objective_j == pytest.approx(sum(n.compute_j for n in graph.nodes), rel=1e-12)
    costly = [i for i, n in enumerate(graph.nodes) if n.compute_j > 0]  # free nodes may be recomputed at no cost
    assert (outcome.matrices.R[:, costly] == np.eye(graph.size, dtype=bool)[:, costly]).all()
    assert not outcome.matrices.MIn.any() and not outcome.matrices.MOut.any()
    assert_valid(graph, outcome.matrices)


def test_a_budget_below_the_largest_stage_is_infeasible_not_an_error() -> None:
    graph = chain_graph(5)
    outcome = solve_poet_milp(graph, memory_budget=10, runtime_budget_ms=None)
    assert outcome.status == "infeasible"
    assert outcome.matrices is None and outcome.objective_j is None


def test_no_recomputation_time_and_no_paging_is_infeasible_under_a_tight_budget() -> None:
    graph = chain_graph(6, seed=8)
    outcome = solve_poet_milp(graph, memory_budget=0.7 * store_all_peak(graph),
                              runtime_budget_ms=graph.total_compute_ms, paging=False)
    assert outcome.status == "infeasible"


def test_paging_off_never_pages_and_remat_off_never_recomputes() -> None:
    graph = chain_graph(6, seed=8)
    budgets = dict(memory_budget=0.7 * store_all_peak(graph), runtime_budget_ms=2.0 * graph.total_compute_ms)
    both = solve_poet_milp(graph, **budgets)
    remat_only = solve_poet_milp(graph, paging=False, **budgets)
    paging_only = solve_poet_milp(graph, remat=False, **budgets)
    assert not (remat_only.matrices.MIn.any() or remat_only.matrices.MOut.any() or remat_only.matrices.SSd.any())
    assert (paging_only.matrices.R == np.eye(graph.size, dtype=bool)).all()
    for restricted in (remat_only, paging_only):
        assert restricted.objective_j >= both.objective_j * (1 - 1e-6)
        assert_valid(graph, restricted.matrices, **budgets)


def test_objective_is_the_energy_of_the_returned_matrices() -> None:
    graph = chain_graph(6, seed=4)
    outcome = solve_poet_milp(graph, memory_budget=0.7 * store_all_peak(graph), runtime_budget_ms=None)
    assert outcome.objective_j == pytest.approx(plan_energy(graph, outcome.matrices), rel=1e-12)
    assert outcome.bound_j <= outcome.objective_j * (1 + 1e-9)
    assert 0.0 <= outcome.gap <= 1e-4


def test_warm_start_and_progress() -> None:
    graph = chain_graph(7, seed=5)
    budgets = dict(memory_budget=0.7 * store_all_peak(graph), runtime_budget_ms=1.5 * graph.total_compute_ms)
    first = solve_poet_milp(graph, **budgets)
    seen: list[SolveProgress] = []
    again = solve_poet_milp(graph, warm_start=first.matrices, progress=seen.append, **budgets)
    assert again.objective_j <= first.objective_j * (1 + 1e-12)
    assert seen and all(isinstance(p, SolveProgress) for p in seen)
    assert seen[0].incumbent_j == pytest.approx(first.objective_j, rel=1e-9)  # the warm start is the first incumbent
    assert all(p.bound_j is None or p.incumbent_j is None or p.bound_j <= p.incumbent_j * (1 + 1e-9) for p in seen)


def test_a_warm_start_that_pages_late_is_moved_where_the_model_expects_it() -> None:
    graph = chain_graph(7, seed=1)
    budgets = dict(memory_budget=0.7 * store_all_peak(graph), runtime_budget_ms=1.05 * graph.total_compute_ms)
    best = solve_poet_milp(graph, **budgets).matrices
    assert best.MOut.any()
    late = Matrices(best.R.copy(), best.SRam.copy(), best.SSd.copy(), best.MIn.copy(), best.MOut.copy())
    for t, i in np.argwhere(best.MOut):  # page out one stage later, keeping the value resident meanwhile
        late.MOut[t, i], late.MOut[t + 1, i] = False, True
        late.SRam[t + 1, i] = True
        late.SSd[t + 1, i] = False
    assert_valid(graph, late)
    canonical = canonical_plan(graph, late)
    assert plan_energy(graph, canonical) == pytest.approx(plan_energy(graph, late), rel=1e-12)
    assert max(reference_peaks(graph, canonical)) <= max(reference_peaks(graph, late))
    assert_valid(graph, canonical, **budgets)
    seen: list[SolveProgress] = []
    solve_poet_milp(graph, warm_start=late, progress=seen.append, time_limit=5, **budgets)
    assert seen[0].incumbent_j <= plan_energy(graph, late) * (1 + 1e-12)


def test_cbc_finds_the_same_optimum() -> None:
    graph = chain_graph(5, seed=6)
    budgets = dict(memory_budget=0.7 * store_all_peak(graph), runtime_budget_ms=1.5 * graph.total_compute_ms)
    highs = solve_poet_milp(graph, gap=EXACT, **budgets)
    cbc = solve_poet_milp(graph, solver="cbc", gap=EXACT, **budgets)
    assert cbc.status == "optimal"
    assert cbc.objective_j == pytest.approx(highs.objective_j, rel=SAME)
    assert_valid(graph, cbc.matrices, **budgets)


def test_relax_and_round_returns_a_valid_plan_with_its_gap_to_the_lp_bound() -> None:
    graph = chain_graph(8, seed=7)
    budgets = dict(memory_budget=0.6 * store_all_peak(graph), runtime_budget_ms=1.5 * graph.total_compute_ms)
    exact = solve_poet_milp(graph, gap=EXACT, **budgets)
    rounded = solve_poet_milp(graph, relax_and_round=True, **budgets)
    assert rounded.status in ("optimal", "feasible")
    assert_valid(graph, rounded.matrices, **budgets)
    assert rounded.bound_j <= exact.objective_j * (1 + 1e-9) <= rounded.objective_j * (1 + 1e-9)
    assert rounded.gap == pytest.approx((rounded.objective_j - rounded.bound_j) / rounded.objective_j, abs=1e-9)


def test_paging_time_counts_against_the_runtime_budget() -> None:
    graph = chain_graph(6, seed=8)
    budgets = dict(memory_budget=0.7 * store_all_peak(graph), runtime_budget_ms=3.0 * graph.total_compute_ms)
    free = solve_poet_milp(graph, remat=False, **budgets)
    assert free.status == "optimal" and free.matrices.MIn.any()
    slow_io = ([10 * graph.total_compute_ms] * graph.size,) * 2  # any page-in alone breaks the budget
    counted = solve_poet_milp(graph, remat=False, paging_time_ms=slow_io, **budgets)
    assert counted.status == "infeasible"


def test_overlapped_paging_still_fits_the_io_thread_in_the_runtime_budget() -> None:
    graph = chain_graph(8, seed=1)
    budgets = dict(memory_budget=0.5 * store_all_peak(graph), runtime_budget_ms=2.0 * graph.total_compute_ms)
    io = ([0.4 * graph.total_compute_ms] * graph.size,) * 2  # slow flash: five transfers fill the whole budget
    free = solve_poet_milp(graph, gap=EXACT, **budgets)
    with pytest.raises(ScheduleViolation, match="I/O thread busy"):
        simulate(graph, to_instructions(graph, free.matrices), io_time_ms=io, **budgets)
    bounded = solve_poet_milp(graph, gap=EXACT, io_time_ms=io, **budgets)
    assert bounded.status == "optimal"
    report = simulate(graph, to_instructions(graph, bounded.matrices), io_time_ms=io, **budgets)
    assert report.io_ms <= budgets["runtime_budget_ms"]
    assert report.runtime_ms <= budgets["runtime_budget_ms"] * (1 + 1e-9)  # I/O is not added to compute
    # it recomputes what it can no longer page, at a little more energy
    assert bounded.matrices.R.sum() > free.matrices.R.sum()
    assert bounded.objective_j > free.objective_j


def _pages_without_read_ahead(graph: TrainingGraph, mats: Matrices, budget: float) -> tuple[int, int]:
    """(page-ins, page-ins the executor cannot read ahead): :func:`schedules.timeline.plan_io` on the plan."""
    from schedules.timeline import plan_io

    instructions = to_instructions(graph, mats)
    report = simulate(graph, instructions)
    io = plan_io(instructions, [n.bytes for n in graph.nodes], report.working_bytes, int(budget))
    ahead = {node for nodes in io.reads.values() for node in nodes}
    page_ins = [node for op, node in instructions if op == "page_in"]
    return len(page_ins), sum(node not in ahead for node in page_ins)


@pytest.mark.parametrize("n, seed, share", [(10, 4, 0.5), (8, 10, 0.6)])
def test_read_ahead_leaves_room_to_read_every_page_in_ahead(n: int, seed: int, share: float) -> None:
    from tests.schedules.graphs import resident_peak

    graph = chain_graph(n, seed=seed)
    budget = float(int(share * resident_peak(graph)))
    published = solve_poet_milp(graph, memory_budget=budget, runtime_budget_ms=None, gap=EXACT)
    assert _pages_without_read_ahead(graph, published.matrices, budget)[1] > 0  # a page-in waits for its read
    roomy = solve_poet_milp(graph, memory_budget=budget, runtime_budget_ms=None, gap=EXACT, read_ahead=True)
    page_ins, waiting = _pages_without_read_ahead(graph, roomy.matrices, budget)
    assert roomy.status == "optimal" and page_ins > 0 and waiting == 0  # it still pages, every read ahead
    assert roomy.objective_j >= published.objective_j * (1 - 1e-9)  # a restriction of the published model
    simulate(graph, to_instructions(graph, roomy.matrices), memory_budget=budget)


def _reads_not_in_time(graph: TrainingGraph, mats: Matrices, budget: float, read_ms: list[float]) -> tuple[int, int]:
    """(page-ins, page-ins whose read, started where :func:`schedules.timeline.plan_io` starts it, is not done by
    its ``page_in``: less compute between them than the read takes)."""
    from schedules.timeline import plan_io

    instructions = to_instructions(graph, mats)
    report = simulate(graph, instructions)
    io = plan_io(instructions, [n.bytes for n in graph.nodes], report.working_bytes, int(budget),
                 [n.compute_ms for n in graph.nodes], read_ms)
    elapsed = np.cumsum([0.0] + [graph.nodes[n].compute_ms if op == "compute" else 0.0 for op, n in instructions])
    starts: dict[int, list[int]] = {}
    for position, nodes in io.reads.items():
        for node in nodes:
            starts.setdefault(node, []).append(position)
    page_ins = [(p, n) for p, (op, n) in enumerate(instructions) if op == "page_in"]
    late = sum(elapsed[p] - elapsed[max([q for q in starts.get(n, []) if q < p], default=p)] < read_ms[n] - 1e-9
               for p, n in page_ins)
    return len(page_ins), late


@pytest.mark.parametrize("n, seed, share", [(12, 3, 0.6), (8, 10, 0.6)])
def test_read_ahead_room_spans_as_many_stages_as_a_slow_read_takes(n: int, seed: int, share: float) -> None:
    from tests.schedules.graphs import resident_peak

    graph = chain_graph(n, seed=seed)
    budget = float(int(share * resident_peak(graph)))
    read_ms = [2.5 * graph.total_compute_ms / graph.size] * graph.size  # flash: a read outlasts a node
    one_stage = solve_poet_milp(graph, memory_budget=budget, runtime_budget_ms=None, gap=EXACT, read_ahead=True)
    assert _reads_not_in_time(graph, one_stage.matrices, budget, read_ms)[1] > 0
    timed = solve_poet_milp(graph, memory_budget=budget, runtime_budget_ms=None, gap=EXACT, read_ahead=True,
                            read_ahead_ms=read_ms)
    page_ins, late = _reads_not_in_time(graph, timed.matrices, budget, read_ms)
    assert timed.status == "optimal" and page_ins > 0 and late == 0  # still pages, every read done in time
    assert timed.objective_j >= one_stage.objective_j * (1 - 1e-9)  # a restriction of the one-stage room
    simulate(graph, to_instructions(graph, timed.matrices), memory_budget=budget)


def test_every_outcome_says_why_the_search_ended() -> None:
    from schedules.milp import STOP_REASONS

    graph = chain_graph(6, seed=8)
    budgets = dict(memory_budget=0.7 * store_all_peak(graph), runtime_budget_ms=1.5 * graph.total_compute_ms)
    assert solve_poet_milp(graph, memory_budget=None, runtime_budget_ms=None).stop_reason == "optimal"  # store-all
    assert solve_poet_milp(graph, gap=EXACT, **budgets).stop_reason in ("optimal", "gap reached")
    assert solve_poet_milp(graph, memory_budget=10, runtime_budget_ms=None).stop_reason == "infeasible"
    hard = chain_graph(20, seed=4)  # gap 0 on 40 nodes: not proven in a second
    stopped = solve_poet_milp(hard, memory_budget=0.5 * store_all_peak(hard), runtime_budget_ms=None, gap=0.0,
                              time_limit=1.0)
    assert (stopped.status, stopped.stop_reason) == ("feasible", "time limit") and stopped.gap > 0
    rounded = solve_poet_milp(hard, memory_budget=0.5 * store_all_peak(hard), runtime_budget_ms=None, gap=0.0,
                              relax_and_round=True, time_limit=20)
    assert rounded.stop_reason == ("relax and round" if rounded.status == "feasible" else "optimal")
    assert {"optimal", "gap reached", "time limit", "infeasible", "relax and round"} <= set(STOP_REASONS)


def test_io_time_columns_must_cover_the_graph() -> None:
    graph = chain_graph(4)
    with pytest.raises(SolverError, match="io_time_ms needs"):
        solve_poet_milp(graph, memory_budget=None, runtime_budget_ms=None, io_time_ms=([1.0], [1.0]))
    with pytest.raises(SolverError, match="read_ahead_ms needs"):
        solve_poet_milp(graph, memory_budget=None, runtime_budget_ms=None, read_ahead=True, read_ahead_ms=[1.0])
    with pytest.raises(SolverError, match="pass read_ahead=True"):  # read times without the room: not ignored
        solve_poet_milp(graph, memory_budget=None, runtime_budget_ms=None, read_ahead_ms=[1.0] * graph.size)


def test_the_pulp_model_is_the_same_model() -> None:
    graph = chain_graph(5, seed=0)
    budgets = dict(memory_budget=0.8 * store_all_peak(graph), runtime_budget_ms=1.5 * graph.total_compute_ms)
    form = PoetFormulation(graph, **budgets)
    problem, variables = build_pulp_problem(form.model)
    assert len(variables) == form.model.num_cols
    import pulp
    problem.solve(pulp.HiGHS(msg=False, gapRel=EXACT, gapAbs=0.0))
    ours = solve_poet_milp(graph, gap=EXACT, **budgets)
    assert pulp.value(problem.objective) * form.energy_scale == pytest.approx(ours.objective_j, rel=SAME)


@pytest.mark.parametrize("kwargs", [dict(solver="gurobi"), dict(gap=-1.0), dict(threads=0), dict(time_limit=0)])
def test_bad_arguments_raise_solver_error(kwargs) -> None:
    with pytest.raises(SolverError):
        solve_poet_milp(chain_graph(3), memory_budget=None, runtime_budget_ms=None, **kwargs)


def test_a_graph_without_energies_is_refused_with_a_hint() -> None:
    graph = chain_graph(3)
    bare = graph.with_nodes(n.__class__(n.name, n.kind, n.segment, n.compute_ms, n.bytes) for n in graph.nodes)
    with pytest.raises(SolverError, match="price"):
        solve_poet_milp(bare, memory_budget=None, runtime_budget_ms=None)


# -- the reference graphs of the README (slow) ---------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name, memory, factor", [
    ("vgg16_cifar_m4", 1_500_000, 1.5),
    ("resnet18_cifar_a72", 3_000_000, 7.6),
    ("transformer_a72", 34_000_000, 1.2),  # between its floor (31.5 MB) and store-all (37.7 MB)
])
def test_reference_graphs_have_the_dense_optimum(name: str, memory: int, factor: float) -> None:
    graph = reference_graph(name)
    budgets = dict(memory_budget=memory, runtime_budget_ms=factor * graph.total_compute_ms)
    ours, dense = exact_pair(graph, gap=1e-7, **budgets)
    assert_same_optimum(ours, dense)
    assert_valid(graph, ours.matrices, **budgets)
