"""Graph extraction: cut a real ``nn.Module`` into segments and measure one training step of it.

``graph, segments = extract(model, (inputs, targets), loss_fn)`` returns the
:class:`~schedules.graph.TrainingGraph` the planner solves and the
:class:`~engine.segments.Segments` the executor runs.  Four steps:

1. **Choose segments.**  By default the top-level children, descending into
   plain containers (``nn.Sequential``, ``nn.ModuleList``, ``nn.ModuleDict``)
   and into any module that holds a ``ModuleList`` (a transformer's layer
   stack): resnet blocks, mobilenet blocks, vgg layers, BERT layers.  Explicit
   ``segments=[qualified names]`` replace the rule.  With ``refine=True``
   (what ``poet-edge profile`` does) the units whose forward or backward
   node sets the smallest budget any schedule could fit are cut a module
   level finer, again and again, while that floor falls and the graph stays
   small enough to solve fast (:data:`REFINE_MAX_NODES`): resnet18's
   stem and first blocks down to single layers, its last blocks whole.  The
   modules chosen are recorded in the graph (``TrainingGraph.cut``) so that
   a device cuts the model the same way (:func:`segments_matching`).
2. **Record.**  One forward pass runs under a ``TorchFunctionMode`` with hooks
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
3. **Cut into units.**  Each segment call, with the glue before it, is a unit
   (a forward node).  A unit that modifies a value produced by another unit in
   place or returns a view of one (a ``flatten``) would corrupt or share that
   value, so it is merged with its neighbour until no unit does (a view a
   region takes is first moved beside its use, and joins that unit) -- except a
   unit that is a single in-place module (an ``nn.ReLU(inplace=True)`` after a
   BatchNorm), which is set to ``inplace=False`` instead (same values; the
   executor does the same, see ``Segments.out_of_place``); ``max_nodes`` then
   merges the cheapest adjacent units until the graph is small enough.
4. **Measure.**  :class:`engine.runtime.Runtime` -- the executor's own code --
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

Graph layout (POET's, see :mod:`engine.segments`): node 0 the inputs, units
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

import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
import torch.nn as nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from engine import rss
from engine.composites import composite_body
from engine.errors import ExtractionError, ScheduleRefusedError
from engine.lean_backward import lean_version
from engine.optim.chunks import Chunking, column_unit_bytes
from engine.optim.rows import row_updatable
from engine.optim.streamed import streamable, streaming
from engine.operator_bound import operator_bound
from engine.runtime import ModelState, Runtime
from engine.segments import Port, Segments, TensorMeta, Unit, mark_modes, pytree_leaf, run_unit, same_path
from engine.store import Handle
from schedules.budgets import node_lower_bounds
from schedules.graph import Node, Parameter, TrainingGraph

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
_REGION = "poet_region"  # fx node meta: the expanded module whose own code made this operation
_OP_NAME = "poet_op"  # fx node meta: the name of the torch function the recorded operation called



def extract(
    model: nn.Module,
    example_inputs: tuple[Any, Any],
    loss_fn: Callable[[Any, Any], torch.Tensor],
    max_nodes: int | None = None,
    *,
    segments: Sequence[str] | None = None,
    repeats: int = 5,
    refine: bool = False,
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
        default cut; the graph's ``cut`` records the cut chosen, for :func:`segments_matching`.

    The model's parameters, gradients, buffers and the RNG state are left as
    they were.
    """
    # Large tensors on mmap from the start, as the executor runs them: RSS then follows tensors (workspaces are
    # measured by it) and node times include the page faults the executor's steps pay too.
    following = rss.return_freed_memory()
    inputs, targets = _split_example(example_inputs)
    names = list(segments) if segments is not None else default_segments(model)
    _check_names(model, *_split_cut(names))
    _check_dense_gradients(model)
    state = ModelState(model)
    try:
        if refine:
            names = _refined(model, names, inputs, targets, loss_fn, max_nodes or REFINE_MAX_NODES, following)
        graph, cut = _extract_once(model, names, inputs, targets, loss_fn, max_nodes, repeats, following)
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


def _extract_once(model: nn.Module, names: list[str], inputs: Any, targets: Any, loss_fn: Callable,
                  max_nodes: int | None, repeats: int, following: bool) -> tuple[TrainingGraph, Segments]:
    recording = _record(model, inputs, *_split_cut(names))
    cut = _cut(model, recording, inputs, targets, loss_fn, max_nodes)
    measured = _measure(model, cut, inputs, targets, repeats, following)
    cut.light = frozenset(measured.light)
    return replace(_build_graph(model, cut, measured), cut=tuple(names)), cut


REFINE_MAX_NODES = 151
"""The largest graph refinement makes unless told another bound (``max_nodes``): the planner's solves stay
fast."""
REFINE_GAIN = 0.99
"""A finer cut is chosen over a coarser one only where it lowers the floor by more than 1 %."""
REFINE_MARGIN = 1.05
"""Units whose nodes need within this factor of the largest need are cut finer together (repeated layers)."""


def _refined(model: nn.Module, names: list[str], inputs: Any, targets: Any, loss_fn: Callable, node_cap: int,
             following: bool) -> list[str]:
    """Cut finer, a module level at a time, the units whose forward or backward node sets the graph's
    smallest possible budget (:func:`schedules.budgets.node_lower_bounds`), while that budget falls and the
    graph stays within ``node_cap`` nodes; coarse everywhere else.  Each candidate cut is measured (one timed
    run: the node needs, not the times, decide)."""
    best: tuple[int, list[str]] | None = None
    inplace = {name: m.inplace for name, m in model.named_modules() if isinstance(getattr(m, "inplace", None), bool)}
    while True:
        graph, cut = _extract_once(model, names, inputs, targets, loss_fn, None, 1, following)
        for name, flag in inplace.items():  # a cut sets lone in-place modules out of place: not the next one
            model.get_submodule(name).inplace = flag
        if graph.size > node_cap:
            return best[1] if best is not None else names
        needs = node_lower_bounds(graph)
        floor = max(needs)
        if best is None or floor < best[0] * REFINE_GAIN:  # a finer level that gains nothing is kept only if a
            best = (floor, names)                           # still finer one below it does
        setting = {m for i, need in enumerate(needs) if i and need * REFINE_MARGIN >= floor
                   for m in _unit_modules(cut, i)}
        finer = _expanded(model, names, setting)
        if finer == names:
            return best[1]
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
                              segments=list(graph.cut) or workload.segments, repeats=0)
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


# -- 2. recording ----------------------------------------------------------------
@dataclass
class _Recording:
    """The forward pass as an fx graph of segment calls and the glue between them."""

    graph: fx.Graph
    placeholders: list[fx.Node]
    output_leaves: list[fx.Node | Any]
    output_spec: Any
    constants: dict[int, torch.Tensor] = field(default_factory=dict)

    @property
    def ops(self) -> list[fx.Node]:
        return [n for n in self.graph.nodes if n.op in ("call_module", "call_function")]


# Tensor methods and functions that hand a tensor's value to Python: glue code that branches on it, or builds an
# argument from it, would be replayed with this example's value for every batch.
_TO_PYTHON = frozenset({"__bool__", "__int__", "__float__", "__index__", "__complex__", "item", "tolist", "numpy",
                        "__array__", "equal", "is_nonzero"})


class _Recorder(TorchFunctionMode):
    """Writes every tensor operation made outside segment modules into an fx graph.

    Glue code runs only here: the executor replays the recorded operations.  So where the glue takes a value
    from a tensor that depends on the batch or the parameters into Python (an ``if`` on a tensor, ``.item()``),
    a guard (:func:`engine.segments.same_path`) is recorded: the replay computes the value again and stops with
    an error where it differs from the example's, instead of following the example's path for every batch.
    """

    def __init__(self, graph: fx.Graph, fixed: set[int], model: str = "the model") -> None:
        super().__init__()
        self.graph = graph
        self.model = model
        self.fixed = fixed                        # ids of parameters and buffers: referenced as they are
        self.dependent: set[int] = set()          # ids of recorded tensors computed from the batch or parameters
        self.depth = 0                            # > 0 while inside a segment module
        self.env: dict[int, fx.Node] = {}         # id(tensor) -> the node that produced it
        self.keep: list[torch.Tensor] = []        # keeps ids unique while recording
        self.calls: list[fx.Node] = []
        self.constants: dict[int, torch.Tensor] = {}
        self.visible: set[int] = set()            # ids of the current segment call's tensor arguments
        self.regions: list[str] = []              # expanded modules whose own code is running (outermost first)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        body = composite_body(func, args, kwargs) if self.depth == 0 and self.regions else None
        if body is not None:
            with self:  # its operations come back here one by one
                return body()
        if self.depth > 0:
            self.check_visible(args, kwargs)
        out = func(*args, **kwargs)
        if self.depth == 0 and getattr(func, "__name__", "") in _TO_PYTHON and self.depends(args, kwargs):
            self.guard(func, out, args, kwargs)
        if self.depth == 0 and any(isinstance(x, torch.Tensor) for x in tree_flatten(out)[0]):
            name = getattr(func, "__name__", "op")
            target = lean_version(func, args, kwargs) or func  # the same bits, less scratch in backward
            node = self.graph.call_function(target, self.lift(args, name), self.lift(kwargs, name))
            node.meta[_OP_NAME] = name
            mark_modes(node)
            if self.regions:
                node.meta[_REGION] = self.regions[-1]
            self.bind(node, out, dependent=self.depends(args, kwargs))
        return out

    def depends(self, args: Any, kwargs: Any) -> bool:
        """Whether a tensor among the arguments is computed from the batch or is (or comes from) a parameter."""
        return any(isinstance(a, torch.Tensor) and (id(a) in self.dependent or id(a) in self.fixed)
                   for a in tree_flatten((args, kwargs))[0])

    def guard(self, func: Callable, value: Any, args: Any, kwargs: Any) -> None:
        """Record a check that the replay's ``func(*args, **kwargs)`` gives ``value`` again."""
        where = f"{self.model}.forward"
        name = getattr(func, "__name__", "op")
        node = self.graph.call_function(same_path, (func, where, value, *self.lift(args, name)),
                                        self.lift(kwargs, name))
        mark_modes(node)

    def check_visible(self, args: Any, kwargs: Any) -> None:
        """Inside a segment, refuse a tensor of this pass that did not come in through its arguments."""
        for a in tree_flatten((args, kwargs))[0]:
            if isinstance(a, torch.Tensor) and id(a) in self.env and id(a) not in self.visible:
                raise ExtractionError(
                    f"segment {self.calls[-1].target!r} uses a tensor computed earlier in this forward pass that "
                    "it did not receive as a tensor argument (it came inside another object or through an "
                    "attribute); pass explicit segments= so that producer and user are in one segment")

    def lift(self, tree: Any, where: str) -> Any:
        """``tree`` with recorded tensors replaced by their nodes."""
        seen = 0

        def one(a: Any) -> Any:
            nonlocal seen
            if isinstance(a, torch.Tensor):
                if id(a) in self.env:
                    seen += 1
                    self.visible.add(id(a))
                    return self.env[id(a)]
                if a.grad_fn is not None:
                    raise ExtractionError(
                        f"{where} uses a tensor with an autograd history that was not recorded (computed "
                        "outside torch functions or before the forward pass); compute it inside a segment")
                if id(a) not in self.fixed:
                    self.constants[id(a)] = a
            return a

        lifted = fx.node.map_aggregate(tree, one)
        hidden = sum(isinstance(a, torch.Tensor) and id(a) in self.env for a in tree_flatten(tree)[0]) - seen
        if hidden > 0:
            raise ExtractionError(
                f"{where} receives {hidden} tensor(s) computed in this forward pass inside a container other "
                "than tuple/list/dict; pass explicit segments= so that the code building it is inside a segment")
        return lifted

    def bind(self, node: fx.Node, out: Any, dependent: bool = True) -> None:
        """Remember which node produced each tensor in ``out`` (and whether it depends on the batch or the
        parameters)."""
        if isinstance(out, torch.Tensor):
            self.env[id(out)] = node
            self.keep.append(out)
            if dependent:
                self.dependent.add(id(out))
            return
        for index, leaf in enumerate(tree_flatten(out)[0]):
            if isinstance(leaf, torch.Tensor):
                self.env[id(leaf)] = self.graph.call_function(pytree_leaf, (node, index))
                self.keep.append(leaf)
                if dependent:
                    self.dependent.add(id(leaf))


def _record(model: nn.Module, inputs: Any, names: list[str], regions: Sequence[str] = ()) -> _Recording:
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    graph = fx.Graph()
    fixed = {id(t) for t in (*model.parameters(), *model.buffers())}
    recorder = _Recorder(graph, fixed, type(model).__name__)
    placeholders = []
    for leaf in tree_flatten(args)[0]:
        if isinstance(leaf, torch.Tensor):
            placeholders.append(graph.placeholder(f"input_{len(placeholders)}"))
            recorder.env[id(leaf)] = placeholders[-1]
            recorder.dependent.add(id(leaf))
    modules = dict(model.named_modules())
    handles = [h for name in names for h in _hook(modules[name], name, recorder)]
    handles += [h for name in regions for h in _region_hooks(modules[name], name, recorder)]
    try:
        with recorder:
            output = model(*args)
    finally:
        for h in handles:
            h.remove()
    if not recorder.calls:
        raise ExtractionError(f"none of the segments {names[:5]} was called by {type(model).__name__}.forward")
    _refuse_carriers(model, recorder.calls)
    leaves, spec = tree_flatten(output)
    lifted = [recorder.lift(x, "the model output") if isinstance(x, torch.Tensor) else x for x in leaves]
    graph.output(tuple(x for x in lifted if isinstance(x, fx.Node)))
    return _Recording(graph, placeholders, lifted, spec, recorder.constants)


_PLAIN = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout,
          slice, type(Ellipsis))


def _refuse_carriers(model: nn.Module, calls: list[fx.Node]) -> None:
    """Refuse an object other than a tensor or a plain value that segment calls receive and that holds tensors
    with an autograd history (a key/value cache): it carries this pass's tensors past the gradient boundaries,
    and a replay would hand the next step the same object, still holding them."""
    for call in calls:
        arguments: list[Any] = []
        fx.node.map_aggregate((call.args, call.kwargs), arguments.append)
        carriers = [a for a in arguments if not isinstance(a, (fx.Node, torch.Tensor)) and _holds_history(a)]
        if carriers:
            kind = type(carriers[0]).__name__
            hint = ("set model.config.use_cache = False for training (a key/value cache serves generation)"
                    if getattr(getattr(model, "config", None), "use_cache", False) else
                    "build that object inside one segment, or pass its tensors as arguments")
            raise ExtractionError(f"segment {call.target!r} receives a {kind} that holds tensors of this forward "
                                  f"pass: it would carry them past the segment boundaries and into the next "
                                  f"step; {hint}")


def _holds_history(obj: Any, depth: int = 4) -> bool:
    """Whether ``obj`` holds, within ``depth`` attribute or container levels, a tensor with an autograd history."""
    if isinstance(obj, torch.Tensor):
        return obj.grad_fn is not None
    if depth == 0 or isinstance(obj, (*_PLAIN, nn.Module)):
        return False
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple, set)):
        children = list(obj)
    else:
        children = list(getattr(obj, "__dict__", {}).values())
    return any(_holds_history(child, depth - 1) for child in children)


def _hook(module: nn.Module, name: str, recorder: _Recorder) -> list[Any]:
    """Hooks that make a top-level call of ``module`` one ``call_module`` node."""

    def before(mod: nn.Module, args: tuple, kwargs: dict) -> None:
        if recorder.depth == 0:
            recorder.visible = set()
            node = recorder.graph.call_module(name, recorder.lift(args, f"segment {name!r}"),
                                              recorder.lift(kwargs, f"segment {name!r}"))
            mark_modes(node)
            recorder.calls.append(node)
        recorder.depth += 1

    def after(mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        recorder.depth -= 1
        if recorder.depth == 0:
            recorder.bind(recorder.calls[-1], output)

    return [module.register_forward_pre_hook(before, with_kwargs=True),
            module.register_forward_hook(after, with_kwargs=True)]


def _region_hooks(module: nn.Module, name: str, recorder: _Recorder) -> list[Any]:
    """Hooks that mark the operations ``module``'s own code makes (outside its segment children) as a region:
    each becomes a unit of its own (:func:`_initial_starts`)."""

    def before(mod: nn.Module, args: tuple) -> None:
        if recorder.depth == 0:
            recorder.regions.append(name)

    def after(mod: nn.Module, args: tuple, output: Any) -> None:
        if recorder.depth == 0 and recorder.regions and recorder.regions[-1] == name:
            recorder.regions.pop()

    return [module.register_forward_pre_hook(before), module.register_forward_hook(after)]


# -- 3. cutting into units ---------------------------------------------------------
def _cut(model: nn.Module, rec: _Recording, inputs: Any, targets: Any, loss_fn: Callable,
         max_nodes: int | None) -> Segments:
    """Units at every segment call, merged until none corrupts or aliases another's value.

    A unit that is one in-place module (``nn.ReLU(inplace=True)`` after a
    BatchNorm: torchvision's ResNet stem) is made out-of-place instead of
    merged: the same values, and its producer's output can then be freed or
    paged on its own.  Merged, resnet18's stem BatchNorm+ReLU backward needs
    53% of the step's memory at once; apart, 44%.
    """
    ops = _views_beside_their_use(rec.ops)
    starts = _initial_starts(ops)
    out_of_place: list[str] = []
    while True:
        segs = _segments(rec, ops, starts, inputs, targets, loss_fn, out_of_place)
        bad, why, seconds = _probe(model, segs, inputs, targets)
        if bad is None:
            break
        module = _lone_inplace_module(model, segs.units[bad - 1]) if why == "in place" else None
        if module is not None:
            out_of_place.append(module)
            model.get_submodule(module).inplace = False
        else:
            views_only = all(_is_region_view(n) for n in segs.units[bad - 1].nodes)
            starts = _merge(starts, bad, segs, forward=why == "view" and views_only and _feeds_next(segs, bad))
    if max_nodes is not None:
        starts = _bound(starts, seconds, max_nodes)
        segs = _segments(rec, ops, starts, inputs, targets, loss_fn, out_of_place)
    return segs


_VIEWS = frozenset({torch.Tensor.view, torch.Tensor.view_as, torch.Tensor.transpose, torch.Tensor.permute,
                    torch.Tensor.unsqueeze, torch.Tensor.squeeze, torch.Tensor.expand, torch.Tensor.t,
                    torch.transpose, torch.permute, torch.unsqueeze, torch.squeeze, torch.t})
"""Operations that always return a view of their first argument and compute nothing."""


def _views_beside_their_use(ops: list[fx.Node]) -> list[fx.Node]:
    """``ops`` with each view a module's own code takes moved down to right before the operation that first
    uses it, where nothing in between reads the viewed tensor (so nothing can change it in place).

    A view is its own unit in a region and returns memory of its input, so it is merged with a neighbour
    (:func:`_merge`); moved beside its use it joins that use, instead of chaining the units between (an
    attention's query, key and value projections) into one.  Views compute nothing: values and gradients
    are the same bits wherever they are taken.  Last views first, so that a view of a view follows it.
    """
    ops = list(ops)
    for view in [n for n in reversed(ops) if _is_region_view(n) and n.users]:
        i = ops.index(view)
        uses = [ops.index(u) for u in view.users if u in ops]
        if len(uses) != len(view.users):
            continue  # also read by the model's output or the loss
        between = ops[i + 1:min(uses)]
        if all(_is_region_view(n) for n in between):
            continue  # beside its use already, or only other views in between (two views of one operation)
        if any(view.args[0] in n.all_input_nodes for n in between):
            continue
        ops.insert(min(uses) - 1, ops.pop(i))
    return ops


def _lone_inplace_module(model: nn.Module, unit: Unit) -> str | None:
    """The name of the unit's only module when that module works in place and can be told not to."""
    calls = [n for n in unit.nodes if n.op == "call_module"]
    if len(calls) != 1 or len(unit.nodes) != 1 + sum(n.target is pytree_leaf for n in unit.nodes):
        return None
    module = model.get_submodule(calls[0].target)
    return calls[0].target if getattr(module, "inplace", None) is True else None


def _initial_starts(ops: list[fx.Node]) -> list[int]:
    """Start of each unit: right after the previous segment call and the leaves picked from it; an operation
    of an expanded module's own code (a region, see :func:`_region_hooks`) is a unit on its own."""
    starts = {0}
    for i, node in enumerate(ops):
        if _is_region_op(node):
            starts.add(i)
        elif node.op != "call_module":
            continue
        end = i + 1
        while end < len(ops) and ops[end].target is pytree_leaf and ops[end].args[0] is node:
            end += 1
        starts.add(end)
    # the glue after the last call joins the last unit
    last_call = max((i for i, n in enumerate(ops) if n.op == "call_module" or _is_region_op(n)), default=0)
    return sorted(k for k in starts if k <= last_call)


def _is_region_op(node: fx.Node) -> bool:
    return _REGION in node.meta and node.target not in (pytree_leaf, same_path)


def _is_region_view(node: fx.Node) -> bool:
    """Whether ``node`` is a view (:data:`_VIEWS`) a module's own code takes."""
    return _is_region_op(node) and node.target in _VIEWS


def _merge(starts: list[int], bad: int, segs: Segments, forward: bool = False) -> list[int]:
    """Merge unit ``bad`` (1-based) into its predecessor, or its successor when it is the first.

    With ``forward`` (the unit is views a module's own code takes of a value it reads, and its successor uses
    them) it joins its successor instead: the view is then taken inside the unit that uses it, and the unit
    that made the value stays as it was.  Joined with its predecessor, a lone ``transpose`` of a key
    projection would pull every unit back to the projection into one (BERT's key, value and query scaling).
    A module that hands its input back (a dropout of probability 0) joins its predecessor: its output goes
    on to later units, which joining the successor would pull in one after another.
    """
    if len(starts) == 1:
        unit = segs.units[0]
        raise ExtractionError(
            f"segment {unit.name!r} modifies the model's input in place or returns a view of it, and there is "
            "no other segment to merge it with; pass explicit segments= that include more of the model")
    if forward and bad < len(starts):
        drop = bad  # the successor's start
    else:
        drop = bad - 1 if bad > 1 else 1  # index into starts of the cut to remove
    return starts[:drop] + starts[drop + 1:]


def _feeds_next(segs: Segments, unit: int) -> bool:
    """Whether a unit after unit ``unit`` (1-based) reads one of its outputs with nothing but views between
    (views moved beside one operation that uses several of them: an attention's query and transposed key)."""
    for after in segs.units[unit:]:
        if any(port.node == unit for _, port in after.inputs):
            return True
        if not all(_is_region_view(n) for n in after.nodes):
            return False
    return False


def _bound(starts: list[int], seconds: list[float], max_nodes: int) -> list[int]:
    """Merge the adjacent pair of units with the least combined time until ``2S + 3 <= max_nodes``."""
    if max_nodes < 5:
        raise ExtractionError(f"max_nodes={max_nodes} is too small: one unit already needs 5 nodes")
    seconds = list(seconds)
    while 2 * len(starts) + 3 > max_nodes:
        k = min(range(len(starts) - 1), key=lambda i: seconds[i] + seconds[i + 1])
        seconds[k:k + 2] = [seconds[k] + seconds[k + 1]]
        starts = starts[:k + 1] + starts[k + 2:]
    return starts


def _segments(rec: _Recording, ops: list[fx.Node], starts: list[int], inputs: Any, targets: Any,
              loss_fn: Callable, out_of_place: list[str]) -> Segments:
    bounds = list(zip(starts, [*starts[1:], len(ops)]))
    where = {n: u for u, (a, b) in enumerate(bounds, 1) for n in ops[a:b]}
    port: dict[fx.Node, Port] = {ph: Port(0, j) for j, ph in enumerate(rec.placeholders)}
    units = []
    for u, (a, b) in enumerate(bounds, 1):
        nodes = ops[a:b]
        outputs = [n for n in nodes if any(where.get(user) != u for user in n.users)]
        port.update({n: Port(u, j) for j, n in enumerate(outputs)})
        external = dict.fromkeys(x for n in nodes for x in n.all_input_nodes if where.get(x) != u)
        # a region's operations may update its buffers (a BatchNorm run as operations): restored like a module's
        modules = [n.target for n in nodes if n.op == "call_module"] + list(
            dict.fromkeys(n.meta[_REGION] for n in nodes if _is_region_op(n)))
        units.append(Unit("", tuple(nodes), tuple((x, port[x]) for x in external), tuple(outputs), tuple(modules)))
    named: list[Unit] = []
    for unit in units:
        named.append(_named(unit, named))
    units = named
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    leaves, spec = tree_flatten((args, targets))
    return Segments(
        graph=rec.graph, units=tuple(units), loss_fn=loss_fn, example_spec=spec,
        example_meta=tuple(TensorMeta.of(x) if isinstance(x, torch.Tensor) else x for x in leaves),
        output_spec=rec.output_spec,
        output_leaves=tuple(port[x] if isinstance(x, fx.Node) else x for x in rec.output_leaves),
        arg_tensors=len(rec.placeholders), constants=tuple(rec.constants.values()),
        out_of_place=tuple(out_of_place),
    )


def _op_name(node: fx.Node) -> str:
    """The name of the torch function a recorded operation called (a lean replacement keeps it)."""
    return node.meta.get(_OP_NAME) or getattr(node.target, "__name__", "op")


def _named(unit: Unit, earlier: list[Unit]) -> Unit:
    mods = [n.target if n.op == "call_module" else f"{n.meta[_REGION]}:{_op_name(n)}"
            for n in unit.nodes if n.op == "call_module" or _is_region_op(n)]
    mods = mods or [_op_name(unit.nodes[0])]  # glue before a region's first operation
    name = mods[0] if len(mods) == 1 else (f"{mods[0]}+{mods[1]}" if len(mods) == 2 else f"{mods[0]}..{mods[-1]}")
    name = name or "model"
    taken = {u.name for u in earlier}
    base, k = name, 2
    while name in taken:
        name, k = f"{base}#{k}", k + 1
    return Unit(name, unit.nodes, unit.inputs, unit.outputs, unit.modules)


def _probe(model: nn.Module, segs: Segments, inputs: Any, targets: Any) -> tuple[int | None, str, list[float]]:
    """Run the units once without grad; the first that writes into (``"in place"``) or returns a view of
    (``"view"``) an input, and times."""
    modules = dict(model.named_modules())
    node0 = segs.flatten_example(inputs, targets)
    values: dict[Port, torch.Tensor] = {Port(0, j): t for j, t in enumerate(node0)}
    seconds = []
    with torch.no_grad():
        for u, unit in enumerate(segs.units, 1):
            env = {n: values[p] for n, p in unit.inputs}
            versions = [t._version for t in env.values()]
            started = time.perf_counter()
            outputs = run_unit(unit, env, modules)
            seconds.append(time.perf_counter() - started)
            shared = {t.untyped_storage().data_ptr() for t in env.values() if t.untyped_storage().nbytes()}
            aliased = any(isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() in shared for o in outputs)
            if [t._version for t in env.values()] != versions:
                return u, "in place", seconds
            if aliased:
                return u, "view", seconds
            values.update({Port(u, j): o for j, o in enumerate(outputs)})
    return None, "", seconds


# -- 4. measuring -------------------------------------------------------------------
@dataclass
class _Measured:
    bytes: list[int]
    compute_ms: list[float]
    refs: dict[int, set[int]]
    grad_ports: dict[int, set[Port]]
    reads: dict[int, set[int]] = field(default_factory=dict)  # backward node -> backward values it read
    workspace: list[int] = field(default_factory=list)
    parameters: tuple[Parameter, ...] = ()
    light: dict[int, int] = field(default_factory=dict)  # light forward node -> bytes its backward keeps


LIGHT_SAVED_BYTES = 64 << 10
"""At most this many bytes of its own may a unit's backward save for the unit to be light (``Segments.light``):
a BatchNorm's or LayerNorm's statistics, not a dropout mask or a ReLU's output."""

STREAM_PROBE_BYTES = 1 << 20
"""Column blocks of a streamed weight's gradient while extraction measures (the plan adds its own block)."""


class _GradientProbe:
    """Which backward nodes add to each trained parameter's gradient; then gradients as the executor's steps
    with updates in the backward pass hold them.

    While ``counting`` (the first run) every accumulation is recorded under the node computing.  Afterwards
    a gradient is dropped once its last recorded contribution arrived (``free_final``), and the weights
    :attr:`stream_names` names have their gradient made in column blocks and dropped block by block
    (:mod:`engine.optim.streamed`).  An embedding table looked up once per step whose gradient, in the first
    run, is zero outside the rows looked up is marked for updates by rows (:mod:`engine.optim.rows`), with the
    number of ids a step looked it up by.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.node = -1
        self.counting = True
        self.nodes: dict[int, list[int]] = {id(p): [] for _, p in self.params}
        self._seen: dict[int, int] = {}
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_gradient) for _, p in self.params]
        self.stream_names: list[str] = []
        self.factors: dict[int, int] = {}  # streamed weight's data_ptr -> bytes of its gradient's two factors
        self.free_final = True  # off while workspaces are measured: a node's own gradients are not its workspace
        trained = {id(p) for _, p in self.params}
        self._lookups: dict[int, list[torch.Tensor]] = {}  # table weight's id -> the ids of its lookups (first run)
        self._row_sparse: dict[int, bool] = {}  # ... -> its gradient was zero outside the looked-up rows
        for m in model.modules():
            if row_updatable(m) and id(m.weight) in trained:
                self._lookups[id(m.weight)] = []
                self._hooks.append(m.register_forward_pre_hook(self._on_lookup))

    def _on_lookup(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if self.counting and args and isinstance(args[0], torch.Tensor):
            self._lookups[id(module.weight)].append(args[0].detach().reshape(-1).clone())

    def _on_gradient(self, param: torch.Tensor) -> None:
        if param.grad is None:
            return
        if self.counting:
            nodes = self.nodes[id(param)]
            if not nodes or nodes[-1] != self.node:
                nodes.append(self.node)
            lookups = self._lookups.get(id(param))
            if lookups is not None and len(lookups) == 1:
                others = torch.ones(param.shape[0], dtype=torch.bool)
                others[lookups[0]] = False
                self._row_sparse[id(param)] = not bool(param.grad[others].any())
            return
        self._seen[id(param)] = self._seen.get(id(param), 0) + 1
        if self.free_final and self._seen[id(param)] >= len(self.nodes[id(param)]):
            param.grad = None

    def start_run(self) -> None:
        self._seen.clear()
        for _, p in self.params:
            p.grad = None

    def stop_counting(self) -> None:
        """After the first run: decide which weights stream, and free gradients from now on."""
        self.counting = False
        single = {id(p) for _, p in self.params if len(self.nodes[id(p)]) == 1}
        self.stream_names = [name for name, m in self.model.named_modules()
                             if streamable(m) and id(m.weight) in single]

    def streaming(self) -> Any:
        return streaming(self.model, self.stream_names, self)

    def chunking_of(self, weight: torch.Tensor) -> Chunking:
        return Chunking.of(weight, STREAM_PROBE_BYTES, columns=True)

    def weight_gradient(self, weight: torch.Tensor, grad_out: torch.Tensor, inputs: torch.Tensor) -> None:
        """A streamed weight's gradient: its blocks made and dropped (a block at a time, as applied in the
        foreground); the size of its factors noted (what a background update keeps of it)."""
        self.factors[weight.data_ptr()] = grad_out.nbytes + inputs.nbytes
        chunking = self.chunking_of(weight)
        for start, end in chunking.bounds:
            grad_out.t().mm(inputs[:, start:end])

    def layout(self) -> tuple[Parameter, ...]:
        streamed = {self.model.get_submodule(name).weight.data_ptr() for name in self.stream_names}
        return tuple(Parameter(name, p.nbytes, tuple(self.nodes[id(p)]), p.data_ptr() in streamed,
                               self.factors.get(p.data_ptr(), 0),
                               column_unit_bytes(p) if p.data_ptr() in streamed else 0, *self._table_rows(p))
                     for name, p in self.params if self.nodes[id(p)])

    def _table_rows(self, p: torch.Tensor) -> tuple[int, int]:
        """``(rows, row_bytes)`` of a table updated by rows: the ids its one lookup a step took; else zeros."""
        lookups = self._lookups.get(id(p), [])
        if len(lookups) != 1 or not self._row_sparse.get(id(p)) or len(self.nodes[id(p)]) != 1:
            return 0, 0
        return min(lookups[0].numel(), p.shape[0]), p.shape[1] * p.element_size()

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()


def _measure(model: nn.Module, segs: Segments, inputs: Any, targets: Any, repeats: int,
             following: bool) -> _Measured:
    """Run the step store-all ``repeats + 1`` times (the first warms up) through the executor's runtime.

    Large allocations are on mmap by then (:func:`extract` calls
    :func:`engine.rss.return_freed_memory` first), as in the executor's steps:
    times include the page faults of fresh tensors the executor pays too, and
    RSS follows tensors for the workspace runs.
    """
    runtime = Runtime(model, segs)
    samples: list[list[float]] = [[] for _ in range(segs.size)]
    first: _Measured | None = None
    probe = _GradientProbe(model)
    try:
        for run in range(repeats + 1):
            probe.start_run()
            runtime.start(inputs, targets)
            with probe.streaming() if run else nullcontext():
                for node in range(segs.size):
                    probe.node = node
                    started = time.perf_counter()
                    runtime.compute(node)
                    samples[node].append((time.perf_counter() - started) * 1e3)
            if first is None:
                first = _Measured(
                    bytes=[runtime.value_bytes(i) for i in range(segs.size)], compute_ms=[],
                    refs={f: runtime.references(f) for f in range(1, segs.loss_node + 1)},
                    grad_ports={b: runtime.gradient_ports(b) for b in range(segs.loss_node + 1, segs.size)},
                    reads={b: set(r) for b, r in runtime.reads.items()}, light=_light_units(runtime, segs))
                probe.stop_counting()
            runtime.finish()
        first.compute_ms = [statistics.median(s[1:] if repeats else s) for s in samples]
        first.parameters = probe.layout()
        # repeats=0 asks for structure and bytes only (re-cutting a model to match a saved graph)
        measure = following and repeats > 0
        first.workspace = _measure_workspace(runtime, segs, first.bytes, inputs, targets, probe) if measure \
            else [0] * segs.size
    finally:
        probe.close()
        probe.start_run()
    return first


def _light_units(runtime: Runtime, segs: Segments) -> dict[int, int]:
    """The units whose backward reads none of their outputs and keeps at most :data:`LIGHT_SAVED_BYTES` of its
    own, with those bytes (read from a store-all run's values, every one still in the store)."""
    light = {}
    for f in range(1, segs.loss_node):
        value = runtime.store.values[f]
        outputs = {ref.slot for ref in value.outputs if isinstance(ref, Handle) and ref.node == f}
        kept = sum(value.slot_bytes[slot] for slot in value.saved_slots)
        if not value.saved_slots & outputs and kept <= LIGHT_SAVED_BYTES:
            light[f] = kept
    return light


def _measure_workspace(runtime: Runtime, segs: Segments, value_bytes: list[int], inputs: Any, targets: Any,
                       probe: _GradientProbe, passes: int = 2) -> list[int]:
    """Each node's workspace: the process's peak RSS while it computes, above what it held before and its value.

    Measured on the real step, because what a backward pass holds while it
    runs (the activation gradients inside its unit, kernel scratch) is decided
    by PyTorch's kernels, not visible from Python.  Needs RSS to follow
    tensors (:func:`engine.rss.return_freed_memory`); a first run
    warms up, the largest figure of ``passes`` runs after it is kept.  Each
    run starts with ``.grad = None``, as the executor's steps do; the parameter
    gradients a node makes are left out of its workspace (a whole-step plan
    counts them itself, :mod:`schedules.step_memory`; an activation budget
    leaves them out), and large linear weights stream theirs in column blocks
    (``probe``), so none of them is ever whole.  Zero for every node where peak
    RSS cannot be read (not Linux).
    """
    workspace = [0] * segs.size
    params = [p for p in runtime.model.parameters() if p.requires_grad]
    has_grad: set[int] = set()
    probe.free_final = False  # the gradients a node makes are left out below (the plan counts them itself)
    for run in range(passes + 1):
        probe.start_run()
        runtime.start(inputs, targets)
        with probe.streaming():
            for node in range(segs.size):
                before = rss.start_window()
                runtime.compute(node)
                peak = rss.peak_since_start()
                if before is None or peak is None:
                    return [0] * segs.size
                new_grads = sum(p.grad.nbytes for p in params if p.grad is not None and id(p) not in has_grad)
                has_grad.update(id(p) for p in params if p.grad is not None)
                if run:
                    workspace[node] = max(workspace[node], peak - before - value_bytes[node] - new_grads)
        has_grad.clear()
        runtime.finish()
    return workspace


def _build_graph(model: nn.Module, segs: Segments, m: _Measured) -> TrainingGraph:
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


def _edges(segs: Segments, m: _Measured) -> set[tuple[int, int]]:
    edges: set[tuple[int, int]] = set()
    for f in range(1, segs.loss_node + 1):
        b = segs.backward_of(f)
        edges.update((port.node, f) for port in segs.inputs_of(f))
        if f not in m.light:
            edges.add((f, b))
        edges.update((r, b) for r in m.refs[f])
        edges.update((r, b) for r in m.reads.get(b, ()))  # the running gradient sums it reads (engine.runtime)
    return edges
