"""POET Edge engine: everything that runs one training step under a schedule, and needs torch.

It extracts the training graph from a real model and measures the device, runs steps that follow a
schedule (recomputing, paging to files on flash), keeps the step's whole memory inside its budget, and
measures what it did.  It imports nothing above it (no :mod:`agent`, :mod:`server`, Flower or the demo):
the device application (:mod:`agent`) and the benchmarks build on it.  Importing ``engine`` imports no
torch; the names below are loaded on first use.

Modules:

- :mod:`~engine.workload`: ``Workload`` (a model, one batch, its loss) and the losses the zoo's models use
- :mod:`~engine.extract`: ``extract()``: segments, recording, units, measurement -> graph + segments
- :mod:`~engine.segments`: ``Segments``, ``Unit``, ``Port``, ``Boundary``; node-id layout; input checks
- :mod:`~engine.composites`: composite operations opened up under the recorder (attention by its math backend)
- :mod:`~engine.lean_backward`: a recorded power replayed with PyTorch's backward formula in one buffer
- :mod:`~engine.operator_bound`: the activation floor of a model cut at every operation
- :mod:`~engine.chunked_loss`: the opt-in chunked next-token loss (a large vocabulary's logits never all live)
- :mod:`~engine.runtime`: ``Runtime`` (compute/free/install one node in torch), ``ModelState`` (rollback)
- :mod:`~engine.store`: the value store: which node owns which storage; saved-tensor handles
- :mod:`~engine.replay`: RNG replay and buffer restore for exact recomputation
- :mod:`~engine.executor`: ``Executor``: runs training steps as a schedule says
- :mod:`~engine.pager`: ``Pager``: page files, the I/O thread, reservation, file lifetime
- :mod:`~engine.pagefile`: page files: ``reserve``, ``write``, ``read`` and the public names of its modules
- :mod:`~engine.ledger`: ``Ledger`` (resident bytes per instruction, budget check), ``StepStats``
- :mod:`~engine.rss`: peak-RSS measurement, returning freed memory, heap trimming
- :mod:`~engine.allocator`: the caching CPU allocator bounded by the step's plan (C++, built at install), freed
  tensors reused rather than faulted back in
- :mod:`~engine.optim`: optimizer updates inside the backward pass, optimizer state on flash
- :mod:`~engine.training`: ``Training``: the one training path, a daemon's window and a Flower round alike:
  model, data, schedule, optimizer, the memory check
- :mod:`~engine.parity`: ``check_parity``: one step against plain autograd, bit for bit
- :mod:`~engine.profile`: ``profile_workload``: graph, swap path, overlap, power -> priced graph + device profile
- :mod:`~engine.validate`: ``validate``, ``Validator``, ``predict``: predictions against measured steps; memory plot
- :mod:`~engine.energy`: energy meters (RAPL, INA3221, serial USB meters) and a step's energy account
- :mod:`~engine.errors`: the engine's branch of the exception tree
"""

from __future__ import annotations

import importlib
from typing import Any

from engine.errors import (
    EngineError,
    ExecutorError,
    InputMismatchError,
    LedgerError,
    PageCorruptError,
    PageError,
    ScheduleRefusedError,
    SwapSpaceError,
)

# Public name -> module that defines it; imported lazily because they need torch.
_LAZY = {"Executor": "engine.executor", "StepStats": "engine.ledger", "Segments": "engine.segments",
         "Workload": "engine.workload"}

__all__ = [
    "EngineError", "Executor", "ExecutorError", "InputMismatchError", "LedgerError", "PageCorruptError",
    "PageError", "ScheduleRefusedError", "Segments", "StepStats", "SwapSpaceError", "Workload",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
