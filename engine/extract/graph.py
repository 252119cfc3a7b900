"""The last step of extraction (:mod:`engine.extract`): the :class:`~schedules.graph.TrainingGraph` from the
units and what was measured: nodes in POET's layout, their edges and the parameter layout.
"""


from __future__ import annotations


import torch
import torch.nn as nn

from engine.segments import Segments
from schedules.graph import Node, TrainingGraph

from engine.extract.measuring import Measured

def build_graph(model: nn.Module, segs: Segments, m: Measured) -> TrainingGraph:
    nodes = []
    for i in range(segs.size):
        kind = segs.kind(i)
        segment = segs.name(segs.forward_of(i)) if kind == "backward" else segs.name(i)
        nodes.append(Node(name=segs.name(i), kind="forward" if kind == "input" else kind, segment=segment,
                          compute_ms=m.compute_ms[i], bytes=m.bytes[i], workspace_bytes=m.workspace[i]))
    param_bytes = sum(p.nbytes for p in model.parameters())
    buffer_bytes = sum(b.nbytes for b in model.buffers())
    return TrainingGraph(
        nodes=tuple(nodes), edges=tuple(sorted(_edges(segs, m))),
        fixed_bytes=param_bytes + buffer_bytes,  # the loaded model
        model=type(model).__name__, source=f"engine.extract (torch {torch.__version__})",
        parameters=m.parameters,
        runtime_bytes=sum(m.light.values()),  # what light units' backward keeps of them once they are freed
    )


def _edges(segs: Segments, m: Measured) -> set[tuple[int, int]]:
    edges: set[tuple[int, int]] = set()
    for f in range(1, segs.loss_node + 1):
        b = segs.backward_of(f)
        edges.update((port.node, f) for port in segs.inputs_of(f))
        if f not in m.light:
            edges.add((f, b))
        edges.update((r, b) for r in m.refs[f])
        edges.update((r, b) for r in m.reads.get(b, ()))  # the running gradient sums it reads (engine.runtime)
    return edges
