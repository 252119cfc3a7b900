"""The operator-level bound: the least memory any exact schedule of a model's training step can need.

However finely a step is cut, one autograd operator's backward runs as one
kernel call: it needs, all at once, what its forward saved (a BatchNorm's
input, a ReLU's output, a max-pool's indices), the gradient of its output and
the gradient of its input it makes.  :func:`operator_bound` runs one plain
forward and backward pass and returns the largest such working set, in bytes of
the storages involved (a view holds its whole storage in RAM).  Parameters,
buffers and parameter gradients are left out: the activation budget leaves
them out too (the optimizer's updates stream large weights' gradients in
blocks, :mod:`engine.optim`).  Kernel scratch is not counted either: it is
invisible from Python, so the bound is a little below what even a perfect cut
reaches.

Used by :func:`engine.extract.extract`, which records it in the graph
(``TrainingGraph.operator_bound_bytes``) for ``poet-edge profile`` and
``solve`` to print beside the floor a schedule can reach.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn


def operator_bound(model: nn.Module, inputs: Any, targets: Any, loss_fn: Callable[[Any, Any], torch.Tensor]) -> int:
    """Bytes of the largest working set one autograd operator's backward needs in a plain training step.

    Runs ``loss_fn(model(*inputs), targets).backward()`` once: the caller restores gradients, buffers and the
    RNG state (:class:`engine.runtime.ModelState`).
    """
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    fixed = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    loss = loss_fn(model(*args), targets)
    saved: dict[torch.autograd.graph.Node, dict[int, int]] = {}
    largest = 0

    toward_parameters = _parameter_side(loss.grad_fn)

    def after(node: Any) -> Callable[[tuple, tuple], None]:
        activation_inputs = [edge[0] is not None and edge[0] not in toward_parameters for edge in node.next_functions]

        def hook(grad_inputs: tuple, grad_outputs: tuple) -> None:
            nonlocal largest
            held = dict(saved.pop(node, {}))
            made = [g for g, active in zip(grad_inputs, activation_inputs) if active]
            for grad in (*grad_outputs, *made):
                _add(held, grad, fixed)
            largest = max(largest, sum(held.values()))

        return hook

    for node in _nodes(loss.grad_fn):
        if node in toward_parameters:
            continue  # a weight's transpose or view on its way to .grad: parameter side, not activations
        saved[node] = {}
        for tensor in _saved_tensors(node):
            _add(saved[node], tensor, fixed)
        node.register_hook(after(node))
    loss.backward()
    return largest


def _nodes(root: Any) -> list[Any]:
    """Every autograd node reachable from ``root`` (the parameters' AccumulateGrad nodes left out)."""
    seen, stack, out = set(), [root], []
    while stack:
        node = stack.pop()
        if node is None or node in seen or _accumulates(node):
            continue
        seen.add(node)
        out.append(node)
        stack.extend(edge[0] for edge in node.next_functions)
    return out


def _parameter_side(root: Any) -> set[Any]:
    """The nodes that only carry parameters' gradients to ``.grad``: the AccumulateGrad nodes, and those (a
    linear layer's ``weight.t()``) whose every input is a parameter or such a node."""
    side: dict[Any, bool] = {}
    stack = [root]
    while stack:  # post-order without recursion (graphs are deep): a node once all its inputs are decided
        node = stack[-1]
        if node in side:
            stack.pop()
            continue
        nexts = [edge[0] for edge in node.next_functions]
        pending = [n for n in nexts if n is not None and n not in side]
        if pending:
            stack.extend(pending)
            continue
        # an input without a gradient (None: the batch, a buffer) is an activation's, not a parameter's
        side[node] = _accumulates(node) or (bool(nexts) and all(n is not None and side[n] for n in nexts))
        stack.pop()
    return {node for node, only in side.items() if only}


def _accumulates(node: Any) -> bool:
    return node is not None and type(node).__name__ == "AccumulateGrad"


def _saved_tensors(node: Any) -> list[torch.Tensor]:
    """What the node's forward saved: ``_saved_*`` attributes of built-in operators, ``saved_tensors`` of
    custom autograd functions."""
    found: list[torch.Tensor] = []
    names = [n for n in dir(node) if n.startswith("_saved_")]
    if hasattr(node, "saved_tensors"):
        names.append("saved_tensors")
    for name in names:
        try:
            value = getattr(node, name)
        except RuntimeError:  # freed, or not a tensor attribute this build can unpack
            continue
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, torch.Tensor):
                found.append(item)
    return found


def _add(held: dict[int, int], tensor: Any, fixed: set[int]) -> None:
    """Count ``tensor``'s storage in ``held`` (once per storage; parameters, buffers and empty ones not)."""
    if not isinstance(tensor, torch.Tensor):
        return
    storage = tensor.untyped_storage()
    ptr = storage.data_ptr()
    if storage.nbytes() and ptr not in fixed:
        held[ptr] = storage.nbytes()
