"""Optimizer updates inside the backward pass: gradients applied and freed as they become final.

* :mod:`engine.optim.fused` the :class:`FusedOptimizer`: hooks, gradients counted, accumulation, state homes.
* :mod:`engine.optim.modes` what a final gradient triggers, a class per mode: applied now, held for clipping,
  updated in the background (state on flash), a table updated by rows.
* :mod:`engine.optim.rows` embedding tables updated by rows; :mod:`engine.optim.background` the update thread.
* :mod:`engine.optim.rules` one chunk's update by PyTorch's own per-tensor code.
* :mod:`engine.optim.chunks` how a parameter is cut into chunks.
* :mod:`engine.optim.state_pages` optimizer state in page files on flash.
* :mod:`engine.optim.streamed` a large linear weight's gradient made and applied a column block at a time.
"""

from engine.optim.chunks import Chunking
from engine.optim.fused import Clip, FusedOptimizer, PagedTensor
from engine.optim.rules import UpdateRule, optimizer_name, rule_for
from engine.optim.state_pages import StatePages

__all__ = ["Chunking", "Clip", "FusedOptimizer", "PagedTensor", "StatePages", "UpdateRule", "optimizer_name",
           "rule_for"]
