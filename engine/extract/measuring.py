"""Step 4 of extraction (:mod:`engine.extract`): run the step in store-all order with the executor's own
runtime and measure each node's bytes, time and workspace, and which values each backward reads.
"""


from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from engine import allocator, rss
from engine.optim.chunks import Chunking, column_unit_bytes
from engine.optim.rows import row_updatable
from engine.optim.streamed import streamable, streaming
from engine.runtime import Runtime
from engine.segments import Port, Segments
from engine.store import Handle
from schedules.graph import Parameter


@dataclass
class Measured:
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


def measure(model: nn.Module, segs: Segments, inputs: Any, targets: Any, repeats: int,
             following: bool) -> Measured:
    """Run the step store-all ``repeats + 1`` times (the first warms up) through the executor's runtime.

    The timed runs take large tensors from the caching allocator's cache, as the executor's steps do
    (:func:`engine.allocator.caching_everything`; fresh mappings where it is switched off, as the
    executor's then are).  Afterwards large allocations are on mmap again (:func:`extract` calls
    :func:`engine.rss.return_freed_memory` first), so RSS follows tensors for the workspace runs.
    """
    runtime = Runtime(model, segs)
    samples: list[list[float]] = [[] for _ in range(segs.size)]
    first: Measured | None = None
    probe = _GradientProbe(model)
    try:
        # timed as the executor's steps run: a freed tensor's memory reused from the caching allocator (where
        # it exists), not faulted in afresh; RSS follows tensors again once the block ends
        with allocator.caching_everything() if repeats else nullcontext():
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
                    first = Measured(
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


