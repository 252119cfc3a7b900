"""POET Edge agent: the device application, on top of the engine (:mod:`engine`).

The engine runs one training step under a schedule; the agent decides when and on what: it reads its
config, watches the device's eligibility, trains on local data in a daemon's windows, keeps checkpoints
and the personalized model, talks to the fleet server and takes part in Flower rounds.  Importing
``agent`` imports neither torch nor flwr.

Modules:

- :mod:`~agent.application`: the device side wired together: the daemon with its reporter, metrics and SuperNode
- :mod:`~agent.commands`: ``poet-edge agent`` (run, status, export; entry point ``poet_edge.commands``)
- :mod:`~agent.config`: the agent's TOML config, checked whole at start
- :mod:`~agent.prepare`: a device's training prepared: the workload profiled here once, then its schedule
- :mod:`~agent.schedule_sources`: where schedules come from (a signed file, a local solve), their verified cache,
  and the reporter seam the fleet plugs into
- :mod:`~agent.fleet`: the fleet server's device API: its schedule source and the heartbeat reporter
- :mod:`~agent.zoo`: the zoo models as ``Workload`` s; ``--module PKG.MOD:FACTORY``; ``token_vocabulary``
- :mod:`~agent.zoo_names`: the zoo's model names, without importing torch
- :mod:`~agent.cli`: ``poet-edge profile`` and ``poet-edge validate`` (entry point ``poet_edge.commands``)
- :mod:`~agent.errors`: the agent's branch of the exception tree
- :mod:`~agent.personal_model`: ``keep``, ``load``, ``read_provenance``, ``export``: the model a device personalized,
  with its provenance, in ``STATE_DIR/personal/``; TorchScript or ONNX for inference
- :mod:`~agent.personalization`: the personalization strategies (``finetune``, ``fedper``, ``fedbn``, ``ditto``,
  ``biases-norms``, ``none``), one module each, chosen by name from a registry
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
- :mod:`~agent.daemon`: the agent daemon: eligibility, the training worker, checkpoints, the fleet server's
  schedules and heartbeats
- :mod:`~agent.federated`: everything of the agent that speaks Flower: the ClientApp, the SuperNode, virtual
  devices
"""

from __future__ import annotations

from agent.errors import AgentError

__all__ = ["AgentError"]
