"""The torch side of a training step: compute, free and restore node values, one at a time.

:class:`Runtime` knows nothing of schedules, budgets or files; it does what a
single instruction asks of PyTorch.  The executor drives it from a schedule;
extraction drives it in plain store-all order to measure each node's bytes,
references and time -- so the bytes a graph promises are measured by the very
code that later holds them.

* input node (0): the step's inputs and targets become resident;
* forward node: run its unit with grad, every input entering through a
  :class:`~engine.segments.Boundary`, under saved-tensor hooks that make the
  node own what autograd saves (see :mod:`engine.store`);
* loss node: the same for ``loss_fn(model_output, targets)``;
* backward node: take the gradient of each output its forward node's consumers
  left, run ``torch.autograd.backward`` on the unit's saved graph -- parameter
  ``.grad`` accumulates as usual -- and keep the gradients of the unit's inputs.

A *light* forward node (``Segments.light``: its backward reads none of its
outputs and saves little of its own, see :mod:`engine.extract`) has no graph
edge to its backward node: freeing it before its backward keeps its autograd
graph and the few saved bytes (:meth:`engine.store.Store.release`), so the
backward of a convolution or a BatchNorm runs with its input, the gradient of
its output and the gradient it makes -- not its output too.

A value read by several units gets its gradient summed in plain autograd's
order: plain ``backward()`` adds the contributions of the later-created
operations first, into one buffer.  So the backward node of each consumer
*seeds* the boundary its input entered through with the sum the later
consumers left (a root of its ``autograd.backward`` call, which autograd
puts in that buffer before any of the unit's own contributions), and the
earliest consumer's gradient is the whole sum, the bits of plain autograd.
Only that running sum is ever needed: the later consumers' partial sums die
with the seed, and extraction makes each consumer's backward read the one
before it (:attr:`Runtime.reads`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

from engine.errors import ExecutorError
from engine.replay import OutsideRng, Replay, RngState
from engine.segments import Boundary, Port, Segments, run_unit
from engine.store import Handle, Store, Value


class Runtime:
    """Computes and drops the node values of one step of ``model`` cut as ``segments``."""

    def __init__(self, model: nn.Module, segments: Segments) -> None:
        self.model = model
        self.segments = segments
        self.modules = dict(model.named_modules())
        for name in segments.out_of_place:  # extraction measured them out-of-place (same values)
            self.modules[name].inplace = False
        self.store = Store()
        self.replay = Replay()
        self.loss: torch.Tensor | None = None
        # Boundary outputs need *some* input that requires grad; this leaf never receives one.
        self._anchor = torch.zeros((), requires_grad=True)
        self._node0: list[torch.Tensor] = []
        self._filling: Value | None = None             # backward value receiving input gradients
        self._deposited: dict[int, set[Port]] = {}     # backward node -> ports it holds gradients for
        self._holder: dict[Port, int] = {}             # port -> backward node holding its gradient's running sum
        self._seeds: dict[Port, torch.Tensor] = {}     # seeds of the backward node running: port -> the seed
        self.reads: dict[int, set[int]] = {}           # backward node -> backward nodes whose gradients it read
        self._buffers = {u: self._unit_buffers(u) for u in range(1, len(segments.units) + 1)}

    # -- step --------------------------------------------------------------------
    def start(self, inputs: Any, targets: Any) -> None:
        """Begin a step on this batch (refusing shapes the graph was not measured for)."""
        self._node0 = [_own_storage(t) for t in self.segments.flatten_example(inputs, targets)]
        self.store.clear()
        self.store.set_fixed([*self.model.parameters(), *self.model.buffers(), *self.segments.constants])
        self.replay.reset()
        self._deposited.clear()
        self._holder.clear()
        self.reads.clear()
        self.loss = None

    def finish(self) -> None:
        """End the step: drop every value and the batch."""
        self.store.clear()
        self._node0 = []
        self._filling = None

    # -- instructions ------------------------------------------------------------
    def compute(self, node: int) -> None:
        """Compute (or recompute) ``node``; its value becomes resident."""
        kind = self.segments.kind(node)
        if kind == "input":
            self._input()
        elif kind == "forward":
            self._forward(node)
        elif kind == "loss":
            self._loss()
        else:
            self._backward(node)

    def free(self, node: int, keep_skeleton: bool = False) -> int:
        """Drop ``node``'s RAM copy; with ``keep_skeleton`` it can be paged back in. Returns bytes freed.

        A light forward node whose backward is still to run keeps its graph and saved slots for it."""
        value = self.store.values.get(node)
        pending = node in self.segments.light and value is not None and any(r is not None for r in value.roots)
        return self.store.release(node, keep_skeleton, keep_slots=pending)

    def storages(self, node: int) -> list[torch.UntypedStorage]:
        """The storages of resident ``node``, in slot order: what a page holds."""
        return list(self.store.value(node).storages)

    def install(self, node: int, storages: list[torch.UntypedStorage]) -> None:
        """Restore a paged-out ``node`` from storages read back from flash."""
        self.store.install(node, storages)

    def value_bytes(self, node: int) -> int:
        """Bytes of ``node``'s value (resident or not, as long as it has a skeleton)."""
        return self.store.values[node].nbytes

    def references(self, node: int) -> set[int]:
        """Other nodes whose storages ``node``'s saved tensors point into."""
        return set(self.store.values[node].refs)

    def gradient_ports(self, backward: int) -> set[Port]:
        """Ports backward node ``backward`` left a gradient for."""
        return set(self._deposited.get(backward, ()))

    # -- node kinds --------------------------------------------------------------
    def _input(self) -> None:
        value = self.store.new(0)
        value.outputs = [self.store.adopt(value, t) for t in self._node0]
        value.roots = [None] * len(self._node0)

    def _forward(self, node: int) -> None:
        unit = self.segments.units[node - 1]
        env = {fx_node: self._enter(node, port) for fx_node, port in unit.inputs}
        value = self.store.new(node)
        value.entries = _entries(dict(zip((p for _, p in unit.inputs), env.values())))
        with self.replay.computing(node, self._buffers[node]), self.store.capturing(value):
            outputs = run_unit(unit, env, self.modules)
        del env
        self._set_outputs(value, outputs, unit.name)

    def _loss(self) -> None:
        node = self.segments.loss_node
        entered = {port: self._enter(node, port) for port in self.segments.loss_inputs()}
        value = self.store.new(node)
        value.entries = _entries(entered)
        with self.replay.computing(node, ()), self.store.capturing(value):
            output = self.segments.model_output(entered.__getitem__)
            loss = self.segments.loss_fn(output, self.segments.targets(entered.__getitem__))  # scalar
        del entered, output
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ExecutorError(f"loss_fn must return a one-element tensor, got {type(loss).__name__}")
        self._set_outputs(value, [loss], "loss")
        if self.loss is None:
            self.loss = loss.detach().clone()

    def _backward(self, node: int) -> None:
        forward = self.segments.forward_of(node)
        light = forward in self.segments.light
        fvalue = self.store.values.get(forward) if light else self.store.value(forward)
        if light and (fvalue is None or not (fvalue.resident or fvalue.kept is not None)):
            fvalue = Value(forward, resident=False)  # released with no output needing a gradient: none to pass
        roots, grads = [], []
        for index, root in enumerate(fvalue.roots):
            grad = self._output_grad(forward, index) if root is not None else None
            if grad is not None:
                roots.append(root)
                grads.append(grad)
        value = self.store.new(node)
        self._deposited[node] = set()
        self.reads.setdefault(node, set())
        self._seeds = {}
        if roots:  # the unit's inputs start from the running sums the later consumers left (module docstring)
            for port, edge in fvalue.entries.items():
                holder = self._holder.get(port)
                if holder is not None:
                    self._seeds[port] = self._read_grad(node, holder, port)
                    roots.append(edge)
                    grads.append(self._seeds[port])
        self._filling = value
        try:
            if roots:
                torch.autograd.backward(roots, grads)  # accumulates parameter .grad as loss.backward() does
        finally:
            self._filling = None
            self._seeds = {}
        fvalue.roots = [None] * len(fvalue.roots)  # autograd freed that graph: it cannot run twice
        fvalue.entries = {}
        if light and not fvalue.resident and self.store.values.get(forward) is fvalue:
            self.store.forget(forward)  # released before its backward: nothing of it is needed any more

    # -- helpers -----------------------------------------------------------------
    def _enter(self, consumer: int, port: Port) -> torch.Tensor:
        """The value at ``port`` as seen by ``consumer``: behind a gradient boundary when it needs grad."""
        ref = self.store.value(port.node).outputs[port.index]
        tensor = self.store.tensor(ref)
        if not ref.requires_grad:
            return tensor
        return Boundary.apply(self._anchor, tensor.detach(), self._deposit, (consumer, port))

    def _deposit(self, key: tuple[int, Port], grad: torch.Tensor) -> None:
        """Boundary sink: keep the gradient of ``port`` as part of the consumer's backward value."""
        consumer, port = key
        value = self._filling
        if value is None or value.node != self.segments.backward_of(consumer):
            raise ExecutorError(f"a gradient for {port} arrived outside backward node "
                                f"{self.segments.backward_of(consumer)}")
        seed = self._seeds.get(port)
        if seed is not None and grad.untyped_storage().data_ptr() == seed.untyped_storage().data_ptr() \
                and grad.storage_offset() == seed.storage_offset():
            return  # the unit added nothing: the running sum stays with the consumer that holds it
        # A gradient passed straight through (an addition's) stays in the node that made it: this value holds a
        # reference, and whoever reads it reads that node too (:meth:`_read_grad`), as plain autograd shares it.
        value.grads[port] = self.store.adopt(value, grad)
        self._deposited[value.node].add(port)
        self._holder[port] = value.node

    def _output_grad(self, forward: int, index: int) -> torch.Tensor | None:
        """The gradient of ``forward``'s output ``index``: ones for the loss, else the sum its consumers left
        (held by the earliest consumer that added to it: see the module docstring)."""
        if forward == self.segments.loss_node:
            loss = self.store.tensor(self.store.value(forward).outputs[index])
            return torch.ones_like(loss, memory_format=torch.preserve_format)  # what loss.backward() seeds
        port = Port(forward, index)
        holder = self._holder.get(port)
        if holder is None:
            return None
        return self._read_grad(self.segments.backward_of(forward), holder, port)

    def _read_grad(self, reader: int, holder: int, port: Port) -> torch.Tensor:
        """The running gradient sum of ``port`` that ``holder`` keeps, read by backward node ``reader``; the read
        is recorded for the holder and, where the sum is another node's gradient passed straight through, for
        that node too (its storage is the one read)."""
        ref = self.store.value(holder).grads[port]
        reads = self.reads.setdefault(reader, set())
        reads.add(holder)
        if isinstance(ref, Handle):
            reads.add(ref.node)
        return self.store.tensor(ref)

    def _set_outputs(self, value: Value, outputs: list[Any], name: str) -> None:
        for out in outputs:
            if not isinstance(out, torch.Tensor):
                raise ExecutorError(f"unit {name!r} passes a {type(out).__name__} to a later unit; only "
                                    "tensors can cross segments (re-extract with other segments)")
            owner = self.store.owner_of(out)
            if owner not in (None, value.node):
                raise ExecutorError(f"unit {name!r} returns a view of node {owner}'s value; re-extract so that "
                                    "the view is made inside one segment")
            value.outputs.append(self.store.adopt(value, out))
            value.roots.append(get_gradient_edge(out) if out.requires_grad else None)

    def _unit_buffers(self, node: int) -> list[torch.Tensor]:
        unit = self.segments.units[node - 1]
        seen: dict[int, torch.Tensor] = {}
        for name in unit.modules:
            for buffer in self.modules[name].buffers():
                seen[id(buffer)] = buffer
        return list(seen.values())


class ModelState:
    """What a step changes in the model, saved at its start so an aborted step can be undone.

    Every parameter enters the step with ``.grad = None``, so autograd hands
    each new gradient over to ``.grad`` instead of adding it into an existing
    tensor (which would hold a second copy of it while it is added: up to
    21 MB on resnet18, 31 MB for BERT's embeddings).  Gradients are handled by
    what they held:

    * ``None`` (``zero_grad()``'s default): nothing to do; a rollback sets them back to ``None``;
    * all zeros (``zero_grad(set_to_none=False)``): dropped for the step, so their
      memory is free while the step runs; a parameter the step gives no gradient
      gets zeros of the same layout back, and so does every one on rollback.
      Values are those of plain ``backward()`` (``0 + g == g``);
    * anything else (gradient accumulation across steps): set aside and added back,
      in place, once the step succeeds -- the one case that holds two copies.

    ``keep_grads`` leaves gradients alone (updates fused into the backward pass
    consume them; their owner drops them if the step fails): buffers and the
    RNG are still restored on rollback.  ``outside_rng`` restores NumPy's and
    Python's generators too (off where nothing is known to draw from them: an
    executor's step after :class:`~engine.replay.Replay` has learned its units).
    """

    def __init__(self, model: nn.Module, keep_grads: bool = False, outside_rng: bool = True) -> None:
        self.params = [] if keep_grads else [p for p in model.parameters() if p.requires_grad]
        zero = [g is not None and _all_zero(g) for g in (p.grad for p in self.params)]
        # zeros are remembered by layout only: holding the tensors would keep their memory through the step
        self.zeros = [_layout(p.grad) if z else None for p, z in zip(self.params, zero)]
        self.aside = [None if z else p.grad for p, z in zip(self.params, zero)]
        with torch.no_grad():
            self.buffers = [(b, b.clone()) for b in model.buffers()]
        self.rng = RngState.capture()
        # a failed step or an extraction draws nothing from them either
        self.outside_rng = OutsideRng.capture() if outside_rng else None
        for p in self.params:
            p.grad = None

    def commit(self) -> None:
        """The step succeeded: fold the set-aside gradients back in, give zeros back where no gradient came."""
        with torch.no_grad():
            for p, old, zeros in zip(self.params, self.aside, self.zeros):
                if old is not None:
                    p.grad = old if p.grad is None else old.add_(p.grad)
                elif zeros is not None and p.grad is None:
                    p.grad = _zeros(zeros)

    def rollback(self) -> None:
        """The step failed: gradients, buffers and RNG as they were before it."""
        with torch.no_grad():
            for p, old, zeros in zip(self.params, self.aside, self.zeros):
                p.grad = _zeros(zeros) if zeros is not None else old
            for buffer, saved in self.buffers:
                buffer.copy_(saved)
        self.rng.restore()
        if self.outside_rng is not None:
            self.outside_rng.restore()


def _entries(entered: dict[Port, torch.Tensor]) -> dict[Port, GradientEdge]:
    """The autograd edges of the boundaries a unit's inputs entered through (those that need a gradient)."""
    return {port: get_gradient_edge(t) for port, t in entered.items() if t.requires_grad}


def _all_zero(t: torch.Tensor) -> bool:
    """Whether every element of ``t`` is +0 (bit-wise: -0.0 and NaN count as values, which is safe).

    Counts the nonzero 64-bit words of a CPU tensor's bytes, several times faster than
    ``Tensor.any()`` on a model's gradients; it runs once a step for every
    ``zero_grad(set_to_none=False)``.
    """
    if t.device.type != "cpu" or not t.is_contiguous():
        return not bool(t.any())
    raw = t.detach().reshape(-1).view(torch.uint8)
    if raw.numel() % 8 == 0 and raw.storage_offset() % 8 == 0:
        raw = raw.view(torch.int64)
    return int(torch.count_nonzero(raw)) == 0


def _layout(t: torch.Tensor) -> tuple:
    return t.size(), t.stride(), t.dtype, t.device


def _zeros(layout: tuple) -> torch.Tensor:
    size, stride, dtype, device = layout
    return torch.empty_strided(size, stride, dtype=dtype, device=device).zero_()


def _own_storage(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a copy when it is a view into a larger storage (a batch sliced from a dataset)."""
    return t if t.untyped_storage().nbytes() == t.nbytes else t.clone()
