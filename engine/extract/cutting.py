"""Step 3 of extraction (:mod:`engine.extract`): cut the recorded graph into units (forward nodes), merging
units that would modify or share another unit's value, then the cheapest neighbours down to ``max_nodes``.
"""


from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn
from torch.utils._pytree import tree_flatten

from engine.errors import ExtractionError
from engine.segments import Port, Segments, TensorMeta, Unit, pytree_leaf, run_unit, same_path

from engine.extract.recording import OP_NAME, REGION, Recording

def cut_into_units(model: nn.Module, rec: Recording, inputs: Any, targets: Any, loss_fn: Callable,
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
    return REGION in node.meta and node.target not in (pytree_leaf, same_path)


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


def _segments(rec: Recording, ops: list[fx.Node], starts: list[int], inputs: Any, targets: Any,
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
            dict.fromkeys(n.meta[REGION] for n in nodes if _is_region_op(n)))
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
    return node.meta.get(OP_NAME) or getattr(node.target, "__name__", "op")


def _named(unit: Unit, earlier: list[Unit]) -> Unit:
    mods = [n.target if n.op == "call_module" else f"{n.meta[REGION]}:{_op_name(n)}"
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


