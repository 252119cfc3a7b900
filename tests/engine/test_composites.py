"""Composite torch functions run as their own operations compute what the one call computes, bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from engine.composites import composite_body
from engine.parity import bits_equal


def _same_values_and_gradients(call, body, inputs):
    """``call()`` and ``body()`` from the same RNG state: outputs, input gradients and the RNG after, equal."""
    results = []
    for run in (call, body):
        torch.manual_seed(7)
        out = run()
        grads = torch.autograd.grad(out.square().sum(), inputs)
        results.append((out, grads, torch.get_rng_state()))
    (a, ga, ra), (b, gb, rb) = results
    assert bits_equal(a, b) and torch.equal(ra, rb)
    assert all(bits_equal(x, y) for x, y in zip(ga, gb))


def _qkv(length: int = 12, source: int | None = None):
    torch.manual_seed(0)
    source = source or length
    return (torch.randn(2, 3, length, 8, requires_grad=True), torch.randn(2, 3, source, 8, requires_grad=True),
            torch.randn(2, 3, source, 8, requires_grad=True))


@pytest.mark.parametrize("case", ["plain", "float mask", "bool mask", "causal", "scale"])
def test_attention_with_dropout_runs_as_the_math_backends_operations(case):
    q, k, v = _qkv(12, 10 if case != "causal" else 12)
    kwargs = {"dropout_p": 0.2}
    if case == "float mask":
        kwargs["attn_mask"] = torch.randn(12, 10)
    elif case == "bool mask":
        kwargs["attn_mask"] = torch.rand(2, 1, 12, 10) > 0.3
    elif case == "causal":
        kwargs["is_causal"] = True
    elif case == "scale":
        kwargs["scale"] = 0.3
    body = composite_body(F.scaled_dot_product_attention, (q, k, v), kwargs)
    assert body is not None
    _same_values_and_gradients(lambda: F.scaled_dot_product_attention(q, k, v, **kwargs), body, (q, k, v))


def test_attention_on_a_fused_kernel_or_with_math_it_does_not_repeat_stays_one_call():
    q, k, v = _qkv()
    sdpa = F.scaled_dot_product_attention
    assert composite_body(sdpa, (q, k, v), {}) is None  # no dropout: a fused kernel
    assert composite_body(sdpa, (q, k, v), {"dropout_p": 0.1, "enable_gqa": True}) is None
    half = tuple(t.detach().bfloat16() for t in (q, k, v))
    assert composite_body(sdpa, half, {"dropout_p": 0.1}) is None  # the math backend upcasts half precision
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert composite_body(sdpa, (q, k, v), {"dropout_p": 0.1}) is None
    causal_with_mask = {"dropout_p": 0.1, "is_causal": True, "attn_mask": torch.zeros(12, 12)}
    assert composite_body(sdpa, (q, k, v), causal_with_mask) is None  # the one call raises, as it should
    assert composite_body(sdpa, (q[0], k[0], v[0]), {"dropout_p": 0.1, "attn_mask": torch.zeros(5, 12, 12)}) is None
    assert composite_body(torch.matmul, (q, k), {}) is None


def test_multi_head_attention_runs_as_its_own_operations():
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(16, 4, dropout=0.2, batch_first=True).train()
    x = torch.randn(2, 9, 16, requires_grad=True)
    seen = []
    call = lambda: attention(x, x, x, need_weights=False)[0]

    class Expand(torch.overrides.TorchFunctionMode):
        """Opens composites up as extraction's recorder does, noting every function called."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            seen.append(func)
            inner = composite_body(func, args, kwargs)
            if inner is None:
                return func(*args, **kwargs)
            with self:
                return inner()

    def body():
        with Expand():
            return call()

    _same_values_and_gradients(call, body, (x, *attention.parameters()))
    assert F.linear in seen and F.scaled_dot_product_attention in seen  # the call was opened up
