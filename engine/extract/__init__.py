"""Graph extraction: cut a real ``nn.Module`` into segments and measure one training step of it.

``graph, segments = extract(model, (inputs, targets), loss_fn)`` returns the
:class:`~schedules.graph.TrainingGraph` the planner solves and the
:class:`~engine.segments.Segments` the executor runs.  Four steps:

1. **Choose segments.**  By default the top-level children, descending into
   plain containers (``nn.Sequential``, ``nn.ModuleList``, ``nn.ModuleDict``)
   and into any module that holds a ``ModuleList`` (a transformer's layer
   stack): resnet blocks, mobilenet blocks, vgg layers, BERT layers.  Explicit
   ``segments=[qualified names]`` replace the rule.  Then, unless
   ``refine=False``, the units whose forward or backward
   node sets the smallest budget any schedule could fit are cut a module
   level finer, again and again, while that floor falls and the graph stays
   small enough to solve fast (:data:`REFINE_MAX_NODES`): resnet18's
   stem and first blocks down to single layers, its last blocks whole.  The
   modules chosen are recorded in the graph (``TrainingGraph.cut``) so that
   a device cuts the model the same way (:func:`segments_matching`).
2. **Record** (:mod:`engine.extract.recording`).  One forward pass runs under a ``TorchFunctionMode`` with hooks
   on the segment modules, writing a :class:`torch.fx.Graph`: a
   ``call_module`` node per segment call and a ``call_function`` node per
   tensor operation *between* segments (``torch.flatten``, residual adds,
   ``torch.cat`` of a skip connection, mask building), so skip connections
   across segments become edges.  Recording instead of ``torch.fx`` symbolic
   tracing because symbolic tracing cannot enter transformers 5 models
   (``co_varnames is too small``); the recorded graph is specialised to the
   example's shapes, as the byte counts are anyway.  The executor replays this
   glue, so what it read from Python is fixed here: an attribute or global it
   multiplies by, Python's ``random``.  Where glue takes a tensor's value into
   Python (an ``if`` on a tensor, ``.item()``) and the tensor depends on the
   batch or the parameters, a guard is recorded: each step computes that value
   again and stops with :class:`~engine.errors.InputMismatchError` where it
   differs from the example's (replayed unchecked, every batch would follow the
   example's path: transformers skips an attention mask without padding this
   way).  Code inside a segment runs as written on every step.
3. **Cut into units** (:mod:`engine.extract.cutting`).  Each segment call, with the glue before it, is a unit
   (a forward node).  A unit that modifies a value produced by another unit in
   place or returns a view of one (a ``flatten``) would corrupt or share that
   value, so it is merged with its neighbour until no unit does (a view a
   region takes is first moved beside its use, and joins that unit) -- except a
   unit that is a single in-place module (an ``nn.ReLU(inplace=True)`` after a
   BatchNorm), which is set to ``inplace=False`` instead (same values; the
   executor does the same, see ``Segments.out_of_place``); ``max_nodes`` then
   merges the cheapest adjacent units until the graph is small enough.
4. **Measure** (:mod:`engine.extract.measuring`).  :class:`engine.runtime.Runtime` -- the executor's own code --
   runs the step in store-all order several times: each node's bytes are the
   storages its value owns (outputs plus unique saved-for-backward tensors;
   parameters and tensors owned by another node are not counted), its time is
   the median of the runs, its workspace the peak RSS while it computes above
   what it holds before and keeps after, and which other values each unit's
   saved tensors point into decides the backward node's edges.  The first run
   records which backward nodes add to each trained parameter's gradient (the
   graph's parameter layout); the later runs free each gradient once it is
   final and stream large linear weights' gradients in column blocks, as the
   executor's steps with updates in the backward pass do
   (:mod:`engine.optim`), so the workspaces are what those steps hold.

Graph layout (POET's, see :mod:`engine.segments`; built by :mod:`engine.extract.graph`): node 0 the inputs, units
``1..S``, the loss ``S+1``, backward nodes mirrored after it.  Edges: a
forward node consumes its producers; the backward node of ``f`` consumes
``f`` itself -- unless ``f`` is *light*: its backward reads none of its
outputs and saves at most :data:`LIGHT_SAVED_BYTES` of its own (a
convolution, a linear layer, a BatchNorm save their input, which its
producer owns), so a schedule may free ``f`` once its readers have run and
the backward runs on the graph kept (:mod:`engine.store`; the bytes kept are
the graph's ``runtime_bytes``) -- the producers whose values ``f``'s saved tensors reference, and
the backward nodes whose gradients it reads: for each of ``f``'s outputs, the
consumer holding that output's summed gradient, and for each of ``f``'s
inputs also read by later units, the later consumer holding their running sum
(:mod:`engine.runtime`).

With ``repeats`` above 0 the graph also carries the operator-level bound
(:mod:`engine.operator_bound`): what the largest single autograd operator's
backward needs, the floor no cut can go below.

Extraction runs where the model is (a device, or a workstation with the
model): the planner itself (:mod:`schedules`) never imports torch and reads
only the graph this writes.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

from engine import allocator, rss
from engine.errors import ExtractionError, ScheduleRefusedError
from engine.operator_bound import operator_bound
from engine.runtime import ModelState
from engine.segments import Segments
from schedules.floors import node_lower_bounds
from schedules.graph import TrainingGraph

from engine.extract.cutting import cut_into_units
from engine.extract.graph import build_graph
from engine.extract.measuring import measure
from engine.extract.recording import record

log = logging.getLogger(__name__)
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def extract(
    model: nn.Module,
    example_inputs: tuple[Any, Any],
    loss_fn: Callable[[Any, Any], torch.Tensor],
    max_nodes: int | None = None,
    *,
    segments: Sequence[str] | None = None,
    repeats: int = 5,
    refine: bool = True,
) -> tuple[TrainingGraph, Segments]:
    """Extract the training graph of ``model`` and the segments the executor runs it with.

    Parameters
    ----------
    model:
        The model, in the mode it will train in (``model.train()``).
    example_inputs:
        ``(inputs, targets)`` exactly as :meth:`engine.executor.Executor.step`
        will get them: ``inputs`` a tensor or a tuple of positional arguments.
    loss_fn:
        ``loss_fn(model(*inputs), targets)`` returns the scalar loss.
    max_nodes:
        Upper bound on the graph's node count ``T = 2 * units + 3``; adjacent
        cheap units are merged to meet it.
    segments:
        Qualified module names to cut at, instead of the default rule; ``name:ops`` runs that module's own
        code (outside the segments inside it) as single operations, each a unit.
    repeats:
        Timed runs per node; each node's ``compute_ms`` is their median.
    refine:
        Cut finer where the floor is set (step 1 of the module docstring), starting from ``segments`` or the
        default cut; the graph's ``cut`` records the cut chosen, for :func:`segments_matching`, and
        ``default_cut_floor_bytes`` the floor of the cut it started from.  ``False`` keeps that cut (one
        extraction instead of several; the floor can be far higher: a ViT's is most of a plain step).

    The model's parameters, gradients, buffers and the RNG state are left as
    they were.
    """
    # Large tensors on mmap from the start: RSS then follows tensors (workspaces are measured by it); the timed
    # runs alone take them from the caching allocator's cache, as the executor's steps do (measuring.measure).
    following = rss.return_freed_memory()
    allocator.caching_off()
    _cache_off(model)
    inputs, targets = _split_example(example_inputs)
    names = list(segments) if segments is not None else default_segments(model)
    _check_names(model, *_split_cut(names))
    _check_dense_gradients(model)
    state = ModelState(model)
    try:
        start_floor = 0
        if refine:
            names, start_floor = _refined(model, names, inputs, targets, loss_fn, max_nodes or REFINE_MAX_NODES,
                                          following)
        graph, cut = _extract_once(model, names, inputs, targets, loss_fn, max_nodes, repeats, following)
        graph = replace(graph, default_cut_floor_bytes=start_floor)
        if repeats:
            state.rollback()
            aside = ModelState(model)  # the caller's gradients set aside again: the bound's backward adds into .grad
            try:
                graph = replace(graph, operator_bound_bytes=operator_bound(model, inputs, targets, loss_fn))
            finally:
                aside.rollback()
    finally:
        state.rollback()
    return graph, cut


def _cache_off(model: nn.Module) -> None:
    """Turn transformers' key/value cache off, saying so: it serves generation, and in training it would carry a
    pass's tensors past the segment boundaries.  transformers' own Trainer turns it off for training under
    gradient checkpointing the same way (``config.use_cache = False``)."""
    seen: set[int] = set()
    for name, module in model.named_modules():
        config = getattr(module, "config", None)
        if config is None or id(config) in seen or getattr(config, "use_cache", None) is not True:
            continue
        seen.add(id(config))
        config.use_cache = False
        log.warning("%s: transformers' key/value cache turned off for training (config.use_cache = False); it "
                    "serves generation", name or type(model).__name__)


def _extract_once(model: nn.Module, names: list[str], inputs: Any, targets: Any, loss_fn: Callable,
                  max_nodes: int | None, repeats: int, following: bool) -> tuple[TrainingGraph, Segments]:
    recording = record(model, inputs, *_split_cut(names))
    cut = cut_into_units(model, recording, inputs, targets, loss_fn, max_nodes)
    measured = measure(model, cut, inputs, targets, repeats, following)
    cut.light = frozenset(measured.light)
    return replace(build_graph(model, cut, measured), cut=tuple(names)), cut


REFINE_MAX_NODES = 151
"""The largest graph refinement makes unless told another bound (``max_nodes``): the planner's solves stay
fast."""
REFINE_GAIN = 0.99
"""A finer cut is chosen over a coarser one only where it lowers the floor by more than 1 %."""
REFINE_MARGIN = 1.05
"""Units whose nodes need within this factor of the largest need are cut finer together (repeated layers)."""


def _refined(model: nn.Module, names: list[str], inputs: Any, targets: Any, loss_fn: Callable, node_cap: int,
             following: bool) -> tuple[list[str], int]:
    """Cut finer, a module level at a time, the units whose forward or backward node sets the graph's
    smallest possible budget (:func:`schedules.floors.node_lower_bounds`), while that budget falls and the
    graph stays within ``node_cap`` nodes; coarse everywhere else.  Each candidate cut is measured (one timed
    run: the node needs, not the times, decide).  Returns the cut and the floor of ``names``, where it began."""
    best: tuple[int, list[str]] | None = None
    start_floor = 0
    inplace = {name: m.inplace for name, m in model.named_modules() if isinstance(getattr(m, "inplace", None), bool)}
    while True:
        try:
            graph, cut = _extract_once(model, names, inputs, targets, loss_fn, None, 1, following)
        except ExtractionError as exc:
            if best is None:  # the cut asked for itself cannot be extracted: the caller hears why
                raise
            # a finer cut that cannot be run (code between its units draws NumPy's numbers, say): the coarser
            # one the floor was measured on stands
            log.info("refining stopped at a cut that cannot be extracted: %s", exc)
            return best[1], start_floor
        finally:
            for name, flag in inplace.items():  # a cut sets lone in-place modules out of place: not the next one
                model.get_submodule(name).inplace = flag
        needs = node_lower_bounds(graph)
        floor = max(needs)
        start_floor = start_floor or floor
        if graph.size > node_cap:
            return (best[1] if best is not None else names), start_floor
        if best is None or floor < best[0] * REFINE_GAIN:  # a finer level that gains nothing is kept only if a
            best = (floor, names)                           # still finer one below it does
        setting = {m for i, need in enumerate(needs) if i and need * REFINE_MARGIN >= floor
                   for m in _unit_modules(cut, i)}
        finer = _expanded(model, names, setting)
        if finer == names:
            return best[1], start_floor
        names = finer


def _unit_modules(cut: Segments, node: int) -> tuple[str, ...]:
    """The segment modules of the unit behind graph node ``node`` (none for the input and the loss)."""
    forward = cut.forward_of(node) if cut.kind(node) == "backward" else node
    return cut.units[forward - 1].modules if 1 <= forward <= len(cut.units) else ()


def _expanded(model: nn.Module, names: list[str], modules: set[str]) -> list[str]:
    """``names`` with each of ``modules`` cut a level finer: into its children (the default rule below it) and
    its own code's operations, each a unit (``name:ops``); a module without children into its operations,
    unless it is one of PyTorch's layers (one kernel: nothing finer to cut)."""
    out: list[str] = []
    for name in names:
        module = model.get_submodule(name) if name in modules else None
        if module is None:
            out.append(name)
        elif children := _children(module, name):
            out.extend([*children, name + OPS])
        elif type(module).__module__.startswith("torch.nn."):
            out.append(name)
        else:
            out.append(name + OPS)
    return out


OPS = ":ops"
"""Suffix of a cut entry whose module's own code runs as single operations, each a unit (not one segment)."""


def _split_cut(entries: Sequence[str]) -> tuple[list[str], list[str]]:
    """Segment modules and modules cut into operations (``name:ops``) of a cut."""
    names = [e for e in entries if not e.endswith(OPS)]
    return names, [e[:-len(OPS)] for e in entries if e.endswith(OPS)]


def segments_matching(workload: Any, graph: TrainingGraph, max_nodes: int | None = None,
                      source: str = "the graph") -> Segments:
    """Cut ``workload``'s model as the profile that made ``graph`` did, without timing anything.

    Raises :class:`ScheduleRefusedError` when the cut does not give ``graph``'s
    nodes, bytes and edges (another model, input, seed or node bound).
    """
    fresh, segments = extract(workload.model, workload.example, workload.loss_fn, max_nodes,
                              segments=list(graph.cut) or workload.segments, repeats=0, refine=False)
    if fresh.fingerprint != graph.fingerprint:
        named = f"; it is of {graph.model!r}, this is {workload.name!r}" if graph.model != workload.name else ""
        raise ScheduleRefusedError(
            f"{source} was not extracted from this model and input ({fresh.size} nodes here, {graph.size} in the "
            f"graph, or different bytes{named}): use the model, input, seed, loss and node bound the profile "
            "was made with")
    return segments


def _check_dense_gradients(model: nn.Module) -> None:
    """Refuse modules that make sparse gradients: the executor measures, frees and accumulates dense ones."""
    for name, module in model.named_modules():
        trained = any(p.requires_grad for p in module.parameters(recurse=False))
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse and trained:
            raise ExtractionError(
                f"module {name!r} ({type(module).__name__}) makes sparse gradients (sparse=True), which the "
                "executor does not handle; build it with sparse=False (dense gradients, any optimizer), or freeze "
                "it (requires_grad=False)")


def default_segments(model: nn.Module) -> list[str]:
    """The default cut: see step 1 of the module docstring."""
    return _children(model, "") or [""]


def _children(module: nn.Module, prefix: str) -> list[str]:
    """The qualified names of ``module``'s children, descending into containers and layer stacks."""
    found: list[str] = []
    for name, child in module.named_children():
        qualified = f"{prefix}.{name}" if prefix else name
        if type(child) in _CONTAINERS or _holds_stack(child):
            found.extend(_children(child, qualified))
        else:
            found.append(qualified)
    return found


def _holds_stack(module: nn.Module) -> bool:
    return any(isinstance(m, nn.ModuleList) for m in module.modules())


def _split_example(example: Any) -> tuple[Any, Any]:
    if not (isinstance(example, tuple) and len(example) == 2):
        raise ExtractionError("example_inputs must be the pair (inputs, targets) that Executor.step will receive")
    return example


def _check_names(model: nn.Module, names: list[str], regions: Sequence[str] = ()) -> None:
    modules = dict(model.named_modules())
    missing = [n for n in [*names, *regions] if n not in modules]
    if missing:
        raise ExtractionError(f"segments {missing} are not modules of {type(model).__name__}; "
                              f"use qualified names from model.named_modules()")
    nested = [(a, b) for a in names for b in [*names, *regions]
              if a != b and (a == "" or b.startswith(a + "."))]
    if nested:
        raise ExtractionError(f"segment {nested[0][1]!r} lies inside segment {nested[0][0]!r}; "
                              "segments must not overlap")
