"""Torch functions that are many operations behind one call, run as those operations.

Extraction records a module's own code (a ``name:ops`` region) one torch
function at a time, through a ``TorchFunctionMode``, and each recorded call
becomes a unit a schedule can free, page and recompute.  Some functions are
whole layers behind one call: ``F.multi_head_attention_forward`` (all of
``nn.MultiheadAttention``) and ``F.scaled_dot_product_attention``, whose math
backend autograd sees as a matrix product, a softmax, a dropout and another
product.  Inside a region :func:`composite_body` runs them as their operations
instead, so that each is recorded, and the replay computes exactly what the
one call computes (the tests hold the two bit for bit against each other).
"""

from __future__ import annotations

import math
import types
from typing import Any, Callable

import torch
import torch.nn.functional as F

_MATH = int(torch.nn.attention.SDPBackend.MATH)


def composite_body(func: Callable, args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    """A call that computes ``func(*args, **kwargs)`` as its own torch operations (to be run under the recording
    mode), or ``None`` where ``func`` is one operation or its operations are not known exactly."""
    if func is F.multi_head_attention_forward:
        return lambda: _own_body(func, args, kwargs)
    if func is F.scaled_dot_product_attention:
        return _attention_math(*args, **kwargs)
    return None


def _own_body(func: Callable, args: tuple, kwargs: dict) -> Any:
    """Run a ``torch.nn.functional`` function written in Python past its first check (``has_torch_function``),
    which under an active mode would hand the whole call back to the mode: a copy of the function whose
    globals answer that check with False (the module itself is left alone, for other threads)."""
    body = types.FunctionType(func.__code__, {**func.__globals__, "has_torch_function": lambda *args: False},
                              func.__name__, func.__defaults__, func.__closure__)
    body.__kwdefaults__ = func.__kwdefaults__
    return body(*args, **kwargs)


def _mask_fits(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether ``mask`` adds onto the scores as ATen's in-place add does: boolean or the query's dtype, and
    broadcasting to the scores' shape without growing it."""
    scores = torch.Size((*query.shape[:-1], key.shape[-2]))
    try:
        return mask.dtype in (torch.bool, query.dtype) and torch.broadcast_shapes(mask.shape, scores) == scores
    except RuntimeError:
        return False


def _attention_math(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                    scale: float | None = None, enable_gqa: bool = False) -> Callable[[], torch.Tensor] | None:
    """``scaled_dot_product_attention`` as the operations of ATen's math backend
    (``_scaled_dot_product_attention_math``), where PyTorch picks that backend for these arguments (on CPU: with
    dropout); ``None`` where it picks a fused kernel, and for the calls whose math this does not repeat bit
    for bit: grouped-query, negative scale, half precision (upcast inside), under autocast, a causal call
    with a mask (an error there), a mask that broadcasts beyond the scores."""
    if (enable_gqa or (scale is not None and scale < 0) or query.dim() < 2
            or query.dtype not in (torch.float32, torch.float64)
            or torch.is_autocast_enabled(query.device.type) or (is_causal and attn_mask is not None)):
        return None
    if attn_mask is not None and not _mask_fits(attn_mask, query, key):
        return None
    if torch._fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale=scale) != _MATH:
        return None

    def body() -> torch.Tensor:
        factor = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(query.shape[-1]))
        mask = attn_mask
        if is_causal:
            mask = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device).tril()
        if mask is not None and mask.dtype == torch.bool:  # as ATen turns a boolean mask into an additive one
            mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
                mask.logical_not(), -math.inf)
        scores = torch.matmul(query * factor, key.transpose(-2, -1) * factor)
        if mask is not None:
            scores = scores + mask
        weights = torch._safe_softmax(scores, -1)
        if dropout_p > 0.0:
            weights = torch.dropout(weights, dropout_p, True)
        return torch.matmul(weights, value)

    return body
