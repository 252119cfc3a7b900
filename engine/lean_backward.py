"""Operations whose backward PyTorch computes with more scratch than it needs, done in place: the same
arithmetic in the same order, so the same bits, with less transient memory.

Extraction records each operation of a module's own code; where a recorded
operation is one of these, the executor replays :func:`lean_version`'s function
instead.  Its forward is the operation itself; its backward is PyTorch's
formula with the intermediate results written over one another.

``x.pow(e)`` for a number ``e``: PyTorch computes ``grad * (e * x.pow(e - 1))``,
three tensors of ``x``'s size beside ``x`` and ``grad`` (GPT-2's activation
cubes its input: at 8x128 tokens, 4 MB each); here ``x.pow(e - 1)`` is scaled
and multiplied by ``grad`` in place, one tensor.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable

import torch


class _LeanPow(torch.autograd.Function):
    """``base.pow(exponent)``; backward ``grad * (exponent * base.pow(exponent - 1))`` made in one buffer."""

    @staticmethod
    def forward(ctx: Any, base: torch.Tensor, exponent: float) -> torch.Tensor:
        ctx.save_for_backward(base)
        ctx.exponent = exponent
        return torch.pow(base, exponent)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (base,) = ctx.saved_tensors
        exponent = float(ctx.exponent)  # PyTorch's pow_backward works on the exponent as a double
        scratch = base.pow(exponent - 1)
        scratch.mul_(exponent)
        return scratch.mul_(grad), None  # multiplication commutes exactly: grad * scratch, in place


def lean_pow(base: torch.Tensor, exponent: float) -> torch.Tensor:
    """``torch.pow(base, exponent)`` whose backward holds one scratch tensor (see the module docstring)."""
    return _LeanPow.apply(base, exponent)


_POW = frozenset({torch.pow, torch.Tensor.pow, torch.Tensor.__pow__})


def lean_version(func: Callable, args: tuple, kwargs: dict) -> Callable | None:
    """The lean replacement for the call ``func(*args, **kwargs)``, taking the same arguments, or ``None``
    where there is none (another operation, another form of it, no gradient to make, or autocast, which
    computes PyTorch's backward in another precision)."""
    if func in _POW and not kwargs and len(args) == 2:
        base, exponent = args
        if (isinstance(base, torch.Tensor) and base.requires_grad and base.dtype.is_floating_point
                and not base.is_complex() and isinstance(exponent, numbers.Real) and not isinstance(exponent, bool)
                and exponent != 0 and not torch.is_autocast_enabled(base.device.type)):  # autocast: fp32 inside
            return lean_pow
    return None
