"""Step 2 of extraction (:mod:`engine.extract`): record one forward pass as a :class:`torch.fx.Graph` of
segment calls and the tensor operations between them, with guards where glue reads a tensor's value.
"""


from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
import torch.nn as nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from engine.composites import composite_body
from engine.errors import ExtractionError
from engine.lean_backward import lean_version
from engine.replay import OutsideRng
from engine.segments import mark_modes, pytree_leaf, same_path


REGION = "poet_region"  # fx node meta: the expanded module whose own code made this operation
OP_NAME = "poet_op"  # fx node meta: the name of the torch function the recorded operation called


@dataclass
class Recording:
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
        self.outside = OutsideRng.capture()       # NumPy's and Python's generators as the glue last left them
        self.glue_draws = False                   # the glue drew from them: the recording would fix the numbers

    def glue_ran(self) -> None:
        """The glue ran up to here (a segment call begins, or the forward ended): note whether it drew."""
        if not self.outside.same_as(OutsideRng.capture()):
            self.glue_draws = True

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
            node.meta[OP_NAME] = name
            mark_modes(node)
            if self.regions:
                node.meta[REGION] = self.regions[-1]
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


def record(model: nn.Module, inputs: Any, names: list[str], regions: Sequence[str] = ()) -> Recording:
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
    recorder.glue_ran()
    if recorder.glue_draws:  # recorded once, replayed every step: what it drew would be drawn once for good
        raise ExtractionError(
            f"{type(model).__name__}'s own code, outside the modules it is cut into, draws from NumPy's global "
            "generator or Python's random (Wav2Vec2's SpecAugment masks, say): the recording would fix those "
            "numbers for every step. Turn that randomness off for training (Wav2Vec2: config.apply_spec_augment "
            "= False), or cut at a module that draws them inside it")
    _refuse_carriers(model, recorder.calls)
    leaves, spec = tree_flatten(output)
    lifted = [recorder.lift(x, "the model output") if isinstance(x, torch.Tensor) else x for x in leaves]
    graph.output(tuple(x for x in lifted if isinstance(x, fx.Node)))
    return Recording(graph, placeholders, lifted, spec, recorder.constants)


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
            recorder.glue_ran()
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
            recorder.outside = OutsideRng.capture()  # a segment's own draws run live in every step

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


