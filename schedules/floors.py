"""The floor: the smallest memory budget a graph's cut allows, node by node, and what to say when a budget is
below it.

Computing a node needs its value, its workspace and its inputs' values in RAM at once, so no schedule runs in
less than the largest of those sums (:func:`memory_lower_bound`).  The floor belongs to the *cut*: where
extraction cut the model finer (:func:`engine.extract.extract`'s ``refine``, its default) the graph also
carries the floor of the cut it began from (``TrainingGraph.default_cut_floor_bytes``), and a budget
below the floor is answered with both (:func:`below_floor_text`).
"""

from __future__ import annotations

from dataclasses import replace

from common.units import format_bytes
from schedules.graph import TrainingGraph
from schedules.step_memory import MIN_CHUNK_BYTES, StepMemory, TrainingSpec


def memory_lower_bound(graph: TrainingGraph, training: TrainingSpec | None = None) -> int:
    """Largest ``bytes(node) + workspace(node) + sum(bytes(inputs))``: no schedule fits a smaller budget.

    With ``training``, plus what the step must hold beside them however its optimizer state is placed:
    the runtime, gradients held there, the node's update transient at the smallest chunks.
    """
    return max(node_lower_bounds(graph, training))


def node_lower_bounds(graph: TrainingGraph, training: TrainingSpec | None = None) -> list[int]:
    """Per node, what computing it needs at once: its value, its workspace and its inputs' values (with
    ``training``, plus the step's share as in :func:`memory_lower_bound`).  The largest is that bound."""
    step = None
    if training is not None:
        spec = training if training.chunk_bytes else replace(training, chunk_bytes=MIN_CHUNK_BYTES)
        step = StepMemory.build(graph, spec)
        resident = 0 if spec.state_paging else step.state_bytes
    bounds = []
    for i, node in enumerate(graph.nodes):
        need = node.bytes + node.workspace_bytes + sum(graph.nodes[p].bytes for p in graph.predecessors[i])
        if step is not None:
            need += step.constant_bytes + resident + step.update_bytes[i]
            need += step.stage_bytes[i] if graph.is_backward(i) else 0  # computed at its own stage only
        bounds.append(need)
    return bounds


def below_floor_text(graph: TrainingGraph, budget: float | None, training: TrainingSpec | None = None) -> str | None:
    """Where ``budget`` is below the graph's floor, that floor in words and the other cut's where extraction
    measured it (or how to get a lower one where it did not refine); ``None`` where it is not.  With
    ``training`` the floors are of the step's whole memory (the other cut's then about: the step's share is the
    same on both)."""
    needs = node_lower_bounds(graph, training)
    setting = max(range(len(needs)), key=needs.__getitem__)
    if budget is None or budget >= needs[setting]:
        return None
    text = (f"no schedule runs in less than {format_bytes(needs[setting])} on this cut ({graph.nodes[setting].name} "
            "needs its value, workspace and inputs at once)")
    other = graph.default_cut_floor_bytes
    if other:
        activations = memory_lower_bound(graph)
        if other > activations * 1.01:  # refining lowered it (measured again, an unchanged cut reads within 1%)
            about = "about " if training is not None else ""
            text += (f"; on the default cut, before refining, {about}"
                     f"{format_bytes(needs[setting] + other - activations)}")
    elif graph.cut:  # extracted without refining: a finer cut may go lower
        text += ("; extraction did not refine this cut: extract with refine=True (the default, and "
                 "`poet-edge profile`'s) for a finer cut where the floor is set")
    return text
