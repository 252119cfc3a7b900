"""Lean backward passes: PyTorch's gradient bit for bit, with less scratch memory."""

from __future__ import annotations

import pytest
import torch

from engine.lean_backward import lean_pow, lean_version
from engine.parity import bits_equal


@pytest.mark.parametrize("exponent", [3.0, 2, 0.5, -1.5])
def test_lean_pow_gives_pytorchs_values_and_gradients_bit_for_bit(exponent):
    torch.manual_seed(0)
    x = torch.rand(64, 33) + 0.1  # positive: fractional powers defined
    grad = torch.randn(64, 33)
    results = []
    for pow_ in (torch.pow, lean_pow):
        leaf = x.clone().requires_grad_()
        out = pow_(leaf, exponent)
        out.backward(grad)
        results.append((out.detach(), leaf.grad))
    (a, ga), (b, gb) = results
    assert bits_equal(a, b) and bits_equal(ga, gb)


def _backward_allocations(pow_) -> int:
    """Bytes the operators of ``pow_``'s backward pass allocate, by the profiler (each temporary of
    PyTorch's formula lives until the formula's end, so these are all live at once)."""
    torch.manual_seed(0)
    x = torch.randn(256, 1024, requires_grad=True)
    out = pow_(x, 3.0)
    grad = torch.randn_like(out)
    with torch.profiler.profile(profile_memory=True) as prof:
        out.backward(grad)
    return sum(max(0, e.self_cpu_memory_usage) for e in prof.events())


def test_lean_pow_backward_allocates_one_buffer_where_pytorchs_allocates_three():
    size = 256 * 1024 * 4
    assert _backward_allocations(torch.pow) >= 2.99 * size  # x.pow(2), 3 * that, grad * that
    assert _backward_allocations(lean_pow) <= 1.01 * size  # one buffer, written over


def test_only_a_real_power_of_a_tensor_that_needs_a_gradient_is_replaced():
    x = torch.randn(4, requires_grad=True)
    assert lean_version(torch.pow, (x, 3.0), {}) is lean_pow
    assert lean_version(torch.Tensor.__pow__, (x, 2), {}) is lean_pow
    assert lean_version(torch.pow, (x.detach(), 3.0), {}) is None  # no gradient to make
    assert lean_version(torch.pow, (x, 0), {}) is None  # PyTorch's backward is zeros there
    assert lean_version(torch.pow, (x, torch.tensor(3.0)), {}) is None  # a tensor exponent has a gradient too
    assert lean_version(torch.pow, (2.0, x), {}) is None
    assert lean_version(torch.mul, (x, 3.0), {}) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert lean_version(torch.pow, (x, 3.0), {}) is None  # autocast computes the backward in float32
