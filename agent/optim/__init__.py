"""Optimizer updates inside the backward pass: gradients applied and freed as they become final.

* :mod:`agent.optim.fused` the :class:`FusedOptimizer`: hooks, accumulation, clipping, state homes.
* :mod:`agent.optim.rules` one chunk's update by PyTorch's own per-tensor code.
* :mod:`agent.optim.chunks` how a parameter is cut into chunks.
* :mod:`agent.optim.state_pages` optimizer state in page files on flash.
* :mod:`agent.optim.streamed` a large linear weight's gradient made and applied a column block at a time.
"""

from agent.optim.chunks import Chunking
from agent.optim.fused import Clip, FusedOptimizer, PagedTensor
from agent.optim.rules import UpdateRule, optimizer_name, rule_for
from agent.optim.state_pages import StatePages

__all__ = ["Chunking", "Clip", "FusedOptimizer", "PagedTensor", "StatePages", "UpdateRule", "optimizer_name",
           "rule_for"]
