"""A large linear layer's weight gradient made and applied a block of columns at a time, never whole.

Fused updates free each gradient as soon as it is applied, but a single
gradient can still be most of a step's memory: vgg11_bn's first classifier
layer has a 411 MB weight, so its gradient alone is a third of what plain
training of the whole model needs.  For ``nn.Linear`` layers with a weight
of at least :data:`STREAM_MIN_BYTES` (and a 2-D input), the backward pass
hands the weight gradient to the fused optimizer as its two factors, and the
optimizer makes it one block of columns at a time (``grad_out.t() @
input[:, a:b]``), updating the same columns of the weight and of its state
before the next block is made (:meth:`engine.optim.fused.FusedOptimizer.weight_gradient`;
with the state on flash, in the background while the backward pass goes on:
the factors are small, a batch of rows each).  The forward pass and the input and bias gradients are computed by
the same kernels as ``F.linear``'s own backward; each output element of the
weight gradient is the same dot product over the batch, which this BLAS sums
the same way in a block as in the whole (tests and ``benchmarks.memory``
check the parameters bit for bit).

Used while the executor runs a step (:func:`streaming`), and by extraction,
which measures the layer's workspace this way.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from engine.optim.chunks import Chunking

STREAM_MIN_BYTES = 8 << 20
"""Weights at least this large have their gradient streamed (smaller ones cost little whole)."""


class BlockSink(Protocol):
    """Where a streamed weight's gradient goes (the fused optimizer; extraction's probe): as its two factors,
    ``grad_out.t() @ inputs``, to be made a column block at a time (``chunking_of(weight)``'s blocks)."""

    def chunking_of(self, weight: torch.Tensor) -> Chunking: ...

    def weight_gradient(self, weight: torch.Tensor, grad_out: torch.Tensor, inputs: torch.Tensor) -> None: ...


def streamable(module: nn.Module) -> bool:
    """Whether ``module``'s weight gradient may be streamed: a trained ``nn.Linear`` weight that is large."""
    return (type(module) is nn.Linear and module.weight.requires_grad and module.weight.dim() == 2
            and module.weight.nbytes >= STREAM_MIN_BYTES)


class _StreamedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, sink: BlockSink) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.sink = sink
        ctx.has_bias = bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        x, weight = ctx.saved_tensors
        grad_x = grad_out.mm(weight) if ctx.needs_input_grad[0] else None  # addmm's input gradient
        grad_bias = grad_out.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        ctx.sink.weight_gradient(weight, grad_out, x)
        return grad_x, None, grad_bias, None


def streamed_names(model: nn.Module, weights: set[int]) -> list[str]:
    """Names of the modules whose weight (by ``id``) is in ``weights`` and can be streamed."""
    return [name for name, m in model.named_modules() if streamable(m) and id(m.weight) in weights]


@contextmanager
def streaming(model: nn.Module, names: list[str], sink: BlockSink) -> Iterator[None]:
    """While inside, the named ``nn.Linear`` modules stream their weight gradient into ``sink`` (a call with
    an input that is not 2-D computes as usual)."""
    modules = [model.get_submodule(name) for name in names]
    for module in modules:
        module.forward = _forward_for(module, sink)  # an instance attribute: the class's forward is untouched
    try:
        yield
    finally:
        for module in modules:
            del module.forward


def _forward_for(module: nn.Linear, sink: BlockSink):
    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or not torch.is_grad_enabled():
            return F.linear(x, module.weight, module.bias)
        return _StreamedLinear.apply(x, module.weight, module.bias, sink)

    return forward
