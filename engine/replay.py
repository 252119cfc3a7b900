"""What makes a recomputation exact: the same random numbers, and no second update of buffers.

Plain backpropagation runs each forward unit once, drawing dropout masks from
the global RNG stream in stage order and updating BatchNorm running statistics
once.  A schedule computes each forward node first in stage order too (the
executor checks it), so the first computation of a unit draws exactly what the
plain step would.  A *re*computation must then draw the same numbers again
without disturbing the stream, and must leave the unit's buffers as the first
computation left them:

* :meth:`Replay.computing` records the RNG state before a unit's first
  computation; a recomputation runs from that state and puts the stream back
  afterwards (what ``torch.utils.checkpoint`` calls ``preserve_rng_state``);
* it also snapshots the unit's buffers before a recomputation and copies them
  back after, so running statistics and ``num_batches_tracked`` are updated once.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch


@dataclass(frozen=True)
class RngState:
    """The global RNG streams a forward pass can draw from."""

    cpu: torch.Tensor
    cuda: tuple[torch.Tensor, ...]

    @classmethod
    def capture(cls) -> "RngState":
        cuda = tuple(torch.cuda.get_rng_state_all()) if torch.cuda.is_initialized() else ()
        return cls(torch.get_rng_state(), cuda)

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda:
            torch.cuda.set_rng_state_all(list(self.cuda))


class Replay:
    """Per-step record of each forward node's starting RNG state."""

    def __init__(self) -> None:
        self._rng: dict[int, RngState] = {}

    def reset(self) -> None:
        """Forget the previous step's states."""
        self._rng.clear()

    @contextmanager
    def computing(self, node: int, buffers: Sequence[torch.Tensor]) -> Iterator[None]:
        """Run a forward node's computation: first time as is, later as an exact replay."""
        first = self._rng.get(node)
        if first is None:
            self._rng[node] = RngState.capture()
            yield
            return
        stream = RngState.capture()
        with torch.no_grad():
            snapshot = [b.clone() for b in buffers]
        first.restore()
        try:
            yield
        finally:
            with torch.no_grad():
                for buffer, saved in zip(buffers, snapshot):
                    buffer.copy_(saved)
            stream.restore()
