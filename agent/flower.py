"""The device's Flower ``ClientApp`` (``agent.flower:app``): a thin adapter over :mod:`agent.fedtask`.

Messages it answers (Flower's Message API):

=====================  =================================================================================
``query.initial``      the model's seeded initial weights, shared layers only (the server builds no model)
``train``              train the received weights on local data under this device's POET schedule; reply
                       with the shared weights, a ``MetricRecord`` of :data:`agent.fedtask.METRIC_KEYS`
                       and a ``ConfigRecord`` (``schedule-id``, ``device-name``, ``device-profile``)
``evaluate``           the received weights (with the device's personal layers) on its held-out data
``train.personalize``  evaluate the global model, fine-tune it locally under the schedule, evaluate again;
                       metrics only (``global-accuracy``, ``personal-accuracy`` added), no weights back
=====================  =================================================================================

The device is described by its node config (``--node-config`` of ``flower-supernode``):
``device-name``, ``device-profile`` (a built-in profile, default ``rpi4``),
``budget-fraction`` (of the model's plain activation peak; absent or 1: no limit) or
``memory-budget`` (bytes), and its data: ``partition-id`` / ``num-partitions`` of the digits
(:mod:`agent.digits`) with ``angle`` and ``skew``.  The run config says ``personalization``
(``none``, ``finetune``, ``fedper``, ``fedbn``) and ``seed``.  In Flower's simulation engine a
virtual SuperNode's node config holds only ``partition-id`` and ``num-partitions``; when the run
config's ``device-classes`` is set, the rest comes from them (:func:`agent.virtual.virtual_node_config`:
class, profile, budget fraction, name; run config ``skew``).

Personal layers (``fedper``, ``fedbn``) live in ``context.state`` under ``personal`` and are never put
in a reply: :func:`shared` drops them from every ``ArrayRecord`` this app sends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from agent.data import LocalDataset
from agent.errors import FederationError
from agent.fedtask import PERSONALIZATIONS, DevicePlan, Task, metric_values, personal_keys
from agent.virtual import virtual_node_config

PERSONAL = "personal"  # context.state: the ArrayRecord of personal layers
POSITION = "position"  # context.state: the ConfigRecord of the next batch's (epoch, index)
BUDGET = "budget"  # context.state: the ConfigRecord of the device's memory budget in bytes (-1: none)

app = ClientApp()


@dataclass(frozen=True)
class DeviceSetup:
    """One device as its node config describes it; see the module docstring."""

    name: str
    profile: str
    budget_fraction: float | None
    memory_budget: int | None
    partition: int
    partitions: int
    angle: float | None
    skew: float
    seed: int

    @classmethod
    def from_context(cls, context: Context) -> DeviceSetup:
        """The setup from ``context.node_config`` (and the run config's ``seed``, ``device-classes``, ``skew``)."""
        node, run = dict(context.node_config), context.run_config
        try:
            if run.get("device-classes") and "device-name" not in node:  # a virtual device of a simulation
                node = {**virtual_node_config(int(node["partition-id"]), int(node["num-partitions"]),
                                              str(run["device-classes"]), float(run.get("skew", 0.0))), **node}
            fraction = float(node.get("budget-fraction", 0)) or None
            budget = int(node.get("memory-budget", 0)) or None
            angle = node.get("angle")
            return cls(str(node.get("device-name", f"node-{context.node_id}")), str(node.get("device-profile", "rpi4")),
                       fraction, budget, int(node.get("partition-id", 0)), int(node.get("num-partitions", 1)),
                       None if angle is None else float(angle), float(node.get("skew", 0.0)),
                       int(run.get("seed", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise FederationError(f"node config {node} is incomplete or has a value of the wrong type: {exc}") from exc


_TASKS: dict[int, Task] = {}  # per process: one extraction per seed serves every message and device
_DATA: dict[DeviceSetup, LocalDataset] = {}


def task_for(seed: int) -> Task:
    """The digits model's :class:`Task` for ``seed``, built once per process."""
    if seed not in _TASKS:
        from agent.digits import digits_workload

        _TASKS[seed] = Task(digits_workload(seed))
    return _TASKS[seed]


def data_for(setup: DeviceSetup) -> LocalDataset:
    """The device's local data: its share of the digits, seen from its angle."""
    if setup not in _DATA:
        from agent.digits import device_dataset

        _DATA[setup] = device_dataset(setup.partition, setup.partitions, angle=setup.angle, skew=setup.skew,
                                      seed=setup.seed)
    return _DATA[setup]


def device_plan(task: Task, setup: DeviceSetup, context: Context) -> DevicePlan:
    """The device's schedule: its explicit budget, else its fraction of the plain peak (cached per budget).

    A fraction becomes bytes at the device's first message and is kept in ``context.state``: the plain
    peak includes workspaces measured in this process, which differ by a few kilobytes between the
    processes that may serve one device's messages, and a device's budget must not move between rounds.
    """
    if setup.memory_budget is not None:
        return task.plan(setup.profile, setup.memory_budget)
    if BUDGET not in context.state:
        context.state[BUDGET] = ConfigRecord({"bytes": task.budget_for(setup.budget_fraction) or -1})
    budget = int(context.state[BUDGET]["bytes"])
    return task.plan(setup.profile, None if budget < 0 else budget)


def personalization(context: Context) -> str:
    """The run's personalization strategy (run config ``personalization``, default ``finetune``)."""
    value = str(context.run_config.get("personalization", "finetune"))
    if value not in PERSONALIZATIONS:
        raise FederationError(f"personalization {value!r} unknown; use one of {', '.join(PERSONALIZATIONS)}")
    return value


def shared(weights: dict[str, torch.Tensor], personal: frozenset[str]) -> ArrayRecord:
    """The weights that may leave the device: everything but the personal layers."""
    return ArrayRecord({k: v for k, v in weights.items() if k not in personal})


def merged(received: ArrayRecord, context: Context, task: Task, personal: frozenset[str]) -> dict[str, torch.Tensor]:
    """The full model: received shared weights, with this device's personal layers (initial ones at first)."""
    weights = {k: v for k, v in received.to_torch_state_dict().items() if k not in personal}
    own = context.state[PERSONAL].to_torch_state_dict() if PERSONAL in context.state else {}
    weights.update({k: own.get(k, task.initial[k]) for k in personal})
    missing = set(task.initial) - set(weights)
    if missing:
        raise FederationError(f"the server sent weights without {sorted(missing)[:3]}...: another model or run")
    return {k: weights[k] for k in task.initial}  # the model's own key order


def _keep(context: Context, weights: dict[str, torch.Tensor], personal: frozenset[str],
          position: tuple[int, int] | None = None) -> None:
    if personal:
        context.state[PERSONAL] = ArrayRecord({k: weights[k] for k in personal})
    if position is not None:
        context.state[POSITION] = ConfigRecord({"epoch": position[0], "index": position[1]})


def _position(context: Context) -> tuple[int, int]:
    if POSITION not in context.state:
        return 0, 0
    record = context.state[POSITION]
    return int(record["epoch"]), int(record["index"])


def _info(setup: DeviceSetup, plan: DevicePlan) -> ConfigRecord:
    return ConfigRecord({"schedule-id": plan.schedule.schedule_id, "device-name": setup.name,
                         "device-profile": setup.profile})


def _config(msg: Message) -> ConfigRecord:
    return msg.content["config"] if "config" in msg.content else ConfigRecord()


@dataclass(frozen=True)
class _Device:
    setup: DeviceSetup
    task: Task
    data: LocalDataset
    plan: DevicePlan
    personal: frozenset[str]


def _device(context: Context) -> _Device:
    setup = DeviceSetup.from_context(context)
    task = task_for(setup.seed)
    return _Device(setup, task, data_for(setup), device_plan(task, setup, context),
                   personal_keys(task.model, personalization(context)))


@app.query("initial")
def initial(msg: Message, context: Context) -> Message:
    """The seeded initial weights, shared layers only: the server starts the federation from them."""
    task = task_for(DeviceSetup.from_context(context).seed)
    personal = personal_keys(task.model, personalization(context))
    return Message(RecordDict({"arrays": shared(task.initial, personal)}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received weights locally under the device's schedule; reply with the shared weights."""
    d = _device(context)
    config = _config(msg)
    outcome = d.task.train(merged(msg.content["arrays"], context, d.task, d.personal), d.data, d.plan,
                           steps=int(config.get("local-steps", 10)), lr=float(config.get("lr", 0.05)),
                           position=_position(context))
    _keep(context, outcome.weights, d.personal, outcome.position)
    loss, accuracy, _ = d.task.evaluate(outcome.weights, d.data)
    metrics = metric_values(**{"num-examples": outcome.examples, "train-loss": outcome.loss, "eval-loss": loss,
                               "accuracy": accuracy, "steps": outcome.steps, "peak-bytes": outcome.peak_bytes,
                               "budget-bytes": d.plan.budget_bytes or -1, "energy-j": outcome.energy_j,
                               "seconds": outcome.seconds})
    return Message(RecordDict({"arrays": shared(outcome.weights, d.personal), "metrics": MetricRecord(metrics),
                               "device": _info(d.setup, d.plan)}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """The received weights, with the device's personal layers, on its held-out data."""
    d = _device(context)
    loss, accuracy, count = d.task.evaluate(merged(msg.content["arrays"], context, d.task, d.personal), d.data)
    metrics = metric_values(**{"num-examples": count, "eval-loss": loss, "accuracy": accuracy, "steps": 0,
                               "budget-bytes": d.plan.budget_bytes or -1})
    return Message(RecordDict({"metrics": MetricRecord(metrics), "device": _info(d.setup, d.plan)}), reply_to=msg)


@app.train("personalize")
def personalize(msg: Message, context: Context) -> Message:
    """Global model on local data, then fine-tuned locally under the schedule; metrics only, nothing shared."""
    d = _device(context)
    config = _config(msg)
    weights = merged(msg.content["arrays"], context, d.task, d.personal)
    global_loss, global_accuracy, _ = d.task.evaluate(weights, d.data)
    outcome = d.task.train(weights, d.data, d.plan, steps=int(config.get("finetune-steps", 30)),
                           lr=float(config.get("lr", 0.05)), position=_position(context))
    loss, accuracy, count = d.task.evaluate(outcome.weights, d.data)
    metrics: dict[str, Any] = metric_values(**{
        "num-examples": count, "train-loss": outcome.loss, "eval-loss": loss, "accuracy": accuracy,
        "steps": outcome.steps, "peak-bytes": outcome.peak_bytes, "budget-bytes": d.plan.budget_bytes or -1,
        "energy-j": outcome.energy_j, "seconds": outcome.seconds})
    metrics.update({"global-accuracy": global_accuracy, "global-loss": global_loss, "personal-accuracy": accuracy})
    return Message(RecordDict({"metrics": MetricRecord(metrics), "device": _info(d.setup, d.plan)}), reply_to=msg)
