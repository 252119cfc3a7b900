"""What happens to a parameter's gradient once it is final this step: one small class per mode.

:class:`~engine.optim.fused.FusedOptimizer` counts each parameter's gradient contributions; on the last
micro-batch, once the last contribution has arrived, the parameter's gradient is final and its mode
decides what follows:

- :class:`ApplyNow`: updated at once, in the backward pass, and the gradient freed (the plain fused
  update, torchtune's optimizer in the backward pass);
- :class:`HoldForClipping`: its norm taken and the gradient held; when the step ends, the total norm
  scales every held gradient and they are applied (``clip_grad_norm_``);
- :class:`InBackground`: its optimizer state is on flash, so the update runs on the update thread beside
  the next backward node (due when that node is computed);
- :class:`ByRows`: an embedding table with its state on flash, whose rows the step did not look up
  were updated in the background from the lookup on; the looked-up rows follow on the update thread.

Accumulation over micro-batches is not a mode: until the last micro-batch no gradient is final, whatever
its mode.  :func:`mode_for` picks each parameter's mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from engine.optim.background import END

if TYPE_CHECKING:
    from engine.optim.fused import Clip, FusedOptimizer, _Slot


class UpdateMode(Protocol):
    """What a parameter's final gradient triggers, and what the step's end does with those still pending."""

    def final(self, fused: FusedOptimizer, slot: _Slot) -> None:
        """``slot``'s gradient is final for this step."""

    def finish(self, fused: FusedOptimizer, pending: list[_Slot]) -> None:
        """The step ends: apply ``pending`` (holding gradients, not yet updated)."""


class ApplyNow:
    """Updated as soon as its gradient is final; a parameter a skipped branch never reached, at the end."""

    def final(self, fused: FusedOptimizer, slot: _Slot) -> None:
        fused._apply(slot)

    def finish(self, fused: FusedOptimizer, pending: list[_Slot]) -> None:
        for slot in pending:
            fused._apply(slot)


class HoldForClipping:
    """Held until the step ends, then scaled by ``clip_grad_norm_``'s coefficient and applied."""

    def __init__(self, clip: Clip) -> None:
        self.clip = clip

    def final(self, fused: FusedOptimizer, slot: _Slot) -> None:
        slot.norm = torch.linalg.vector_norm(slot.param.grad, self.clip.norm_type)

    def finish(self, fused: FusedOptimizer, pending: list[_Slot]) -> None:
        coefficient = self._coefficient(fused, pending)
        for slot in pending:
            fused._apply(slot, coefficient)

    def _coefficient(self, fused: FusedOptimizer, pending: list[_Slot]) -> torch.Tensor:
        """``clip_grad_norm_``'s clamped coefficient from the norms taken as gradients became final."""
        for slot in pending:
            if slot.norm is None:
                slot.norm = torch.linalg.vector_norm(slot.param.grad, self.clip.norm_type)
        held = [s for s in fused.slots if s.param.grad is not None]  # parameter order, as clip_grad_norm_ lists
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for s in held:
            groups.setdefault((s.param.grad.device, s.param.grad.dtype), []).append(s.norm)
        norms = [n for group in groups.values() for n in group]
        first = held[0].param.grad.device
        total = torch.linalg.vector_norm(torch.stack([n.to(first) for n in norms]), self.clip.norm_type)
        return torch.clamp(self.clip.max_norm / (total + 1e-6), max=1.0)


class InBackground(ApplyNow):
    """Its state is on flash: updated on the update thread, due by the end of the next backward node."""

    def final(self, fused: FusedOptimizer, slot: _Slot) -> None:
        fused._submitted += 1
        fused._worker.submit(END if fused._node is None else fused._node + 1, fused._apply, slot)


class ByRows(InBackground):
    """An embedding table updated by rows (:mod:`engine.optim.rows`): the looked-up rows last."""

    def final(self, fused: FusedOptimizer, slot: _Slot) -> None:
        if slot.table.looked_up is None:  # not looked up this step: a whole update, as its state is on flash
            super().final(fused, slot)
            return
        fused._worker.submit(END, fused._apply_rows, slot)


APPLY_NOW, IN_BACKGROUND, BY_ROWS = ApplyNow(), InBackground(), ByRows()  # they hold nothing: shared


def mode_for(slot: _Slot, clipping: HoldForClipping | None, background: bool) -> UpdateMode:
    """``slot``'s mode: with ``clipping`` (one for the whole step) every gradient is held; else state on flash
    updates in the ``background`` (by rows for a table), and the rest at once."""
    if clipping is not None:
        return clipping
    if slot.table is not None:
        return BY_ROWS
    if slot.paged and background:
        return IN_BACKGROUND
    return APPLY_NOW
