"""Synthetic training graphs for tests: Checkmate-style linear chains, U-Nets, residual chains, random DAGs.

Every generator builds a forward DAG and lets :func:`training_graph` add the
loss and the mirrored backward pass with POET's dependency pattern: the
backward node of forward node ``v`` consumes ``v``'s value, the values of
``v``'s inputs, and the gradient of each of ``v``'s consumers (the loss value
itself when ``v`` feeds the loss).  Backward nodes come in reverse forward
order, so node ids stay a topological order.

Costs are chosen so that trade-offs exist: sizes and compute times vary
independently, compute energy follows time, paging energy follows bytes.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from hypothesis import strategies as st

from schedules.graph import Node, TrainingGraph

# Energy model of the synthetic graphs: joules per compute millisecond and per paged byte.  The scale
# keeps objectives near 1 J: HiGHS also stops at an absolute gap of 1e-6, which would swamp tiny ones.
COMPUTE_J_PER_MS = 0.1
PAGEIN_J_PER_BYTE = 2e-4
PAGEOUT_J_PER_BYTE = 3e-4


def training_graph(
    forward_preds: Sequence[Sequence[int]],
    sizes: Sequence[int],
    times_ms: Sequence[float],
    *,
    model: str = "synthetic",
    loss_bytes: int = 4,
    loss_ms: float = 0.1,
) -> TrainingGraph:
    """A full training graph from a forward DAG.

    ``forward_preds[v]`` lists the forward nodes ``v`` consumes (all ``< v``);
    ``sizes[v]`` and ``times_ms[v]`` are forward node ``v``'s bytes and time.
    The loss consumes every forward node nobody else consumes; backward node
    ``grad(v)`` gets ``v``'s size and twice its time (a backward pass costs
    about two forwards).
    """
    n = len(forward_preds)
    loss = n
    consumers: list[list[int]] = [[] for _ in range(n)]
    for v, preds in enumerate(forward_preds):
        for u in preds:
            consumers[u].append(v)
    sinks = [v for v in range(n) if not consumers[v]]
    edges = [(u, v) for v, preds in enumerate(forward_preds) for u in preds] + [(s, loss) for s in sinks]

    def grad(v: int) -> int:  # backward nodes run in reverse forward order, right after the loss
        return loss + (n - v)

    for v in range(n):
        upstream = {v, *forward_preds[v]}
        upstream |= {grad(w) for w in consumers[v]} or {loss}
        edges += [(u, grad(v)) for u in sorted(upstream)]
    nodes = [_node(f"f{v}", "forward", f"layer{v}", sizes[v], times_ms[v]) for v in range(n)]
    nodes.append(_node("loss", "loss", "loss", loss_bytes, loss_ms))
    nodes += [_node(f"g{v}", "backward", f"layer{v}", sizes[v], 2 * times_ms[v]) for v in reversed(range(n))]
    return TrainingGraph(nodes=tuple(nodes), edges=tuple(sorted(set(edges))), model=model)


def _node(name: str, kind: str, segment: str, size: int, ms: float) -> Node:
    return Node(name=name, kind=kind, segment=segment, compute_ms=ms, bytes=size,  # type: ignore[arg-type]
                compute_j=ms * COMPUTE_J_PER_MS, pagein_j=size * PAGEIN_J_PER_BYTE,
                pageout_j=size * PAGEOUT_J_PER_BYTE)


def with_workspace(graph: TrainingGraph, share: float = 0.8) -> TrainingGraph:
    """``graph`` with every backward node given a workspace of ``share`` times its own bytes.

    Like a real backward pass, which holds the activation gradients inside its
    unit (and kernel scratch) while it runs and gives them back when it ends.
    """
    return graph.with_nodes([replace(n, workspace_bytes=int(share * n.bytes)) if n.kind == "backward" else n
                             for n in graph.nodes])


def linear_graph(n: int) -> TrainingGraph:
    """Checkmate's ``gen_linear_graph``: a chain of ``n`` forward nodes, the loss, ``n`` backward nodes.

    ``g_i`` consumes ``f_i``, ``f_{i-1}`` (its input) and ``g_{i+1}`` (the
    loss for the last layer).  Sizes and times vary along the chain in a
    fixed pattern so that recomputing and paging trade off differently per
    layer; ``T = 2n + 1``.
    """
    preds = [[v - 1] if v else [] for v in range(n)]
    sizes = [100 * (1 + (3 * v) % 7) for v in range(n)]
    times = [0.5 + (5 * v) % 4 for v in range(n)]
    return training_graph(preds, sizes, times, model=f"linear{n}")


def unet_graph(depth: int) -> TrainingGraph:
    """A U-Net: an encoder chain, a bottleneck, a decoder whose level ``i`` also reads encoder level ``i``.

    The skip connections jump over the middle, so only the ends of the network
    are articulation points (checkpoint-all then keeps almost nothing).
    """
    preds: list[list[int]] = [[v - 1] if v else [] for v in range(depth)] + [[depth - 1]]  # encoder, bottleneck
    for level in reversed(range(depth)):
        preds.append([len(preds) - 1, level])  # decoder level: previous node plus the skip from the encoder
    n = len(preds)
    sizes = [400 // (1 + min(v, n - 1 - v) % 3) for v in range(n)]
    times = [1.0 + (v % 3) for v in range(n)]
    return training_graph(preds, sizes, times, model=f"unet{depth}")


def residual_graph(blocks: int) -> TrainingGraph:
    """A ResNet in miniature: a stem, then residual blocks of two layers and a sum that also reads the block's input.

    The skips leave the stem and the sums as the only cut points, so each segment holds two values no
    checkpoint covers: recomputing a segment recomputes them too.
    """
    preds: list[list[int]] = [[]]  # the stem
    for _ in range(blocks):
        start = len(preds) - 1
        preds += [[start], [start + 1], [start, start + 2]]
    n = len(preds)
    sizes = [100 * (1 + (5 * v) % 4) for v in range(n)]
    times = [0.5 + (3 * v) % 4 for v in range(n)]
    return training_graph(preds, sizes, times, model=f"residual{blocks}")


def resident_peak(graph: TrainingGraph) -> int:
    """The true unconstrained peak: plain backprop, each value freed right after its last consumer.

    Independent of every planner: while node ``t`` runs, RAM holds ``t``'s
    value and every earlier value some node ``>= t`` still consumes.
    """
    last_consumer = [max(graph.successors[i], default=i) for i in range(graph.size)]
    return max(
        graph.nodes[t].bytes + sum(graph.nodes[i].bytes for i in range(t) if last_consumer[i] >= t)
        for t in range(graph.size)
    )


@st.composite
def training_dags(draw: st.DrawFn, max_forward: int = 7) -> TrainingGraph:
    """Hypothesis strategy: a random forward DAG in topological order plus loss and mirrored backward.

    Each forward node after the first reads one to three earlier nodes (so
    skip connections and multi-consumer values appear); sizes, times and
    hence energies are random, zero times and tiny values included.
    """
    n = draw(st.integers(min_value=1, max_value=max_forward), label="forward nodes")
    preds: list[list[int]] = [[]]
    for v in range(1, n):
        chosen = draw(st.sets(st.integers(0, v - 1), min_size=1, max_size=min(3, v)), label=f"preds of f{v}")
        preds.append(sorted(chosen))
    sizes = draw(st.lists(st.integers(1, 1000), min_size=n, max_size=n), label="bytes")
    times = draw(st.lists(st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0, 5.0]), min_size=n, max_size=n), label="ms")
    loss_bytes = draw(st.integers(1, 16), label="loss bytes")
    return training_graph(preds, sizes, times, model="random", loss_bytes=loss_bytes)


def budget_fractions(graph: TrainingGraph, fractions: Sequence[float]) -> list[int]:
    """Memory budgets at the given fractions of the unconstrained peak, rounded up to whole bytes."""
    peak = resident_peak(graph)
    return [math.ceil(f * peak) for f in fractions]


def required_bytes(graph: TrainingGraph) -> int:
    """A lower bound on any schedule's peak: some stage must hold a node's value and all its inputs."""
    return max(
        graph.nodes[t].bytes + sum(graph.nodes[p].bytes for p in graph.predecessors[t]) for t in range(graph.size)
    )


def milp_constraint_violations(graph: TrainingGraph, m) -> list[str]:
    """The published POET constraints these matrices break (empty when they are a valid MILP point).

    Checked: ``R[t,t] = 1``; nothing computed or paged above the diagonal and
    nothing stored on or above it; backward nodes computed only at their own
    stage; every input of a computed node computed in the same stage or
    resident at its start; RAM and flash persistence; ``MIn <= SSd``,
    ``MOut <= SRam``.  Memory is left to :func:`schedules.baselines.milp_peak_bytes`.
    """
    import numpy as np

    T = graph.size
    upper = np.triu(np.ones((T, T), dtype=bool), 1)
    problems = []
    if not m.R.diagonal().all():
        problems.append("R[t,t] must be 1 for every stage")
    for name in ("R", "MIn", "MOut"):
        if (getattr(m, name) & upper).any():
            problems.append(f"{name} has entries above the diagonal")
    for name in ("SRam", "SSd"):
        if (getattr(m, name) & (upper | np.eye(T, dtype=bool))).any():
            problems.append(f"{name} has entries on or above the diagonal")
    for b in graph.backward_nodes:
        if m.R[:, b].sum() != 1:
            problems.append(f"backward node {b} is computed {int(m.R[:, b].sum())} times")
    for u, v in graph.edges:
        bad = np.flatnonzero(m.R[:, v] & ~(m.R[:, u] | m.SRam[:, u]))
        problems += [f"stage {t}: {v} computed without its input {u}" for t in bad]
    problems += [f"SRam[{t + 1},{i}] without SRam/R/MIn at {t}" for t, i in
                 zip(*np.nonzero(m.SRam[1:] & ~(m.SRam[:-1] | m.R[:-1] | m.MIn[:-1])))]
    problems += [f"SSd[{t + 1},{i}] without SSd/MOut at {t}" for t, i in
                 zip(*np.nonzero(m.SSd[1:] & ~(m.SSd[:-1] | m.MOut[:-1])))]
    problems += [f"MIn[{t},{i}] of a value not on flash" for t, i in zip(*np.nonzero(m.MIn & ~m.SSd))]
    problems += [f"MOut[{t},{i}] of a value not resident at stage start" for t, i in zip(*np.nonzero(m.MOut & ~m.SRam))]
    return problems


def with_parameters(graph: TrainingGraph, share: float = 1.0, tied: tuple[int, int] | None = None) -> TrainingGraph:
    """``graph`` with one trained parameter per backward node, of ``share`` times the node's own bytes.

    ``tied`` names two backward nodes that also share one parameter (a weight used in two segments):
    half the first's size, contributed to by both.
    """
    from schedules.graph import Parameter

    params = [Parameter(f"w_{graph.nodes[b].name}", max(1, int(share * graph.nodes[b].bytes)), (b,))
              for b in sorted(graph.backward_nodes)]
    if tied is not None:
        first, last = sorted(tied)
        params.append(Parameter("tied", max(1, int(share * graph.nodes[first].bytes) // 2), (first, last)))
    return replace(graph, parameters=tuple(params))
