"""Baseline planners with the same signature and result type as POET.

Each heuristic takes a :class:`BaselineProblem` and returns decision matrices
(or ``None`` when it has no answer within the budgets); :func:`schedules.plan`
turns them into a checked schedule.  The MILP-based baselines (remat-only,
i.e. Checkmate, and paging-only) live in :mod:`schedules.plan` as switches of
the MILP.

The heuristics:

* ``store-all``: plain backpropagation, every value kept until its last consumer.
* ``checkpoint-all``: Checkmate's "checkpoint all articulation points": keep
  only the forward values no forward edge jumps over (the cut points that
  split the network into segments); drop the rest after the forward pass and
  recompute each segment once, from its checkpoint, when the backward pass
  first needs it.  On a plain chain every node is a cut point, so this is
  store-all.
* ``sqrt-n``: Chen et al. (2016) as Checkmate implements it: the same policy
  keeping only every ``floor(sqrt(k))``-th of the ``k`` cut points.
* ``capuchin``: a Capuchin-like greedy that adapts to the memory budget:
  starting from store-all, evict a value from the peak stage until the peak
  fits, paging it when the transfer hides behind compute, recomputing it
  otherwise (see :func:`capuchin`).
* ``revolve``: binomial checkpointing, Griewank & Walther (2000), "Algorithm
  799: revolve", ACM TOMS 26(1), as Kukreja et al. use it to train on edge
  devices: over the chain of cut points, the most checkpoints the budgets
  allow, placed by the binomial rule; where the backward pass recomputes a
  stretch of the chain it checkpoints inside it again, freeing those
  checkpoints once the stretch is reversed, so it recomputes least for its
  checkpoints (see :func:`revolve` and :mod:`schedules.binomial`).

One more plan serves only as the MILP's warm start: :func:`page_every_gap`,
which pages every value over every gap it can, the least memory without
recomputation (near the floor, often the only schedule a heuristic finds).

store-all, checkpoint-all and sqrt-n are fixed policies: they ignore the
budgets and :func:`schedules.plan` reports them infeasible when they do not fit.
capuchin and revolve adapt to them and return ``None`` where they find nothing.

Every matrix set produced here satisfies the POET MILP's constraints (R[t,t]
= 1, triangular structure, dependencies, persistence, MOut only of values
resident at stage start, MIn only of values on flash) and the narrower shape
of :mod:`schedules.milp`'s reduced formulation (page-outs right after a
computation, page-ins right before a reader), so any of them can warm start
the MILP.  Memory is a subtler matter: the MILP's accounting
(:func:`milp_peak_bytes`) charges a value paged out during stage ``t`` for all
of stage ``t``, while the instruction list frees it right after the page-out.
The fixed policies and revolve never page, so both accountings agree on
them; capuchin checks its peak under the MILP's accounting by default so that
what it calls feasible is feasible for the MILP too (``accounting="simulator"``
lifts that).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import AbstractSet, Callable, Iterator, Literal, Sequence

import numpy as np

from schedules import binomial
from schedules.errors import ScheduleViolation
from schedules.graph import TrainingGraph
from schedules.matrices import Matrices, to_instructions
from schedules.simulate import simulate

Accounting = Literal["milp", "simulator"]


@dataclass(frozen=True)
class BaselineProblem:
    """What a baseline plans for.

    ``counted_paging_ms`` is the paging time that counts against the runtime
    budget (all of it, the share a profile measured not hidden behind compute,
    or ``None``); ``paging_ms`` (page-in, page-out ms per node) is the
    device's paging time whenever a device profile is known.  Whatever is
    counted, every transfer runs in turn on the executor's one I/O thread, so
    their total must fit the runtime budget too (implied when all is counted).
    """

    graph: TrainingGraph
    memory_budget: float | None
    runtime_budget_ms: float | None
    counted_paging_ms: tuple[Sequence[float], Sequence[float]] | None = None
    paging_ms: tuple[Sequence[float], Sequence[float]] | None = None


# -- shared building blocks ------------------------------------------------------------


def use_stages(graph: TrainingGraph, R: np.ndarray, i: int) -> list[int]:
    """Stages at which value ``i`` is touched: computed there, or read by a node computed there."""
    touched = R[:, i].copy()
    for j in graph.successors[i]:
        touched |= R[:, j]
    return np.flatnonzero(touched).tolist()


def keep_until_used(graph: TrainingGraph, R: np.ndarray) -> Matrices:
    """The least-memory matrices for a given compute plan ``R`` with no paging.

    Each read of value ``i`` at stage ``u`` is served by the latest computation
    of ``i`` at a stage ``c <= u``; ``i`` stays resident from ``c + 1`` to its
    last read served that way, so nothing is kept that no later stage reads
    (this is also what keeps the MILP's and the simulator's memory accounting
    equal on these matrices).
    """
    m = Matrices(R.copy(), *(np.zeros_like(R) for _ in range(4)))
    for i in range(graph.size):
        computed = np.flatnonzero(R[:, i]).tolist()
        for u in use_stages(graph, R, i):
            c = max((s for s in computed if s <= u), default=None)
            if c is not None and c < u:
                m.SRam[c + 1 : u + 1, i] = True
    return m


def milp_stage_peaks(graph: TrainingGraph, m: Matrices) -> list[int]:
    """Peak bytes of each stage as the POET MILP's ``U`` variables account them.

    ``U[t,0] = R[t,0] m_0 + sum_i SRam[t,i] m_i`` and
    ``U[t,k+1] = U[t,k] + R[t,k+1] m_{k+1} - sum_{(i,k)} m_i FreeE[t,(i,k)]``,
    where ``FreeE`` frees input ``i`` after its last consumer computed in stage
    ``t`` unless ``SRam[t+1,i]`` keeps it.  Unlike the instruction list, a
    value resident at the start of ``t`` that no node of stage ``t`` reads
    (one being paged out, say) counts for the whole stage, and so does a value
    computed in ``t`` that nothing in ``t`` reads.  While ``k`` computes, its
    workspace counts on top (``U[t,k] + w_k <= budget``).
    """
    sizes = [n.bytes for n in graph.nodes]
    T = graph.size
    peaks = []
    for t in range(T):
        current = sum(sizes[i] for i in np.flatnonzero(m.SRam[t]))
        peak = current
        for k in np.flatnonzero(m.R[t]).tolist():
            current += sizes[k]
            peak = max(peak, current + graph.nodes[k].workspace_bytes)
            kept = m.SRam[t + 1] if t + 1 < T else np.zeros(T, dtype=bool)
            for i in graph.predecessors[k]:
                if not kept[i] and not any(m.R[t, j] for j in graph.successors[i] if j > k):
                    current -= sizes[i]
        peaks.append(peak)
    return peaks


def milp_peak_bytes(graph: TrainingGraph, m: Matrices) -> int:
    """The largest ``U[t,k]`` the POET MILP would assign to these matrices (see :func:`milp_stage_peaks`)."""
    return max(milp_stage_peaks(graph, m))


def simulated_stage_peaks(graph: TrainingGraph, m: Matrices) -> list[int]:
    """Peak memory (resident bytes, plus workspace while computing) of each stage when the
    matrices' instruction list is replayed.

    Raises :class:`ScheduleViolation` when the matrices are inconsistent.  An
    instruction belongs to the stage whose own node (``compute t``, always
    present) is the next one computed; a page-in at the end of stage ``t``
    therefore counts in stage ``t + 1``, where the MILP counts it too.
    """
    instructions = to_instructions(graph, m)
    trace = simulate(graph, instructions).working_bytes
    peaks = [0] * graph.size
    stage = 0
    for (op, node), resident in zip(instructions, trace):
        if op == "free":  # frees only lower the count; skipping them keeps stage boundaries unambiguous
            continue
        peaks[min(stage, graph.size - 1)] = max(peaks[min(stage, graph.size - 1)], resident)
        if op == "compute" and node == stage:
            stage += 1
    return peaks


def compute_ms(graph: TrainingGraph, R: np.ndarray) -> float:
    """Compute time of a plan: every (re)computation counted, as in the MILP's runtime constraint."""
    times = np.array([n.compute_ms for n in graph.nodes])
    return float((R * times[None, :]).sum())


# -- fixed policies ------------------------------------------------------------------


def store_all(problem: BaselineProblem) -> Matrices:
    """Plain backpropagation: compute every node once and keep it until its last consumer."""
    return keep_until_used(problem.graph, np.eye(problem.graph.size, dtype=bool))


def cut_points(graph: TrainingGraph) -> list[int]:
    """Forward (and loss) nodes that no forward edge jumps over, ascending.

    In a DAG numbered in topological order these are the articulation points
    that split the forward pass into segments: every value a segment reads
    from earlier comes through its first cut point.  The loss reading node 0
    (an extracted graph's batch holds the targets) jumps over nothing: node 0
    is always a cut point, kept until its last reader.
    """
    forward = [i for i in range(graph.size) if not graph.is_backward(i)]
    jumped = set()
    for u, v in graph.edges:
        if not graph.is_backward(v) and not (u == 0 and graph.nodes[v].kind == "loss"):
            jumped.update(range(u + 1, v))
    return [i for i in forward if i not in jumped]


def checkpointed(graph: TrainingGraph, checkpoints: set[int]) -> Matrices:
    """Keep ``checkpoints`` (and the last segment); recompute other forward values once, when first needed.

    A dropped value is recomputed during the backward stage that first reads
    it, together with whatever dropped values it needs in turn, and then kept
    until its last reader, so each segment is recomputed once (Chen et al.).
    The forward values after the last checkpoint are kept from the forward
    pass: recomputing them right away would only cost energy.
    """
    T = graph.size
    last = max(checkpoints, default=-1)
    forward = [i for i in range(T) if not graph.is_backward(i)]
    dropped = {i for i in forward if i not in checkpoints and i < last}
    R = np.eye(T, dtype=bool)
    recomputed: set[int] = set()
    for t in sorted(graph.backward_nodes):
        recompute_where_read(graph, R, t, graph.predecessors[t], dropped, recomputed)
    return keep_until_used(graph, R)


def recompute_where_read(graph: TrainingGraph, R: np.ndarray, t: int, values: Sequence[int], dropped: AbstractSet[int],
                         recomputed: set[int]) -> None:
    """Recompute in stage ``t`` each of ``values`` that is ``dropped`` and not in ``recomputed``, with the
    dropped values it needs in turn; add them to ``recomputed`` (Chen et al.'s rule, which Revolve's
    recording of a step follows too).

    Whatever reads them later is served by this computation (:func:`keep_until_used`), so each is kept
    from here until its last reader.
    """
    pending = [p for p in values if p in dropped and p not in recomputed]
    while pending:
        p = pending.pop()
        if p in recomputed:
            continue
        R[t, p] = True
        recomputed.add(p)
        pending += [q for q in graph.predecessors[p] if q in dropped and q not in recomputed]


def checkpoint_all(problem: BaselineProblem) -> Matrices:
    """Checkmate's checkpoint-all-articulation-points baseline (see the module docstring)."""
    return checkpointed(problem.graph, set(cut_points(problem.graph)))


def sqrt_n(problem: BaselineProblem) -> Matrices:
    """Chen et al.'s sqrt(n) checkpointing: every ``floor(sqrt(k))``-th of the ``k`` cut points."""
    candidates = cut_points(problem.graph)
    every = max(1, math.isqrt(len(candidates)))
    return checkpointed(problem.graph, {v for idx, v in enumerate(candidates) if (idx + 1) % every == 0})


# -- capuchin ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Eviction:
    """Value ``value`` is in RAM at the start of stage ``leave`` but not of the stages up to ``use``.

    Its flash copy is written in stage ``write``, right after the computation
    that produced it: where the MILP allows a page-out at all (``MOut <= SRam``
    and its reduced formulation's "page out right after computing"), and it
    costs no memory there because the value stays resident until ``leave``.
    """

    value: int
    write: int
    leave: int
    use: int


@dataclass(frozen=True)
class _GreedyPlan:
    """Capuchin's state: store-all's compute plan plus recomputations, and the paged gaps."""

    R: np.ndarray
    paged: tuple[_Eviction, ...] = field(default=())

    def on_flash(self, v: int) -> bool:
        """True once ``v`` has been paged out: its flash copy stays valid, later gaps only page in."""
        return any(e.value == v for e in self.paged)

    def matrices(self, graph: TrainingGraph) -> Matrices:
        """Store-all residency for ``R``, with each paged gap cut out of it."""
        m = keep_until_used(graph, self.R)
        for e in self.paged:
            m.SRam[e.leave + 1 : e.use, e.value] = False
            m.MIn[e.use - 1, e.value] = True
        for v in {e.value for e in self.paged}:
            gaps = [e for e in self.paged if e.value == v]
            first_write = min(e.write for e in gaps)
            m.MOut[first_write, v] = True  # written once; the value never changes, so the copy serves every gap
            m.SSd[first_write + 1 : max(e.use for e in gaps), v] = True
        return m


def capuchin(problem: BaselineProblem, accounting: Accounting = "milp") -> Matrices | None:
    """Capuchin-like greedy: evict values from the peak stage until the peak fits the budget.

    Starts from store-all.  While the peak exceeds ``memory_budget``, it takes
    the stage holding the peak and, among the values resident there that the
    stage does not read, the largest (ties: the longest idle gap).  That
    value leaves RAM for its whole idle gap, by one of two means:

    * **page** it (written to flash right after the computation that made
      it, dropped after its last read before the gap, paged back in during
      the stage before its next reader) when ``problem.paging_ms`` says the
      transfer fits within the compute time from the write to that reader,
      so it costs no time;
    * otherwise **recompute** it at its next reader's stage (its inputs are
      kept until then) when that costs less energy than paging it out and in;
      otherwise page it anyway.

    When the preferred means is impossible (backward values are never
    recomputed; a gap of one stage cannot be paged; the runtime budget is
    spent) the other is tried, then the next value.  Returns ``None`` when
    store-all already breaks the runtime budget or no eviction lowers the peak.

    ``accounting`` says whose memory model the peak is checked in: ``"milp"``
    (default) is POET's ``U`` (:func:`milp_peak_bytes`), so the result also
    fits the MILP and is a valid warm start; ``"simulator"`` is the replayed
    instruction list, which is looser when a value is paged out right after
    it is computed.
    """
    graph = problem.graph
    state = _GreedyPlan(np.eye(graph.size, dtype=bool))
    if not _within_runtime(problem, state):
        return None
    matrices = state.matrices(graph)
    if problem.memory_budget is None:
        return matrices
    for _ in range(2 * graph.size * graph.size + 1):  # each step adds a recomputation or a paged gap
        peaks = _stage_peaks(graph, matrices, accounting)
        if max(peaks) <= problem.memory_budget:
            return matrices
        step = _evict_from(problem, state, matrices, peaks, accounting)
        if step is None:
            return None
        state, matrices = step
    return None


def _stage_peaks(graph: TrainingGraph, m: Matrices, accounting: Accounting) -> list[int]:
    return milp_stage_peaks(graph, m) if accounting == "milp" else simulated_stage_peaks(graph, m)


def _evict_from(problem: BaselineProblem, state: _GreedyPlan, m: Matrices, peaks: list[int],
                accounting: Accounting) -> tuple[_GreedyPlan, Matrices] | None:
    """The first eviction, in capuchin's order of preference, that lowers the peak stage's bytes."""
    graph = problem.graph
    stage = int(np.argmax(peaks))
    for v, last, following in _idle_values(graph, state, m, stage):
        for option in _options(problem, state, v, last, following, m, stage, accounting):
            try:
                matrices = option.matrices(graph)
                simulated_stage_peaks(graph, matrices)  # consistent (inputs resident, paging legal)?
            except ScheduleViolation:
                continue
            if _within_runtime(problem, option) and _stage_peaks(graph, matrices, accounting)[stage] < peaks[stage]:
                return option, matrices
    return None


def _idle_values(graph: TrainingGraph, state: _GreedyPlan, m: Matrices, stage: int) -> list[tuple[int, int, int]]:
    """``(value, last read before stage, next read after stage)`` for values idle through ``stage``, best first."""
    if stage + 1 >= graph.size:
        return []
    idle = []
    for v in np.flatnonzero(m.SRam[stage] & m.SRam[stage + 1]).tolist():
        uses = use_stages(graph, state.R, v)
        if stage in uses or graph.nodes[v].bytes == 0:
            continue
        last = max(u for u in uses if u < stage)
        following = min(u for u in uses if u > stage)
        idle.append((v, last, following))
    return sorted(idle, key=lambda x: (-graph.nodes[x[0]].bytes, x[1] - x[2], x[0]))


def _options(problem: BaselineProblem, state: _GreedyPlan, v: int, last: int, following: int, m: Matrices,
             stage: int, accounting: Accounting) -> list[_GreedyPlan]:
    """The ways to evict ``v`` over its gap, in capuchin's order of preference (see :func:`capuchin`)."""
    graph, node = problem.graph, problem.graph.nodes[v]
    # v was computed at ``made`` and is resident from ``made + 1``: at the start of ``last`` if read there.
    made = max(t for t in np.flatnonzero(state.R[:, v]).tolist() if t <= last)
    leave = last if m.SRam[last, v] else last + 1
    options: dict[str, _GreedyPlan] = {}
    # Back in RAM from ``following``; the MILP counts v for all of stage ``leave`` (the replay may free it earlier).
    if leave + 1 < following and (accounting == "simulator" or leave < stage):
        options["page"] = _GreedyPlan(state.R, (*state.paged, _Eviction(v, made + 1, leave, following)))
    if not graph.is_backward(v):
        R = state.R.copy()
        R[following, v] = True
        options["recompute"] = _GreedyPlan(R, state.paged)
    paging_j = (node.pagein_j or 0.0) + (0.0 if state.on_flash(v) else node.pageout_j or 0.0)
    if _paging_hidden(problem, state, v, made + 1, following):
        order = ("page", "recompute")
    elif (node.compute_j or 0.0) <= paging_j:
        order = ("recompute", "page")
    else:
        order = ("page", "recompute")
    return [options[name] for name in order if name in options]


def _paging_hidden(problem: BaselineProblem, state: _GreedyPlan, v: int, write: int, following: int) -> bool:
    """True when paging ``v`` out from stage ``write`` and back in before ``following`` hides behind their compute."""
    if problem.paging_ms is None:
        return False  # no device profile: the transfer time is unknown, so nothing is known to hide
    pagein_ms, pageout_ms = problem.paging_ms
    transfer = pagein_ms[v] + (0.0 if state.on_flash(v) else pageout_ms[v])
    return transfer <= compute_ms(problem.graph, state.R[write:following])


def _within_runtime(problem: BaselineProblem, state: _GreedyPlan) -> bool:
    """The plan's compute time (plus paging time where it counts) fits the runtime budget, and so does
    the I/O thread's paging where paging runs beside compute."""
    if problem.runtime_budget_ms is None:
        return True
    limit = problem.runtime_budget_ms * (1 + 1e-9)
    runtime = compute_ms(problem.graph, state.R)
    if problem.counted_paging_ms is not None:
        runtime += _paging_ms(problem.counted_paging_ms, state)
    if problem.paging_ms is not None and _paging_ms(problem.paging_ms, state) > limit:  # the I/O thread
        return False
    return runtime <= limit


def _paging_ms(paging: tuple[Sequence[float], Sequence[float]], state: _GreedyPlan) -> float:
    """Time of the plan's transfers: each page-in, and one page-out per paged value."""
    pagein_ms, pageout_ms = paging
    return (sum(pagein_ms[e.value] for e in state.paged)
            + sum(pageout_ms[v] for v in {e.value for e in state.paged}))


def page_every_gap(problem: BaselineProblem) -> Matrices | None:
    """The least-memory plan without recomputation: each value leaves RAM over every gap between its reads
    that paging can bridge (capuchin's eviction, applied everywhere at once).

    Each stage then holds its node's inputs and output, plus what the MILP's accounting charges for a
    page-out (the value stays resident through the stage after it is computed) and for gaps too short to
    page (a value read again two stages later).  That is at or near :func:`schedules.floors.memory_lower_bound`
    on extracted graphs, where capuchin's greedy can stall: it prefers recomputing a cheap value, and the
    recomputation's inputs then hold the peak stage.  It is not a method of its own but a warm start, so
    that the MILP has a schedule to improve on at budgets near the floor.  ``None`` when the plan breaks
    the runtime budget (its transfers on the I/O thread, or counted paging time) or the memory budget.
    """
    graph = problem.graph
    state = _GreedyPlan(np.eye(graph.size, dtype=bool))
    evictions = []
    for v in range(graph.size):
        if graph.nodes[v].bytes == 0:
            continue
        uses = use_stages(graph, state.R, v)
        for last, following in zip(uses, uses[1:]):
            leave = last + 1 if last == v else last  # resident through the stage after its computation: its write
            if leave + 1 < following:
                evictions.append(_Eviction(v, v + 1, leave, following))
    state = _GreedyPlan(state.R, tuple(evictions))
    matrices = state.matrices(graph)
    if not _within_runtime(problem, state):
        return None
    if problem.memory_budget is not None and milp_peak_bytes(graph, matrices) > problem.memory_budget:
        return None
    return matrices


# -- revolve -------------------------------------------------------------------------


@dataclass(frozen=True)
class RevolveChain:
    """A graph's forward pass as Revolve's chain of steps.

    Step ``j`` is a *block*: a run of consecutive segments between cut points
    (:func:`cut_points`), ending at the cut point ``ends[j]``, whose value is the
    chain's state after the step and the only one of its values Revolve may
    keep as a checkpoint.  Blocks are as fine as the backward pass allows:
    each backward stage reverses one block (``stages[t]``), so the segments a
    stage reads values of share a block.  A cut point it reads is a state (the
    end of its own segment, or the input of the next), so it ties no segments
    together; a segment that no stage reads on its own joins the block above
    it (the loss, whose gradient the last layer's backward node computes; a
    first node read only as the next one's input).  On a chain of ``n``
    layers that makes ``n`` steps, the loss in the last.
    """

    blocks: tuple[frozenset[int], ...]
    ends: tuple[int, ...]
    stages: dict[int, int]

    @property
    def steps(self) -> int:
        return len(self.blocks)


def revolve_chain(graph: TrainingGraph) -> RevolveChain:
    """The chain Revolve runs on for ``graph`` (see :class:`RevolveChain`)."""
    cuts = cut_points(graph)
    if not cuts:
        return RevolveChain((), (), {})
    segment = {v: bisect.bisect_left(cuts, v) for v in range(graph.size) if not graph.is_backward(v)}
    spans = {t: _span(graph, t, segment, set(cuts)) for t in sorted(graph.backward_nodes)}
    spans = {t: span for t, span in spans.items() if span is not None}
    tops: list[int] = []  # the highest segment of each block
    for low, high in sorted(set(spans.values())):
        if tops and low <= tops[-1]:
            tops[-1] = max(tops[-1], high)
        else:
            tops.append(high)
    tops[-1:] = [len(cuts) - 1]  # segments above the highest one read are reversed with it (all: one block)
    block = {v: bisect.bisect_left(tops, seg) for v, seg in segment.items()}
    return RevolveChain(blocks=tuple(frozenset(v for v, b in block.items() if b == j) for j in range(len(tops))),
                        ends=tuple(cuts[seg] for seg in tops),
                        stages={t: bisect.bisect_left(tops, high) for t, (_, high) in spans.items()})


def _span(graph: TrainingGraph, t: int, segment: dict[int, int], cuts: set[int]) -> tuple[int, int] | None:
    """The segments stage ``t`` reads values of, lowest and highest; a cut point read counts as the next
    segment's input unless nothing higher is read.  ``None`` when it reads no forward value."""
    read = [p for p in graph.predecessors[t] if p in segment]
    if not read:
        return None
    high = max(segment[p] for p in read)
    return min(min(segment[p] + (p in cuts) for p in read), high), high


def revolve_recomputations(graph: TrainingGraph, slots: int, chain: RevolveChain | None = None) -> np.ndarray:
    """``R`` of Revolve's schedule with at most ``slots`` checkpoints in RAM (see :func:`revolve`).

    Revolve's ``s`` snapshots count the chain's first state; here that is the
    batch the first node reads, always at hand, so ``s = slots + 1``.
    """
    chain = chain or revolve_chain(graph)
    R = np.eye(graph.size, dtype=bool)
    last = chain.steps - 1
    if last < 1:
        return R
    actions = iter(binomial.actions(chain.steps, slots + 1))
    for kind, _ in actions:  # the forward pass is Revolve's first sweep, up to the last block's reversal
        if kind == "reverse":
            break
    reversed_ = {last}
    recorded: list[set[int]] = [set() for _ in chain.blocks]
    for t in sorted(chain.stages):
        block = chain.stages[t]
        if block not in reversed_:
            _advance_to_reversal(graph, R, t, chain, actions, block, reversed_)
        if block < last:  # record the block for its backward: its values where first read, as checkpointed() does
            recompute_where_read(graph, R, t, graph.predecessors[t], chain.blocks[block] - {chain.ends[block]},
                                 recorded[block])
    return R


def _advance_to_reversal(graph: TrainingGraph, R: np.ndarray, t: int, chain: RevolveChain,
                         actions: Iterator[binomial.Action], block: int, reversed_: set[int]) -> None:
    """Take Revolve's actions up to ``block``'s reversal, each advance (from a checkpoint towards the block's
    input, keeping the ends the later reversals restart from) in stage ``t``, the first to need the block."""
    for kind, step in actions:
        if kind == "advance":
            recompute_where_read(graph, R, t, [chain.ends[step]], chain.blocks[step], set())
            continue
        reversed_.add(step)
        if step == block:
            return


def revolve_schedule(graph: TrainingGraph, slots: int) -> Matrices:
    """Revolve's schedule for ``graph`` with at most ``slots`` checkpoints in RAM, whatever it costs."""
    return keep_until_used(graph, revolve_recomputations(graph, slots))


def revolve(problem: BaselineProblem) -> Matrices | None:
    """Binomial checkpointing (Griewank & Walther's Revolve) over the chain of cut points, sized to the budgets.

    The forward pass is a chain of steps (:class:`RevolveChain`); a step's
    end value may be kept as a checkpoint.  With ``slots`` checkpoints,
    Revolve (:mod:`schedules.binomial`) reverses the chain with the fewest
    forward steps possible: during the forward pass it keeps the ends of the
    steps at the binomial split points; to reverse a step, a backward stage
    restores the nearest checkpoint before it and advances from there,
    keeping new checkpoints at the split points of the subchain as it goes,
    each freed once its subchain has been reversed (every advance happens in
    the stage that needs its result).  A step's own values are recomputed
    for its backward as :func:`checkpointed` recomputes a segment: each where
    it is first read, then kept until its last reader; the last step's stay
    from the forward pass.  The end of a step stays in RAM from the reversal
    of the step after it (which reads it as input) to its own.

    More checkpoints, fewer recomputations: it takes the most ``slots`` whose
    schedule fits the memory budget (the MILP's accounting; nothing is paged,
    so the replay agrees) and the runtime budget, and returns ``None`` when
    none does.  With every slot it recomputes what :func:`checkpoint_all` does
    but the last step's values (on a chain, nothing: store-all); with none,
    every reversal advances from the batch again.
    """
    graph = problem.graph
    chain = revolve_chain(graph)
    for slots in range(max(chain.steps - 2, 0), -1, -1):  # l - 2 slots leave nothing to recompute on the chain
        R = revolve_recomputations(graph, slots, chain)
        if not _within_runtime(problem, _GreedyPlan(R)):
            continue
        matrices = keep_until_used(graph, R)
        if problem.memory_budget is None or milp_peak_bytes(graph, matrices) <= problem.memory_budget:
            return matrices
    return None


HEURISTIC_BASELINES: dict[str, Callable[[BaselineProblem], Matrices | None]] = {
    "store-all": store_all,
    "checkpoint-all": checkpoint_all,
    "sqrt-n": sqrt_n,
    "capuchin": capuchin,
    "revolve": revolve,
}

__all__ = [
    "BaselineProblem", "HEURISTIC_BASELINES", "RevolveChain", "capuchin", "checkpoint_all", "checkpointed",
    "cut_points", "keep_until_used", "milp_peak_bytes", "milp_stage_peaks", "page_every_gap", "recompute_where_read",
    "revolve", "revolve_chain", "revolve_recomputations", "revolve_schedule", "simulated_stage_peaks", "sqrt_n",
    "store_all",
]
