"""What the fleet's ServerApp and the devices' ClientApp say to each other: message types and record keys.

The ServerApp (:mod:`server.federated.serverapp`) and the ClientApp (:mod:`agent.federated.clientapp`) run in
different processes, often different releases, and meet only in Flower messages.  Every message type and every
key of a record either side reads is spelled here once, so the two cannot drift apart.

A message's content is a Flower ``RecordDict`` of these records:

- :data:`ARRAYS` (``ArrayRecord``): the shared weights, never a device's personal layers;
- :data:`CONFIG` (``ConfigRecord``): what the server asks (:data:`SERVER_ROUND`, :data:`LOCAL_STEPS`, ...);
- :data:`METRICS` (``MetricRecord``): a device's figures for the round;
- :data:`DEVICE` (``ConfigRecord``): who answered (:data:`DEVICE_NAME`, :data:`DEVICE_PROFILE`,
  :data:`SCHEDULE_ID`), and :data:`ABSENT` with the reason when it sends no update this round;
- :data:`MODEL` (``ConfigRecord``): the model's identity (:data:`MODEL_NAME`) and its tied weights
  (:data:`MODEL_TIED`), with the initial weights.
"""

from __future__ import annotations

# Message types beyond Flower's plain ``train`` and ``evaluate``: the ClientApp registers the names
# (``@app.query(INITIAL)``), the ServerApp sends the full types (:data:`QUERY_INITIAL`).
INITIAL = "initial"  # query: the model's seeded initial shared weights and its name
NAME = "device"  # query: the device's name (rounds are sampled by name, so a seed picks the same devices)
PERSONALIZE = "personalize"  # train: fine-tune the final global model and keep it on the device
KEEP = "keep"  # train: keep the candidate the fleet chose (common.keep_best.fleet_choice) after personalize
QUERY_INITIAL = f"query.{INITIAL}"
QUERY_NAME = f"query.{NAME}"
TRAIN_PERSONALIZE = f"train.{PERSONALIZE}"
TRAIN_KEEP = f"train.{KEEP}"

# The records of a message's content.
ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
DEVICE = "device"
MODEL = "model"

# The DEVICE record.
DEVICE_NAME = "device-name"
DEVICE_PROFILE = "device-profile"
SCHEDULE_ID = "schedule-id"
ABSENT = "absent"  # a train reply's: why the device sends no update this round (unplugged, asleep)

# The MODEL record.
MODEL_NAME = "name"
MODEL_TIED = "tied"  # "alias=source" for each shared weight that is another's tensor (absent: none)

# The CONFIG record the server sends.
SERVER_ROUND = "server-round"  # as Flower's FedAvg sends it: the devices know which round it is
LOCAL_STEPS = "local-steps"
LR = "lr"
FINETUNE_STEPS = "finetune-steps"
LOCAL_BASELINE = "local-baseline"
GLOBAL_VERSION = "global-version"  # the stored global model version being personalized (-1: none stored)
FLEET_KEPT = "fleet-kept"  # a keep message's: the candidate the fleet chose (global, personal or local)

# The METRICS of a personalize reply that the server pools into the fleet's choice.
SELECT_SAMPLES = "select-samples"  # the samples of the device's selection half


def select_accuracy(candidate: str) -> str:
    """The metric of ``candidate``'s accuracy on the device's selection half."""
    return f"select-{candidate}-accuracy"


def select_loss(candidate: str) -> str:
    """The metric of ``candidate``'s loss on the device's selection half."""
    return f"select-{candidate}-loss"
