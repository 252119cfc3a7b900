"""Heuristic baselines: valid schedules at every budget they claim, MILP-consistent matrices, known shapes."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedules.baselines import (
    HEURISTIC_BASELINES,
    BaselineProblem,
    capuchin,
    checkpoint_all,
    cut_points,
    milp_peak_bytes,
    milp_stage_peaks,
    page_every_gap,
    revolve,
    revolve_chain,
    revolve_recomputations,
    revolve_schedule,
    simulated_stage_peaks,
    sqrt_n,
    store_all,
)
from schedules.graph import TrainingGraph
from schedules.matrices import to_instructions
from schedules.milp import PoetFormulation, solve_poet_milp
from schedules.plan import plan
from schedules.simulate import simulate
from tests.conftest import reference_graph_dir
from tests.schedules.graphs import (
    linear_graph,
    milp_constraint_violations,
    required_bytes,
    resident_peak,
    residual_graph,
    training_dags,
    training_graph,
    unet_graph,
    with_workspace,
)

FIXED = ("store-all", "checkpoint-all", "sqrt-n")
ADAPTIVE = ("capuchin", "revolve")  # they fit the budgets they are given, or answer None
NEVER_PAGE = (*FIXED, "revolve")
SWEEP = [1, 2, 3, 5, 8, 13, 21, 34]
# A graph where paging a value right after it is computed is what makes tight budgets feasible (see
# test_capuchin_respects_the_milp_accounting_unless_told_otherwise): g3 (884 B) is computed at stage 5
# and read only at stage 8, while stage 6 needs 1714 B of other values.
SKIP_GRAPH = training_graph([[], [0], [0, 1], [0]], [229, 85, 692, 884], [1.0] * 4, loss_bytes=16)
# A graph where capuchin's greedy stalls above what every stage must hold: f1 is cheap to recompute, so it is
# recomputed for g2, and f0, its input, then holds g2's stage along with f1, g2 and g2's other inputs.
STALL_GRAPH = training_graph([[], [0], [1], [0]], [300, 300, 300, 600], [1.0, 0.1, 1.0, 5.0])


def check_baseline(graph, name, budget=None, runtime_ms=None, **problem):
    """Run one baseline; when it answers, the answer must be a valid, MILP-consistent schedule within budget."""
    m = HEURISTIC_BASELINES[name](BaselineProblem(graph, budget, runtime_ms, **problem))
    if m is None:
        assert name in ADAPTIVE, f"{name} is a fixed policy and always answers"
        return None, None
    assert milp_constraint_violations(graph, m) == []
    report = simulate(graph, to_instructions(graph, m))  # raises ScheduleViolation if inconsistent
    assert report.peak_bytes <= milp_peak_bytes(graph, m)
    if name in NEVER_PAGE:  # no paging: the MILP's accounting and the replay agree exactly
        assert not m.MOut.any() and not m.MIn.any() and report.bytes_paged_out == 0
        assert milp_stage_peaks(graph, m) == simulated_stage_peaks(graph, m)
    # Page-outs sit right after a computation, where the MILP's reduced formulation has its MOut columns,
    # so the matrices stay a valid warm start.
    assert all(m.R[t - 1, i] for t, i in zip(*np.nonzero(m.MOut)))
    if name in ADAPTIVE and budget is not None:
        assert milp_peak_bytes(graph, m) <= budget
        simulate(graph, to_instructions(graph, m), memory_budget=budget, runtime_budget_ms=runtime_ms)
    return m, report


@pytest.mark.parametrize("n", SWEEP)
@pytest.mark.parametrize("name", sorted(HEURISTIC_BASELINES))
def test_every_baseline_is_valid_on_linear_graphs(name, n):
    graph = linear_graph(n)
    for fraction in (None, 1.0, 0.8, 0.6):
        budget = None if fraction is None else math.ceil(fraction * resident_peak(graph))
        check_baseline(graph, name, budget)


@pytest.mark.parametrize("depth", [1, 2, 4, 7])
@pytest.mark.parametrize("name", sorted(HEURISTIC_BASELINES))
def test_every_baseline_is_valid_on_unets(name, depth):
    graph = unet_graph(depth)
    for fraction in (None, 0.9, 0.7):
        check_baseline(graph, name, None if fraction is None else math.ceil(fraction * resident_peak(graph)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=training_dags(max_forward=9), fraction=st.floats(0.3, 1.1))
def test_every_baseline_is_valid_on_random_dags(graph, fraction):
    budget = math.ceil(fraction * resident_peak(graph))
    for name in HEURISTIC_BASELINES:
        check_baseline(graph, name, budget)
    _, report = check_baseline(graph, "store-all")
    assert report.peak_bytes == resident_peak(graph)


@pytest.mark.parametrize("graph", [linear_graph(n) for n in SWEEP] + [unet_graph(3)], ids=lambda g: g.model)
def test_store_all_peak_is_the_true_unconstrained_peak_and_costs_one_step(graph):
    _, report = check_baseline(graph, "store-all")
    assert report.peak_bytes == resident_peak(graph)
    assert report.energy_j == pytest.approx(sum(n.compute_j for n in graph.nodes))
    assert report.recomputed_nodes == report.bytes_paged_out == 0


def test_cut_points_of_a_chain_are_all_forward_nodes_and_of_a_unet_only_its_ends():
    chain = linear_graph(6)
    assert cut_points(chain) == [i for i in range(chain.size) if not chain.is_backward(i)]
    unet = unet_graph(3)  # f0..f2 encoder, f3 bottleneck, f4..f6 decoder, loss at 7; f0 feeds f6
    assert cut_points(unet) == [0, 6, 7]


def test_checkpoint_all_on_a_chain_is_store_all():
    graph = linear_graph(10)
    m, _ = check_baseline(graph, "checkpoint-all")
    assert (m.R == store_all(BaselineProblem(graph, None, None)).R).all()


def test_checkpoint_all_on_a_unet_recomputes_each_dropped_value_once():
    graph = unet_graph(4)
    m, report = check_baseline(graph, "checkpoint-all")
    dropped = [i for i in range(graph.size) if not graph.is_backward(i) and i not in {0, 8, 9}]
    assert (m.R[:, dropped].sum(axis=0) == 2).all()  # once forward, once in the backward pass
    assert report.recomputed_nodes == len(dropped)


@pytest.mark.parametrize("n", [16, 36, 64])
def test_sqrt_n_keeps_about_sqrt_n_checkpoints_and_saves_memory_for_one_recompute(n):
    graph = linear_graph(n)
    m, report = check_baseline(graph, "sqrt-n")
    forward = [i for i in range(graph.size) if not graph.is_backward(i)]
    recomputed = [i for i in forward if m.R[:, i].sum() > 1]
    assert (m.R[:, forward].sum(axis=0) <= 2).all()  # each segment recomputed once (Chen et al.)
    kept = len(forward) - len(recomputed)
    assert kept <= 3 * math.isqrt(n + 1)
    assert report.peak_bytes < 0.6 * resident_peak(graph)


def test_fixed_policies_ignore_the_budgets():
    graph = linear_graph(8)
    for name in FIXED:
        tight = HEURISTIC_BASELINES[name](BaselineProblem(graph, 1, 0.0))
        loose = HEURISTIC_BASELINES[name](BaselineProblem(graph, None, None))
        assert all((getattr(tight, k) == getattr(loose, k)).all() for k in ("R", "SRam", "SSd", "MIn", "MOut"))


# -- capuchin ---------------------------------------------------------------------------


@pytest.mark.parametrize("graph", [linear_graph(12), unet_graph(4)], ids=lambda g: g.model)
def test_capuchin_is_store_all_when_it_fits_and_fits_every_budget_it_claims(graph):
    peak = resident_peak(graph)
    assert (capuchin(BaselineProblem(graph, None, None)).R == np.eye(graph.size, dtype=bool)).all()
    assert (capuchin(BaselineProblem(graph, peak, None)).R == np.eye(graph.size, dtype=bool)).all()
    answered = 0
    for budget in range(required_bytes(graph), peak, max(1, (peak - required_bytes(graph)) // 12)):
        m, _ = check_baseline(graph, "capuchin", budget)
        answered += m is not None
    assert answered >= 3


def test_capuchin_answers_none_below_what_any_stage_must_hold():
    graph = linear_graph(8)
    assert capuchin(BaselineProblem(graph, required_bytes(graph) - 1, None)) is None


def test_capuchin_pages_when_the_transfer_hides_behind_compute():
    graph = linear_graph(12)
    budget = math.ceil(0.7 * resident_peak(graph))
    instant = ([0.0] * graph.size, [0.0] * graph.size)
    m, report = check_baseline(graph, "capuchin", budget, paging_ms=instant)
    assert report.bytes_paged_out > 0 and report.recomputed_nodes == 0


def test_capuchin_recomputes_what_is_cheaper_to_recompute_than_to_page():
    base = linear_graph(12)
    free_forward = base.with_nodes(n if n.kind == "backward" else n.__class__(**{**n.__dict__, "compute_j": 0.0})
                                   for n in base.nodes)
    slow = ([1e9] * base.size, [1e9] * base.size)  # never hidden: the energy rule decides
    m, report = check_baseline(free_forward, "capuchin", math.ceil(0.7 * resident_peak(base)), paging_ms=slow)
    assert report.recomputed_nodes > 0 and report.bytes_paged_out == 0


def test_capuchin_stays_within_the_runtime_budget():
    graph = linear_graph(12)
    budget = math.ceil(0.7 * resident_peak(graph))
    cheap = graph.with_nodes(n if n.kind == "backward" else n.__class__(**{**n.__dict__, "compute_j": 0.0})
                             for n in graph.nodes)
    m, report = check_baseline(cheap, "capuchin", budget, runtime_ms=cheap.total_compute_ms)
    assert report.recomputed_nodes == 0  # no time for recomputation: it pages instead
    assert capuchin(BaselineProblem(graph, budget, graph.total_compute_ms * 0.5)) is None


def test_capuchin_counts_paging_time_where_it_counts():
    graph = linear_graph(12)
    budget = math.ceil(0.7 * resident_peak(graph))
    paging = ([1.0] * graph.size, [1.0] * graph.size)
    m, report = check_baseline(graph, "capuchin", budget, runtime_ms=graph.total_compute_ms, paging_ms=paging,
                               counted_paging_ms=paging)
    assert m is None  # neither recomputation nor (now timed) paging fits a runtime budget of one plain step
    m, report = check_baseline(graph, "capuchin", budget, runtime_ms=graph.total_compute_ms + 40, paging_ms=paging,
                               counted_paging_ms=paging)
    assert m is not None
    simulate(graph, to_instructions(graph, m), runtime_budget_ms=graph.total_compute_ms + 40, paging_time_ms=paging)


def test_capuchin_respects_the_milp_accounting_unless_told_otherwise():
    graph = SKIP_GRAPH
    assert (required_bytes(graph), resident_peak(graph)) == (2119, 2790)
    # The MILP cannot page g3 out during stage 5, where it is computed; paging it out at the start of
    # stage 6 still charges it to stage 6 (MOut <= SRam), which then holds 1714 + 884 = 2598 bytes.
    assert capuchin(BaselineProblem(graph, 2597, None)) is None
    m, _ = check_baseline(graph, "capuchin", 2598)
    assert m is not None
    # The instruction list frees g3 right after paging it out, so the replay fits far tighter budgets.
    loose = capuchin(BaselineProblem(graph, 2119, None), accounting="simulator")
    report = simulate(graph, to_instructions(graph, loose), memory_budget=2119)
    assert report.peak_bytes == 2119
    assert milp_stage_peaks(graph, loose)[6] == 2598 > simulated_stage_peaks(graph, loose)[6]


def least_capuchin_budget(graph):
    """The smallest budget at which capuchin answers (it answers at every budget above that one)."""
    low, high = required_bytes(graph) - 1, resident_peak(graph)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if capuchin(BaselineProblem(graph, middle, None)) is not None else (middle, high)
    return high


def check_page_every_gap(graph, budget=None, runtime_ms=None, **problem):
    """A valid MILP point whose replay fits its MILP peak, pages out only right after computing, recomputes
    nothing and fits the budgets it answers for."""
    m = page_every_gap(BaselineProblem(graph, budget, runtime_ms, **problem))
    if m is None:
        return None
    assert milp_constraint_violations(graph, m) == []
    report = simulate(graph, to_instructions(graph, m), memory_budget=budget, runtime_budget_ms=runtime_ms)
    assert report.peak_bytes <= milp_peak_bytes(graph, m) <= (budget or math.inf)
    assert all(m.R[t - 1, i] for t, i in zip(*np.nonzero(m.MOut)))
    assert report.recomputed_nodes == 0
    return m


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=training_dags(max_forward=9))
def test_page_every_gap_is_a_valid_warm_start_on_random_dags(graph):
    m = check_page_every_gap(graph)
    peak = milp_peak_bytes(graph, m)
    assert check_page_every_gap(graph, peak) is not None and check_page_every_gap(graph, peak - 1) is None


@pytest.mark.parametrize("n", SWEEP)
def test_page_every_gap_on_a_chain_holds_only_what_each_stage_needs(n):
    graph = linear_graph(n)
    assert milp_peak_bytes(graph, check_page_every_gap(graph)) == required_bytes(graph)


def test_page_every_gap_reaches_the_floor_where_capuchin_stalls():
    graph = STALL_GRAPH
    m = check_page_every_gap(graph, required_bytes(graph))
    assert m is not None and milp_peak_bytes(graph, m) == required_bytes(graph) == 1504
    assert least_capuchin_budget(graph) == 1804


def test_page_every_gap_stays_within_the_runtime_budget():
    graph = linear_graph(12)
    step_ms = graph.total_compute_ms
    slow = ([step_ms] * graph.size, [step_ms] * graph.size)  # each transfer takes a whole step
    assert check_page_every_gap(graph, runtime_ms=step_ms, paging_ms=slow) is None  # the I/O thread falls behind
    assert check_page_every_gap(graph, runtime_ms=step_ms * 2 * graph.size, paging_ms=slow) is not None
    quick = ([0.01] * graph.size, [0.01] * graph.size)
    assert check_page_every_gap(graph, runtime_ms=step_ms, paging_ms=quick) is not None
    counted = dict(paging_ms=quick, counted_paging_ms=quick)  # counted, even quick paging overruns one plain step
    assert check_page_every_gap(graph, runtime_ms=step_ms, **counted) is None
    assert check_page_every_gap(graph, runtime_ms=step_ms + 0.01 * 2 * graph.size, **counted) is not None


def test_stage_peaks_agree_with_the_replay_peak():
    graph = unet_graph(3)
    m = capuchin(BaselineProblem(graph, math.ceil(0.75 * resident_peak(graph)), None))
    assert max(simulated_stage_peaks(graph, m)) == simulate(graph, to_instructions(graph, m)).peak_memory_bytes


@pytest.mark.parametrize("name", sorted(HEURISTIC_BASELINES))
def test_baselines_count_a_computing_nodes_workspace(name):
    graph = with_workspace(unet_graph(3))
    budget = math.ceil(0.8 * simulate(graph, to_instructions(graph, store_all(BaselineProblem(graph, None, None))))
                       .peak_memory_bytes)
    m, report = check_baseline(graph, name, budget)
    if m is not None:
        assert max(simulated_stage_peaks(graph, m)) == report.peak_memory_bytes > report.peak_bytes


def test_sqrt_n_on_a_single_layer_keeps_everything():
    graph = linear_graph(1)
    assert (sqrt_n(BaselineProblem(graph, None, None)).R == np.eye(graph.size, dtype=bool)).all()


def fixed_in_reference_milp(graph, m, budget) -> str:
    """Status of the dense published formulation with every decision variable fixed to ``m``."""
    reference = pytest.importorskip("benchmarks.reference_milp")
    model = reference.ReferenceMilp(graph, memory_budget=budget, runtime_budget_ms=None)
    for name in ("R", "SRam", "SSd", "MIn", "MOut"):
        grid, values = getattr(model, name), getattr(m, name)
        for t in range(graph.size):
            for i in range(graph.size):
                grid[t][i].lowBound = grid[t][i].upBound = int(values[t, i])
    return model.solve().status


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # PuLP 3.3 on how the reference builds variables
@pytest.mark.parametrize("graph, fraction", [(SKIP_GRAPH, 0.95), (unet_graph(2), 0.9), (linear_graph(8), 0.8)],
                         ids=["skip", "unet2", "linear8"])
def test_milp_peak_bytes_is_the_published_formulations_memory(graph, fraction):
    budget = math.ceil(fraction * resident_peak(graph))
    for m in (capuchin(BaselineProblem(graph, budget, None)),
              capuchin(BaselineProblem(graph, budget, None), accounting="simulator"),
              sqrt_n(BaselineProblem(graph, None, None))):
        peak = milp_peak_bytes(graph, m)
        assert fixed_in_reference_milp(graph, m, peak) == "optimal"
        assert fixed_in_reference_milp(graph, m, peak - 1) == "infeasible"


# -- revolve ----------------------------------------------------------------------------


def griewank_forward_steps(steps: int, snapshots: int) -> int:
    """Griewank's ``t(l, s) = r l - C(s + r, s + 1)``, ``r`` the least with ``l <= C(s + r, s)``, written out here."""
    r = 0
    while math.comb(snapshots + r, snapshots) < steps:
        r += 1
    return r * steps - (math.comb(snapshots + r, snapshots + 1) if r else 0)


def recomputations(graph, m) -> int:
    """Computations beyond each node's own one."""
    return int(m.R.sum()) - graph.size


def held_checkpoints(graph, m) -> list[int]:
    """Per stage, the step ends (Revolve's states) resident at its start besides the two the step in flight works on.

    The step in flight is the block of a forward stage, or the block a backward stage reverses: its input
    state (Revolve's current state, which its first sweep or an advance brings there) and its own end (which
    a backward node reads as its output) are not checkpoints; every other end kept is.
    """
    chain = revolve_chain(graph)
    ends = set(chain.ends)
    held = []
    for t in range(graph.size):
        if graph.is_backward(t):
            if t not in chain.stages:
                continue
            j = chain.stages[t]
        else:
            j = next(b for b, block in enumerate(chain.blocks) if t in block)
        working = {chain.ends[j]} | ({chain.ends[j - 1]} if j else set())
        held.append(len({e for e in ends if m.SRam[t, e]} - working))
    return held


def least_revolve_peak(graph) -> int:
    """The least peak over every slot count Revolve can use (the last step's input is never a checkpoint)."""
    steps = revolve_chain(graph).steps
    return min(milp_peak_bytes(graph, revolve_schedule(graph, slots)) for slots in range(max(steps - 1, 1)))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 12, 20])
def test_revolve_on_a_chain_recomputes_what_the_binomial_formula_predicts(n):
    graph = linear_graph(n)
    assert revolve_chain(graph).steps == n  # one step per layer, the loss in the last
    for slots in range(0, 6):
        m = revolve_schedule(graph, slots)
        # The batch is a free first snapshot (s = slots + 1), and the first sweep's n - 1 advances are the
        # forward pass itself: the rest are recomputations.
        expected = griewank_forward_steps(n, slots + 1) - (n - 1)
        assert recomputations(graph, m) == expected
        assert (revolve_recomputations(graph, slots) == m.R).all()
        m2, report = check_baseline(graph, "revolve", milp_peak_bytes(graph, m))
        assert report.recomputed_nodes == recomputations(graph, m2)
        # Forced through the budget: it takes at least these slots, so it recomputes no more.
        assert recomputations(graph, m2) <= expected
    if n > 2:  # with no slot, reversing step j advances j steps from the batch again
        assert recomputations(graph, revolve_schedule(graph, 0)) == (n - 1) * (n - 2) // 2


@pytest.mark.parametrize("graph", [linear_graph(4), linear_graph(12), linear_graph(30), residual_graph(3),
                                   residual_graph(6), residual_graph(12)], ids=lambda g: g.model)
def test_revolve_keeps_no_more_checkpoints_than_its_slots(graph):
    steps = revolve_chain(graph).steps
    for slots in range(0, 8):
        held = held_checkpoints(graph, revolve_schedule(graph, slots))
        # Never more than its slots, and all of them once the chain is long enough to use them: the ends of
        # the first l - 2 steps (the last step's input is Revolve's current state, not a checkpoint).
        assert max(held) == min(slots, steps - 2)


def test_revolve_with_every_slot_is_store_all_on_a_chain_and_like_checkpoint_all_with_skips():
    chain = linear_graph(10)
    m, report = check_baseline(chain, "revolve")
    assert (m.R == np.eye(chain.size, dtype=bool)).all()
    assert report.peak_bytes == resident_peak(chain)

    graph = residual_graph(5)  # stem f0; block b's layers f(3b+1), f(3b+2) and sum f(3b+3); the loss f16
    m, _ = check_baseline(graph, "revolve")
    every = checkpoint_all(BaselineProblem(graph, None, None))
    assert not (m.R & ~every.R).any()  # never recomputes what checkpoint-all does not
    # ... and differs only where Revolve keeps the last block's layers (not its sum) from the forward pass.
    last_layers = [3 * 5 - 2, 3 * 5 - 1]
    assert sorted(set(np.nonzero(m.R != every.R)[1].tolist())) == last_layers
    assert recomputations(graph, m) == recomputations(graph, every) - len(last_layers)


@pytest.mark.parametrize("graph", [linear_graph(12), residual_graph(6)], ids=lambda g: g.model)
def test_revolve_peak_falls_with_the_budget_and_it_answers_none_below_its_least(graph):
    top, least = resident_peak(graph), least_revolve_peak(graph)
    assert required_bytes(graph) <= least < top
    budgets = sorted({*range(top, least, -max(1, (top - least) // 25)), least}, reverse=True)
    peaks, recomputed = [], []
    for budget in budgets:
        m, report = check_baseline(graph, "revolve", budget)
        assert m is not None, f"no plan at {budget} B though Revolve fits {least} B"
        assert report.peak_memory_bytes <= budget and milp_peak_bytes(graph, m) <= budget
        peaks.append(report.peak_memory_bytes)
        recomputed.append(recomputations(graph, m))
    # The store-all peak leaves room for every slot: what it does with no budget (on a chain, store-all).
    assert (check_baseline(graph, "revolve", budgets[0])[0].R == revolve(BaselineProblem(graph, None, None)).R).all()
    assert peaks[-1] == least and recomputed[-1] > 0
    assert all(later <= earlier for earlier, later in zip(peaks, peaks[1:]))
    if graph.model.startswith("linear"):  # on a chain fewer slots always cost recomputations
        assert recomputed[0] == 0
        assert all(later >= earlier for earlier, later in zip(recomputed, recomputed[1:]))
    assert revolve(BaselineProblem(graph, least - 1, None)) is None
    assert revolve(BaselineProblem(graph, required_bytes(graph) - 1, None)) is None


def test_revolve_stays_within_the_runtime_budget():
    graph = linear_graph(12)
    times = np.array([n.compute_ms for n in graph.nodes])
    budget = math.ceil(0.6 * resident_peak(graph))
    free = revolve(BaselineProblem(graph, budget, None))
    assert free is not None
    needed = float((free.R * times).sum())
    assert needed > graph.total_compute_ms  # it recomputes at this budget
    same, _ = check_baseline(graph, "revolve", budget, needed)
    assert (same.R == free.R).all()
    # One plain step's time leaves no room to recompute, and below the store-all peak nothing else fits.
    assert revolve(BaselineProblem(graph, budget, graph.total_compute_ms)) is None
    assert revolve(BaselineProblem(graph, budget, needed * (1 - 1e-6))) is None  # more slots would not fit
    for factor in (1.0, 1.2, 1.5, 2.0, 4.0):
        runtime_ms = factor * graph.total_compute_ms
        m, report = check_baseline(graph, "revolve", None, runtime_ms)
        assert m is not None and float((m.R * times).sum()) <= runtime_ms and report.runtime_ms <= runtime_ms


def replay(graph, instructions):
    """Walk the instructions: every input of a computation resident, each backward node once, no paging.

    Returns (peak of resident bytes plus the computing node's workspace, compute energy, compute time).
    """
    resident: set[int] = set()
    peak, energy, runtime = 0, 0.0, 0.0
    backward_done = []
    for op, k in instructions:
        assert op in ("compute", "free"), f"revolve never pages, but {op} {k}"
        if op == "free":
            assert k in resident
            resident.remove(k)
            continue
        missing = [p for p in graph.predecessors[k] if p not in resident]
        assert not missing, f"compute {k} without its inputs {missing}"
        assert k not in resident
        resident.add(k)
        node = graph.nodes[k]
        energy += node.compute_j
        runtime += node.compute_ms
        peak = max(peak, sum(graph.nodes[i].bytes for i in resident) + node.workspace_bytes)
        if graph.is_backward(k):
            backward_done.append(k)
    assert sorted(backward_done) == sorted(graph.backward_nodes)
    return peak, energy, runtime


def check_replayed(graph, budget, runtime=None):
    runtime_ms = None if runtime is None else runtime * graph.total_compute_ms
    result = plan(graph, memory_budget=budget, runtime_budget=runtime, method="revolve")
    assert result.feasible, result.message
    schedule = result.schedule
    m = revolve(BaselineProblem(graph, budget, runtime_ms))
    assert tuple(to_instructions(graph, m)) == tuple(schedule.instructions)
    peak, energy, runtime_used = replay(graph, schedule.instructions)
    assert peak <= budget
    report = simulate(graph, schedule)
    assert report.peak_memory_bytes == peak == schedule.predicted_peak_bytes
    assert report.energy_j == pytest.approx(energy) == schedule.predicted_energy_j
    assert report.runtime_ms == pytest.approx(runtime_used) == schedule.predicted_runtime_ms
    assert report.recomputed_nodes == recomputations(graph, m) > 0  # the budget made it recompute
    return result


@pytest.mark.parametrize("graph, fraction", [(linear_graph(10), 0.5), (residual_graph(3), 0.75)],
                         ids=lambda x: getattr(x, "model", str(x)))
def test_revolve_schedule_replayed_by_the_simulator(graph, fraction):
    check_replayed(graph, math.ceil(fraction * resident_peak(graph)))
    check_replayed(graph, least_revolve_peak(graph), runtime=10.0)


def test_revolve_schedule_replayed_by_the_simulator_on_resnet18():
    graph = TrainingGraph.load(reference_graph_dir() / "resnet18_cifar_a72.json")
    steps = revolve_chain(graph).steps
    assert steps > 4
    budget = math.ceil(0.33 * resident_peak(graph))  # below what every slot needs: fewer slots, more recomputation
    assert milp_peak_bytes(graph, revolve_schedule(graph, steps - 2)) > budget
    result = check_replayed(graph, budget)
    assert result.simulation.recomputed_nodes > recomputations(graph, revolve(BaselineProblem(graph, None, None)))


@pytest.mark.parametrize("graph, fraction", [(linear_graph(8), 0.75), (residual_graph(3), 0.75), (unet_graph(3), 1.0)],
                         ids=lambda x: getattr(x, "model", str(x)))
def test_revolve_is_a_feasible_point_of_poets_milp(graph, fraction):
    budget = math.ceil(fraction * resident_peak(graph))
    m, report = check_baseline(graph, "revolve", budget)
    assert m is not None
    form = PoetFormulation(graph, memory_budget=budget, runtime_budget_ms=None)
    assert form.model.is_feasible(form.encode(m))
    tight = PoetFormulation(graph, memory_budget=milp_peak_bytes(graph, m) - 1, runtime_budget_ms=None)
    assert not tight.model.is_feasible(tight.encode(m))  # the check can fail: memory is accounted
    energy = sum(graph.nodes[i].compute_j * int(m.R[:, i].sum()) for i in range(graph.size))
    assert report.energy_j == pytest.approx(energy)
    poet = solve_poet_milp(graph, memory_budget=budget, runtime_budget_ms=None, gap=1e-6, time_limit=60)
    assert poet.matrices is not None
    assert poet.objective_j <= energy * (1 + 1e-6)
