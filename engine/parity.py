"""Parity with plain autograd: one executor step against ``loss.backward()`` on a copy of the model, bit for bit.

::

    report = check_parity(executor, workload)
    report.exact, report.mismatched

The copy starts from the model's state (gradients cleared on both) and the
same RNG state; each runs one training step on the workload's batch.  The
loss, every parameter's gradient, every buffer (BatchNorm's running
statistics and step counts) and the RNG state after the step must then be
identical bit for bit: floating-point tensors are compared as integers of
their width, so a NaN equals only the same NaN and -0.0 differs from 0.0.
Nothing is updated: the gradients of the executor's step are left on the
model, as :meth:`engine.executor.Executor.step` leaves them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from engine.replay import OutsideRng

__all__ = ["ParityReport", "bits_equal", "check_parity"]

_INTS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class ParityReport:
    """What :func:`check_parity` compared: how many tensors, the names of those that differ, and what the
    comparison is of where the loss itself is not plain (``loss_note``: the chunked loss's label)."""

    compared: int
    mismatched: tuple[str, ...]
    loss_note: str = ""

    @property
    def exact(self) -> bool:
        """True when every compared tensor is identical bit for bit."""
        return not self.mismatched

    def summary(self) -> str:
        """One line for a report."""
        if self.exact:
            return (f"bit-identical to plain autograd ({self.compared} tensors: loss, gradients, buffers, RNG "
                    f"state){self.loss_note}")
        shown = ", ".join(self.mismatched[:5]) + (" ..." if len(self.mismatched) > 5 else "")
        return f"DIFFERENT from plain autograd in {len(self.mismatched)} of {self.compared} tensors: {shown}"


def bits_equal(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Bit-for-bit equality of two tensors (``torch.equal`` calls two identical NaNs different); two ``None``
    are equal."""
    if a is None or b is None:
        return a is None and b is None
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(_as_bits(a), _as_bits(b))


def _as_bits(t: torch.Tensor) -> torch.Tensor:
    """Floating-point (and complex) tensors as integers of the same width; others as they are."""
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.contiguous().view(_INTS[t.element_size()]) if t.is_floating_point() else t


def check_parity(executor: Any, workload: Any) -> ParityReport:
    """Run one step of ``workload`` (an :class:`engine.workload.Workload`) through ``executor`` and one plain
    ``loss.backward()`` on a copy of its model, from the same state and RNG state; compare everything.

    ``executor`` must have been built for ``workload.model``.  Both gradients are cleared first
    (``set_to_none``); the model keeps the executor step's gradients and buffer updates afterwards.
    """
    model = workload.model
    model.zero_grad(set_to_none=True)
    reference = copy.deepcopy(model)
    rng, outside = torch.get_rng_state(), OutsideRng.capture()  # NumPy's and Python's: model code draws too
    args = workload.inputs if isinstance(workload.inputs, tuple) else (workload.inputs,)
    loss_fn = workload.loss_fn
    if hasattr(loss_fn, "for_model"):  # a loss bound to the model's parameters (engine.chunked_loss)
        loss_fn = loss_fn.for_model(reference)
    reference_loss = loss_fn(reference(*args), workload.targets)
    reference_loss.backward()
    reference_rng = torch.get_rng_state()
    torch.set_rng_state(rng)
    outside.restore()
    loss = executor.step(workload.inputs, workload.targets)
    pairs: list[tuple[str, torch.Tensor | None, torch.Tensor | None]] = [
        ("loss", loss.detach(), reference_loss.detach()), ("RNG state", torch.get_rng_state(), reference_rng)]
    pairs += [(f"{name}.grad", p.grad, q.grad) for (name, p), q in zip(model.named_parameters(), reference.parameters())]
    pairs += [(name, b, c) for (name, b), c in zip(model.named_buffers(), reference.buffers())]
    return ParityReport(len(pairs), tuple(name for name, a, b in pairs if not bits_equal(a, b)),
                        getattr(loss_fn, "parity_note", ""))
