"""Segments: a model cut into units that run one at a time, and the graph node ids they map to.

:func:`engine.extract.extract` records a model's forward pass at segment
granularity into a :class:`torch.fx.Graph` and cuts it into *units*: contiguous
runs of fx nodes, each holding one or more segment-module calls plus the glue
code around them (``torch.flatten``, residual adds, mask building).  Every value
that crosses from one unit to another is a tensor, addressed by a :class:`Port`
(producer node id, output index).

Node ids follow POET's layout for ``S`` units (``T = 2S + 3`` nodes)::

    0                 the step's inputs and targets
    1 .. S            forward units, in stage order
    S + 1             the loss
    S + 2 .. 2S + 2   backward nodes, mirrored: backward_of(f) = 2S + 3 - f

:class:`Boundary` is the autograd function that makes a unit's input a
gradient boundary: the unit's backward hands the gradient of that input to a
sink instead of flowing on into the producer's graph.
"""

from __future__ import annotations

from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Sequence

import torch
import torch.fx as fx
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

from engine.errors import InputMismatchError, ScheduleRefusedError


@dataclass(frozen=True, order=True)
class Port:
    """A value crossing units: output ``index`` of graph node ``node``."""

    node: int
    index: int


@dataclass(frozen=True)
class TensorMeta:
    """Shape and dtype a step input must have (the graph's bytes were measured for them)."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorMeta":
        return cls(tuple(t.shape), t.dtype)


@dataclass(frozen=True)
class Unit:
    """One forward node's code: fx nodes run in order, with the values it takes and gives.

    ``inputs`` pairs each external fx value the unit reads with the port that
    produces it; ``outputs`` are the unit's values read by later units or by the
    loss, in port-index order; ``modules`` are the segment modules it calls
    (their buffers are restored after a recomputation).
    """

    name: str
    nodes: tuple[fx.Node, ...]
    inputs: tuple[tuple[fx.Node, Port], ...]
    outputs: tuple[fx.Node, ...]
    modules: tuple[str, ...]


@dataclass
class Segments:
    """A model cut into units; see the module docstring.  Built by :func:`engine.extract.extract`."""

    graph: fx.Graph
    units: tuple[Unit, ...]
    loss_fn: Callable[[Any, Any], torch.Tensor]
    example_spec: TreeSpec                       # of (args, targets)
    example_meta: tuple[TensorMeta | Any, ...]   # per leaf: TensorMeta, or the constant it must equal
    output_spec: TreeSpec                        # of the model's output
    output_leaves: tuple[Port | Any, ...]        # per output leaf: its port, or a constant
    arg_tensors: int = 1                         # node 0 ports below this are model inputs, the rest targets
    constants: tuple[torch.Tensor, ...] = ()     # tensors the trace captured by value
    out_of_place: tuple[str, ...] = ()           # in-place modules that run with inplace=False (a unit each)
    light: frozenset[int] = frozenset()          # forward nodes whose backward needs none of their outputs
    consumers: dict[Port, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.consumers:
            self.consumers = self._find_consumers()

    # -- node ids ----------------------------------------------------------------
    @property
    def size(self) -> int:
        """``T``: graph nodes for these units."""
        return 2 * len(self.units) + 3

    @property
    def loss_node(self) -> int:
        return len(self.units) + 1

    def backward_of(self, forward: int) -> int:
        """Id of the backward node of forward node ``forward`` (a unit or the loss)."""
        return 2 * len(self.units) + 3 - forward

    def forward_of(self, backward: int) -> int:
        """Id of the forward node whose backward node is ``backward``."""
        return 2 * len(self.units) + 3 - backward

    def kind(self, node: int) -> str:
        """``input``, ``forward``, ``loss`` or ``backward``."""
        if node == 0:
            return "input"
        if node <= len(self.units):
            return "forward"
        return "loss" if node == self.loss_node else "backward"

    def name(self, node: int) -> str:
        """The graph name of ``node`` (``input``, a unit name, ``loss``, ``grad:<name>``)."""
        kind = self.kind(node)
        if kind == "backward":
            return "grad:" + self.name(self.forward_of(node))
        return {"input": "input", "loss": "loss"}.get(kind) or self.units[node - 1].name

    def check_graph(self, names: Sequence[str]) -> None:
        """Refuse a graph whose node names are not these segments' (another model or cut)."""
        mine = [self.name(i) for i in range(self.size)]
        if list(names) != mine:
            raise ScheduleRefusedError(
                f"the graph has {len(names)} nodes that do not match these segments ({len(mine)} nodes, "
                f"first units {mine[1:4]}): extract the graph and segments together from the same model")

    # -- inputs ------------------------------------------------------------------
    def flatten_example(self, inputs: Any, targets: Any) -> list[torch.Tensor]:
        """The step's tensors in node 0's port order; refuses shapes the graph was not measured for."""
        args = inputs if isinstance(inputs, tuple) else (inputs,)
        leaves, spec = tree_flatten((args, targets))
        if spec != self.example_spec:
            raise InputMismatchError(f"inputs and targets are structured as {spec}, the graph expects "
                                     f"{self.example_spec}")
        tensors = []
        for i, (leaf, meta) in enumerate(zip(leaves, self.example_meta)):
            if isinstance(meta, TensorMeta):
                if not isinstance(leaf, torch.Tensor) or TensorMeta.of(leaf) != meta:
                    got = TensorMeta.of(leaf) if isinstance(leaf, torch.Tensor) else type(leaf).__name__
                    raise InputMismatchError(
                        f"step input {i} is {got}, the graph was extracted for {meta}: a different batch "
                        "shape needs its own graph and schedule (drop the last partial batch, or re-extract)")
                tensors.append(leaf)
        return tensors

    def targets(self, value_of: Callable[[Port], torch.Tensor]) -> Any:
        """Rebuild the targets tree, reading node 0's target ports with ``value_of``."""
        leaves, port = [], 0
        for meta in self.example_meta:
            if isinstance(meta, TensorMeta):
                leaves.append(value_of(Port(0, port)) if port >= self.arg_tensors else None)
                port += 1
            else:
                leaves.append(meta)
        return tree_unflatten(leaves, self.example_spec)[1]

    def model_output(self, value_of: Callable[[Port], torch.Tensor]) -> Any:
        """Rebuild the model's output tree, reading each port with ``value_of``."""
        leaves = [value_of(p) if isinstance(p, Port) else p for p in self.output_leaves]
        return tree_unflatten(leaves, self.output_spec)

    # -- wiring ------------------------------------------------------------------
    def loss_inputs(self) -> tuple[Port, ...]:
        """Ports the loss reads: the model output's tensors, then node 0's target tensors."""
        outs = tuple(dict.fromkeys(p for p in self.output_leaves if isinstance(p, Port)))
        n_all = sum(isinstance(m, TensorMeta) for m in self.example_meta)
        return outs + tuple(Port(0, j) for j in range(self.arg_tensors, n_all))

    def inputs_of(self, node: int) -> tuple[Port, ...]:
        """Ports forward node ``node`` (a unit or the loss) reads."""
        if node == self.loss_node:
            return self.loss_inputs()
        return tuple(dict.fromkeys(p for _, p in self.units[node - 1].inputs))

    def _find_consumers(self) -> dict[Port, tuple[int, ...]]:
        """For every port, the forward nodes reading it, latest first (the order gradients arrive)."""
        found: dict[Port, set[int]] = {}
        for f in range(1, self.loss_node + 1):
            for port in self.inputs_of(f):
                found.setdefault(port, set()).add(f)
        return {p: tuple(sorted(c, reverse=True)) for p, c in found.items()}


def run_unit(unit: Unit, env: dict[fx.Node, Any], modules: dict[str, torch.nn.Module]) -> list[Any]:
    """Run ``unit``'s fx nodes on ``env`` (its inputs) and return its outputs in port order; a node recorded
    under ``torch.no_grad()`` or ``torch.autocast`` runs under it again (:func:`mark_modes`)."""
    env = dict(env)
    for node in unit.nodes:
        args = fx.node.map_arg(node.args, env.__getitem__)
        kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
        with _recorded_modes(node):
            if node.op == "call_module":
                env[node] = modules[node.target](*args, **kwargs)
            else:  # call_function: glue recorded at the top level, or a pytree leaf of a module's output
                env[node] = node.target(*args, **kwargs)
    return [env[o] for o in unit.outputs]


_NO_GRAD, _AUTOCAST = "poet_no_grad", "poet_autocast"
_AUTOCAST_DEVICES = ("cpu", "cuda")


def mark_modes(node: fx.Node) -> None:
    """Record on ``node``, as it is recorded, the modes the model's own code set around it that change what it
    computes: gradients off (a frozen backbone called under ``torch.no_grad()``, a statistic of the glue) and
    autocast (device type -> dtype).  The default modes leave nothing."""
    if not torch.is_grad_enabled():
        node.meta[_NO_GRAD] = True
    autocast = {d: torch.get_autocast_dtype(d) for d in _AUTOCAST_DEVICES if torch.is_autocast_enabled(d)}
    if autocast:
        node.meta[_AUTOCAST] = autocast


def _recorded_modes(node: fx.Node) -> ContextManager[Any]:
    """The modes :func:`mark_modes` recorded on ``node`` (nothing to enter, mostly)."""
    no_grad, autocast = node.meta.get(_NO_GRAD), node.meta.get(_AUTOCAST)
    if not no_grad and not autocast:
        return nullcontext()
    stack = ExitStack()
    if no_grad:
        stack.enter_context(torch.no_grad())
    for device, dtype in (autocast or {}).items():
        stack.enter_context(torch.autocast(device, dtype=dtype))
    return stack


def same_path(func: Callable, where: str, expected: Any, *args: Any, **kwargs: Any) -> None:
    """A guard the recording put where the model's own code took a tensor's value into Python (an ``if`` on a
    tensor, ``.item()``): the replay computes that value again and stops where it differs from the example's,
    since from there on plain PyTorch would run code the recording does not hold."""
    value = func(*args, **kwargs)
    same = value == expected
    if not isinstance(same, bool):  # numpy arrays and the like compare element by element
        same = type(value) is type(expected) and bool(getattr(same, "all", lambda: same)())
    if not same:
        raise InputMismatchError(
            f"this batch takes another path through {where} than the example extraction recorded: "
            f"{getattr(func, '__name__', func)} gave {_short(value)} where the example gave {_short(expected)}. "
            "The executor replays the example's path, so it stops here rather than train differently from plain "
            "PyTorch; nothing was changed. Extract with an example whose path every batch takes (a transformers "
            "attention mask: an example with padding, and padded batches), or cut so that this code is inside "
            "a segment")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def pytree_leaf(value: Any, index: int) -> Any:
    """Leaf ``index`` of ``value``'s pytree: how a unit picks one tensor out of a module's output."""
    return tree_flatten(value)[0][index]


class Boundary(torch.autograd.Function):
    """Where a value enters a unit: forward is the identity; backward hands the gradient to ``sink``.

    The producer's autograd graph is not linked to the consumer's, so each unit's
    backward can run on its own, when the schedule says, and the gradient of
    each input is kept as the backward node's value.  Only ``sink`` and
    ``port`` are held by the autograd node: never the data.
    """

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, data: torch.Tensor, sink: Callable, port: Port) -> torch.Tensor:
        ctx.sink, ctx.port = sink, port
        return data.view_as(data)  # shares the producer's storage: no copy

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None, None]:
        ctx.sink(ctx.port, grad)
        return None, None, None, None
