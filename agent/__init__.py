"""POET Edge agent: everything that runs on the device.

The executor (:class:`agent.executor.Executor`) runs one training step of a
real ``nn.Module`` by following a POET schedule.  Importing ``agent`` imports
neither torch nor flwr; the names below are loaded on first use.

Modules:

- :mod:`~agent.extract`: ``extract()``: segments, recording, units, measurement -> graph + segments
- :mod:`~agent.segments`: ``Segments``, ``Unit``, ``Port``, ``Boundary``; node-id layout; input checks
- :mod:`~agent.runtime`: ``Runtime`` (compute/free/install one node in torch), ``ModelState`` (rollback)
- :mod:`~agent.store`: the value store: which node owns which storage; saved-tensor handles
- :mod:`~agent.replay`: RNG replay and buffer restore for exact recomputation
- :mod:`~agent.executor`: ``Executor``: runs training steps as a schedule says
- :mod:`~agent.pager`: ``Pager``: page files, the I/O thread, reservation, file lifetime
- :mod:`~agent.pagefile`: page files: ``reserve``, ``write``, ``read`` and the public names of its modules below
- :mod:`~agent.ledger`: ``Ledger`` (resident bytes per instruction, budget check), ``StepStats``
- :mod:`~agent.rss`: peak-RSS measurement, returning freed memory, heap trimming
- :mod:`~agent.parity`: ``check_parity``: one step against plain autograd, bit for bit
- :mod:`~agent.profile`: ``profile_workload``: graph, swap path, overlap, power -> priced graph + device profile
- :mod:`~agent.validate`: ``validate``, ``Validator``, ``predict``: predictions against measured steps; memory plot
- :mod:`~agent.zoo`: ``Workload`` and the zoo models; ``--module PKG.MOD:FACTORY``; ``token_vocabulary``
- :mod:`~agent.cli`: ``poet-edge profile`` and ``poet-edge validate`` (entry point ``poet_edge.commands``)
- :mod:`~agent.errors`: the agent's branch of the exception tree
- :mod:`~agent.energy`: the meters' public API
- :mod:`~agent.personal_model`: ``keep``, ``load``, ``read_provenance``, ``export``: the model a device personalized,
  with its provenance, in ``STATE_DIR/personal/``; TorchScript or ONNX for inference
- :mod:`~agent.digits`: a fleet's image data (scikit-learn's digits, or a saved data set): a training pool
  partitioned by Flower Datasets (even, Dirichlet label skew, quantity skew or natural ids), a test pool, each
  device's own angle; ``SmallCNN`` sized to the images
- :mod:`~agent.image_sets`: ``load_image_set``, ``image_set_shape``: a data set saved by Hugging Face ``datasets``
  (FEMNIST, CIFAR-10) read from disk as arrays
- :mod:`~agent.data`: ``open_dataset``, ``LocalDataset``: the device's own data, seeded split and batch order
- :mod:`~agent.monitors`: ``Eligibility`` over ``PowerMonitor``, ``IdleMonitor``, ``ThermalMonitor``, ``QuietHours``;
  each verdict with a reason
- :mod:`~agent.holdout`: ``evaluate``: a model's loss and accuracy on a data set's held-out samples (the agent's
  windows, federated rounds)
- :mod:`~agent.training`: ``Training``: the one training path, a daemon's window and a Flower round alike:
  model, data, schedule, optimizer, the memory check
- :mod:`~agent.optim`: optimizer updates inside the backward pass, optimizer state on flash
- :mod:`~agent.daemon`: the agent daemon: eligibility, the training worker, checkpoints, the fleet server's
  schedules and heartbeats
- :mod:`~agent.federated`: everything of the agent that speaks Flower: the ClientApp, the SuperNode, virtual
  devices
"""

from __future__ import annotations

import importlib
from typing import Any

from agent.errors import (
    AgentError,
    ExecutorError,
    InputMismatchError,
    LedgerError,
    PageCorruptError,
    PageError,
    ScheduleRefusedError,
    SwapSpaceError,
)

# Public name -> module that defines it; imported lazily because they need torch.
_LAZY = {"Executor": "agent.executor", "StepStats": "agent.ledger", "Segments": "agent.segments"}

__all__ = [
    "AgentError", "Executor", "ExecutorError", "InputMismatchError", "LedgerError", "PageCorruptError",
    "PageError", "ScheduleRefusedError", "Segments", "StepStats", "SwapSpaceError",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agent' has no attribute {name!r}")
