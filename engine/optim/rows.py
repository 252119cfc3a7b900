"""An embedding table's update by rows: the rows a step does not look up are updated from its lookup on.

An embedding table's gradient is zero in every row the step's batch does not
look up (extraction checks it of every table it marks: ``Parameter.rows``),
so those rows' update needs no gradient: it is SGD's or Adam's elementwise
math with a zero gradient, and can run as soon as the lookup names the rows.
With the table's optimizer state on flash, :class:`RowTable` makes that a
pass over the table, chunk by chunk of whole rows, that the fused optimizer
runs in the background from the lookup on (:mod:`engine.optim.fused`): its
I/O hides behind the forward and backward pass instead of following the
last backward node.  The looked-up rows -- at most a batch's tokens -- are
updated last, when their gradient is final.

Their state is taken out of each chunk as the pass goes by and kept in RAM;
their update leaves it there (the *overlay*), and the next step's pass puts
it back into each chunk before taking that step's rows out.  Between two
steps the state is therefore the pages with the overlay over them, which is
how checkpoints read it (:meth:`RowTable.overlay_chunk`).

Bits: every row goes through the same elementwise code with the same values
as in the whole-tensor update, on copies of whole rows gathered together.
Rows are :data:`ROW_ALIGN` elements or a multiple of it, so each row falls
in the vectorised part of the kernels, as it does in the whole tensor.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.optim.chunks import Chunking
from engine.optim.rules import UpdateRule

ROW_ALIGN = 64
"""A table updated by rows has rows of a multiple of this many elements (see the module docstring)."""


def row_updatable(module: nn.Module) -> bool:
    """Whether ``module`` is an embedding table whose update may run by rows: a plain ``nn.Embedding`` lookup
    (no ``max_norm``, which rewrites rows in the forward pass; dense gradient) with aligned rows.

    A subclass with a forward of its own is no plain lookup: the learned positional embeddings of BART and
    Whisper take the token ids and look up positions they compute, so the ids they are called with name no
    rows of the table."""
    if not isinstance(module, nn.Embedding) or module.max_norm is not None or module.sparse:
        return False
    if type(module).forward is not nn.Embedding.forward:
        return False
    weight = module.weight
    return weight.dim() == 2 and weight.is_contiguous() and weight.shape[1] % ROW_ALIGN == 0


def row_chunking(param: torch.Tensor, chunk_bytes: int) -> Chunking:
    """Chunks of whole rows of the table ``param``, as many as fit ``chunk_bytes`` (at least one)."""
    rows, width = param.shape
    per_chunk = max(1, chunk_bytes // (width * param.element_size()))
    bounds = tuple((start * width, min(start + per_chunk, rows) * width) for start in range(0, rows, per_chunk))
    return Chunking(tuple(param.shape), bounds)


class RowTable:
    """One table's update by rows; see the module docstring.  The fused optimizer calls :meth:`look_up` at
    the step's lookup, :meth:`pass_chunk` for every chunk in the background, then :meth:`update_looked_up`
    with the final gradient."""

    def __init__(self, param: torch.Tensor, chunking: Chunking) -> None:
        self.param = param
        self.chunking = chunking
        self.width = param.shape[1]
        self.looked_up: torch.Tensor | None = None  # this step's rows, sorted, unique
        self.taken: list[torch.Tensor] | None = None  # their state before this step (None: not made yet)
        self.overlay: tuple[torch.Tensor, list[torch.Tensor]] | None = None  # rows, state newer than the pages

    # -- a step --------------------------------------------------------------------------------------
    def look_up(self, ids: torch.Tensor) -> bool:
        """The step's lookup: note the rows it reads.  False (nothing noted) when ids are not valid rows: the
        lookup itself then fails with PyTorch's error."""
        rows = torch.unique(ids.detach().reshape(-1).to(torch.int64))
        if rows.numel() and (int(rows[0]) < 0 or int(rows[-1]) >= self.param.shape[0]):
            return False
        self.looked_up, self.taken = rows, None
        return True

    def pass_chunk(self, k: int, rule: UpdateRule, state: dict[str, Any],
                   tensors: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """Update chunk ``k``'s rows not looked up, its state ``tensors`` read from flash (``None``: not made
        yet); returns the chunk's state to write back, the overlay put back in and this step's rows taken out."""
        first, last = self._rows(k)
        fresh = tensors[0] is None
        views = None if fresh else [t.view(last - first, self.width) for t in tensors]
        if views is not None and self.overlay is not None:
            rows, values = self.overlay
            at = self._within(rows, first, last)
            for view, value in zip(views, values):
                view.index_copy_(0, rows[at] - first, value[at])
        at = self._within(self.looked_up, first, last)
        mine = self.looked_up[at] - first
        if views is not None:
            if self.taken is None:
                self.taken = [torch.empty(self.looked_up.numel(), self.width, dtype=v.dtype) for v in views]
            for taken, view in zip(self.taken, views):
                taken[at] = view.index_select(0, mine)
        others = _complement(mine, last - first)
        table = self.param.detach()[first:last]
        with torch.no_grad():
            weights = table.index_select(0, others)
            gathered = list(tensors) if views is None else [v.index_select(0, others) for v in views]
            made = rule.update(state, weights, torch.zeros_like(weights), gathered)
            table.index_copy_(0, others, weights)
        if views is None:  # the table's first update: the looked-up rows' state is made from their gradient
            views = [torch.zeros(last - first, self.width, dtype=self.param.dtype) for _ in made]
        for view, value in zip(views, made):
            view.index_copy_(0, others, value)
        return [v.view(-1) for v in views]

    def update_looked_up(self, rule: UpdateRule, state: dict[str, Any], grad: torch.Tensor) -> None:
        """Update the looked-up rows with their final gradient (after every :meth:`pass_chunk`); their state
        becomes the overlay."""
        rows = self.looked_up
        with torch.no_grad():
            weights = self.param.detach().index_select(0, rows)
            made = rule.update(state, weights, grad.index_select(0, rows),
                               list(self.taken) if self.taken is not None else [None] * len(rule.state_names))
            self.param.detach().index_copy_(0, rows, weights)
        self.overlay, self.looked_up, self.taken = (rows, made), None, None

    def end_step(self) -> None:
        """The step is over (or failed): forget its rows."""
        self.looked_up, self.taken = None, None

    # -- state between steps ---------------------------------------------------------------------------
    def overlay_chunk(self, k: int, position: int, chunk: torch.Tensor) -> torch.Tensor:
        """Chunk ``k`` of state tensor ``position`` as read from flash, with the overlay's rows put in place."""
        if self.overlay is None:
            return chunk
        first, last = self._rows(k)
        rows, values = self.overlay
        at = self._within(rows, first, last)
        chunk.view(last - first, self.width).index_copy_(0, rows[at] - first, values[position][at])
        return chunk

    def forget(self) -> None:
        """The state was replaced (loaded, or reset): the overlay is not newer any more."""
        self.overlay = None

    @property
    def overlay_bytes(self) -> int:
        return sum(v.nbytes for v in self.overlay[1]) if self.overlay is not None else 0

    def _rows(self, k: int) -> tuple[int, int]:
        start, end = self.chunking.bounds[k]
        return start // self.width, end // self.width

    @staticmethod
    def _within(rows: torch.Tensor, first: int, last: int) -> slice:
        """The positions of the sorted ``rows`` that fall in ``[first, last)``."""
        lo, hi = torch.searchsorted(rows, torch.tensor([first, last], dtype=rows.dtype)).tolist()
        return slice(lo, hi)


def _complement(rows: torch.Tensor, count: int) -> torch.Tensor:
    """``0..count-1`` without ``rows``."""
    keep = torch.ones(count, dtype=torch.bool)
    keep[rows] = False
    return keep.nonzero().view(-1)
