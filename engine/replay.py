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

Model code may also draw from generators outside torch: NumPy's global one (Wav2Vec2's SpecAugment masks) or
Python's ``random``.  Capturing those for every unit would cost tens of microseconds a unit, so the first step
learns which units draw from them (their state before and after each first computation); from then on those
units, and only those, have NumPy's and Python's states recorded before their first computation and replayed
on a recomputation, the streams put back afterwards, as torch's are.
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
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


@dataclass(frozen=True)
class OutsideRng:
    """The generators outside torch that model code draws from: NumPy's global one and Python's ``random``."""

    numpy: tuple[Any, ...]
    python: tuple[Any, ...]

    @classmethod
    def capture(cls) -> "OutsideRng":
        return cls(np.random.get_state(), random.getstate())

    def restore(self) -> None:
        np.random.set_state(self.numpy)
        random.setstate(self.python)

    def same_as(self, other: "OutsideRng") -> bool:
        """Whether no number was drawn between the two captures."""
        mine, theirs = self.numpy, other.numpy
        return (self.python == other.python and mine[0] == theirs[0] and mine[2:] == theirs[2:]
                and np.array_equal(mine[1], theirs[1]))


class Replay:
    """Per-step record of each forward node's starting RNG state (see the module docstring)."""

    LEARNING_STEPS = 1  # steps that watch every unit for draws outside torch

    def __init__(self) -> None:
        self._rng: dict[int, RngState] = {}
        self._outside: dict[int, OutsideRng] = {}
        self.drawing_outside: set[int] = set()  # units whose computation draws from NumPy or Python's random
        self._steps = 0

    def reset(self) -> None:
        """Forget the previous step's states (a new step begins)."""
        self._rng.clear()
        self._outside.clear()
        self._steps += 1

    @property
    def learning(self) -> bool:
        return self._steps <= self.LEARNING_STEPS

    @property
    def watches_outside(self) -> bool:
        """Whether the next step may draw from NumPy or Python's random: still learning, or a unit does."""
        return self.learning or bool(self.drawing_outside)

    @contextmanager
    def computing(self, node: int, buffers: Sequence[torch.Tensor]) -> Iterator[None]:
        """Run a forward node's computation: first time as is, later as an exact replay."""
        first = self._rng.get(node)
        if first is None:
            self._rng[node] = RngState.capture()
            learning = self.learning
            if learning or node in self.drawing_outside:
                self._outside[node] = OutsideRng.capture()
            yield
            if learning and not self._outside[node].same_as(OutsideRng.capture()):
                self.drawing_outside.add(node)
            return
        outside = self._outside.get(node) if node in self.drawing_outside else None
        stream = RngState.capture()
        outside_stream = OutsideRng.capture() if outside is not None else None
        with torch.no_grad():
            snapshot = [b.clone() for b in buffers]
        first.restore()
        if outside is not None:
            outside.restore()
        try:
            yield
        finally:
            with torch.no_grad():
                for buffer, saved in zip(buffers, snapshot):
                    buffer.copy_(saved)
            stream.restore()
            if outside_stream is not None:
                outside_stream.restore()
