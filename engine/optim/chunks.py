"""How a parameter's update is cut into chunks: ranges of the flat tensor, or column blocks of a streamed weight.

An update is elementwise, so any cut gives the bits of the whole-tensor update;
the cut only bounds the memory the update holds at once (its temporaries, and
the state chunks read from flash).  A contiguous parameter is cut into ranges
of its flat view.  A streamed weight (:mod:`engine.optim.streamed`), whose
gradient is computed a block of columns at a time, is cut into the same column
blocks, so each block's gradient is applied as soon as it exists.

A block of a matrix product is bit-identical to the same columns of the whole
product only where the BLAS computes both with the same kernel: a narrow block
(a few columns) or one that starts off a vector boundary takes another path
and sums in another order.  Column blocks are therefore whole multiples of
:data:`EXACT_COLUMNS` wide, start on such a multiple, and a last block
narrower than that is merged into the one before (the whole product's own
last columns then fall in the same place).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

EXACT_COLUMNS = 64  # a streamed gradient's column blocks: multiples of this wide, starting on one


def column_unit_bytes(weight: torch.Tensor) -> int:
    """The bytes of :data:`EXACT_COLUMNS` columns of a 2-D ``weight``: its column blocks are multiples of this
    (a last one may be up to one more unit), what the planner needs to budget them."""
    return weight.shape[0] * weight.element_size() * min(EXACT_COLUMNS, weight.shape[1])


@dataclass(frozen=True)
class Chunking:
    """The chunks of one parameter: ``bounds[k]`` is chunk ``k``'s ``(start, end)`` -- flat element indices,
    or, for ``columns``, column indices of the 2-D weight."""

    shape: tuple[int, ...]
    bounds: tuple[tuple[int, int], ...]
    columns: bool = False
    whole: bool = False  # one chunk, the tensor as it is (a strided tensor has no flat view)

    @classmethod
    def of(cls, param: torch.Tensor, chunk_bytes: int, *, columns: bool = False) -> "Chunking":
        """Chunks of at most ``chunk_bytes`` (at least one element each); column blocks as the module docstring
        says (at most ``max(chunk_bytes, unit) + unit`` bytes, ``unit`` :func:`column_unit_bytes`)."""
        if columns:
            rows, cols = param.shape
            fitting = chunk_bytes // max(1, rows * param.element_size())
            width = max(EXACT_COLUMNS, fitting - fitting % EXACT_COLUMNS)
            bounds = list(_ranges(cols, width))
            if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < EXACT_COLUMNS:
                bounds[-2:] = [(bounds[-2][0], cols)]
            return cls(tuple(param.shape), tuple(bounds), True)
        if not param.is_contiguous():
            return cls(tuple(param.shape), ((0, param.numel()),), whole=True)
        return cls(tuple(param.shape), _ranges(param.numel(), max(1, chunk_bytes // param.element_size())))

    def __len__(self) -> int:
        return len(self.bounds)

    def view(self, tensor: torch.Tensor, k: int) -> torch.Tensor:
        """Chunk ``k`` of ``tensor`` (the parameter, its gradient or a state tensor of its shape), as a view."""
        start, end = self.bounds[k]
        if self.columns:
            return tensor[:, start:end]
        if self.whole:
            return tensor
        return tensor.view(-1)[start:end]

    def chunk_shape(self, k: int) -> tuple[int, ...]:
        """The shape of chunk ``k`` as a tensor of its own (what a page of it holds)."""
        start, end = self.bounds[k]
        if self.columns:
            return (self.shape[0], end - start)
        if self.whole:
            return self.shape
        return (end - start,)

    def chunk_numel(self, k: int) -> int:
        start, end = self.bounds[k]
        return (end - start) * (self.shape[0] if self.columns else 1)


def _ranges(total: int, width: int) -> tuple[tuple[int, int], ...]:
    return tuple((start, min(start + width, total)) for start in range(0, max(total, 1), width)) if total else ((0, 0),)
