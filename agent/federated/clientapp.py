"""The device's Flower ``ClientApp`` (``agent.federated.clientapp:app``): a thin adapter over :mod:`agent.federated.task`.

Messages it answers (Flower's Message API):

=====================  =================================================================================
``query.initial``      the model's seeded initial weights, shared layers only, and its name (a
                       ``ConfigRecord`` ``model``): the server builds no model
``query.device``       the device's name (``ConfigRecord`` ``device``): the server samples rounds by name
``train``              train the received weights on local data under this device's POET schedule; reply
                       with the shared weights, a ``MetricRecord`` of :data:`agent.federated.task.METRIC_KEYS`
                       and a ``ConfigRecord`` (``schedule-id``, ``device-name``, ``device-profile``); a
                       simulated device follows the run's availability trace
                       (:func:`agent.federated.virtual.round_part`): absent, it replies with only its ``device``
                       ConfigRecord and ``absent`` (why); a straggler trains a share of the steps
``evaluate``           the received weights (with the device's personal layers) on its held-out data
``train.personalize``  evaluate the global model, fine-tune it locally under the schedule (``ditto``: train
                       the device's personal model on towards it), evaluate again; metrics only
                       (``global-accuracy``, ``personal-accuracy`` and the ``global-version`` it started
                       from added), no weights back; the device keeps its own pick of the candidates
                       (:mod:`common.keep_best`) and holds them all until ``train.keep``
``train.keep``         keep the candidate the fleet chose (``fleet-kept``: every device's selection half
                       pooled) in place of the device's own pick; the personalize reply's metrics back, with
                       the final ``kept``, ``kept-by-fleet`` (1) and the device's own pick (``own-kept``)
=====================  =================================================================================

A device agent's SuperNode (:mod:`agent.federated.supernode`) gives the node config ``agent-config``, the
path of the agent's config: the round then trains the agent's own model on its own data file under the
schedule the agent holds for its memory budget (:func:`agent_device`; profiled and cached by the agent).
Otherwise the device is described by its node config (``--node-config`` of ``flower-supernode``):
``device-name``, ``device-profile`` (a built-in profile, default ``rpi4``),
``budget-fraction`` (of a plain step's whole memory; absent or 1: no limit) or
``memory-budget`` (bytes), and its data: ``partition-id`` / ``num-partitions`` of the digits
(:mod:`agent.digits`, optionally seen from ``angle``), spread as the run config's ``samples``,
``label-alpha``, ``quantity-skew`` and ``viewpoints`` say (:class:`agent.federated.virtual.FleetData`).  The run config
(:class:`common.runconfig.RunConfig`) says ``personalization`` (``none``, ``finetune``, ``fedper``, ``fedbn``,
and in simulations only ``ditto`` and ``biases-norms``) and ``seed``.  In Flower's simulation engine a
virtual SuperNode's node config holds only ``partition-id`` and ``num-partitions``; when the run
config's ``device-classes`` is set, the rest comes from them (:func:`agent.federated.virtual.virtual_node_config`:
class, profile, budget fraction, name).

Every reply's metrics carry ``startup-seconds``: from the launch of this ClientApp's process to its
handler (Flower's per-message cost on the device; -1 where unknown, as in the simulation engine).  The
agent's warm runner (:mod:`agent.federated.runner`) forks these processes ready-loaded and calls
:func:`run_clientapp_process`.

Personal layers (``fedper``, ``fedbn``) live in ``context.state`` under ``personal`` and are never put
in a reply: :func:`shared` drops them from every ``ArrayRecord`` this app sends.  A device agent also keeps
``context.state`` in its state directory (:mod:`agent.federated.run_state`): a restarted SuperNode's device
carries on the run with the personal layers and data position it had.  Under ``ditto`` each round
also trains a whole personal model, kept in ``context.state`` under ``ditto`` and never sent, on the round's
batches and pulled towards the round's global model (:func:`ditto_train`).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from agent.data import LocalDataset
from agent.errors import FederationError
from agent.federated import run_state
from agent.federated.task import DevicePlan, Task, TrainOutcome, metric_values
from agent.personalization import Strategy, strategy as strategy_named
from agent.personalization.ditto import Ditto
from agent.federated.virtual import FleetData, RoundPart, round_part, virtual_node_config
from agent.holdout import holdout_halves
from agent.weights import tied_aliases
from common.keep_best import CANDIDATES, Choice, choose
from common.errors import RunConfigError
from common.messages import (ABSENT, ARRAYS, CONFIG, DEVICE, DEVICE_NAME, DEVICE_PROFILE, FINETUNE_STEPS, FLEET_KEPT,
                             GLOBAL_VERSION, INITIAL, KEEP, LOCAL_BASELINE, LOCAL_STEPS, LR, METRICS, MODEL, MODEL_NAME,
                             MODEL_TIED, NAME, PERSONALIZE, SCHEDULE_ID, SELECT_SAMPLES, SERVER_ROUND, select_accuracy,
                             select_loss)
from common.runconfig import RunConfig
from schedules.graph import TrainingGraph

PERSONAL = "personal"  # context.state: the ArrayRecord of personal layers
DITTO = "ditto"  # context.state: the ArrayRecord of Ditto's personal model
POSITION = "position"  # context.state: the ConfigRecord of the next batch's (epoch, index)
BUDGET = "budget"  # context.state: the ConfigRecord of the device's memory budget in bytes (-1: none)
CHOSEN = "chosen"  # context.state: the ConfigRecord of the personalize reply's metrics, until train.keep
CANDIDATE = "candidate."  # a simulated device's context.state: + a candidate's name, its weights, until train.keep

app = ClientApp()
DEFAULTS = RunConfig()  # what a message's config falls back to


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
    data: FleetData
    seed: int

    @classmethod
    def from_context(cls, context: Context) -> DeviceSetup:
        """The setup from ``context.node_config`` (and the run config's ``seed``, ``device-classes`` and
        :class:`FleetData` keys)."""
        node, run = dict(context.node_config), run_config(context)
        try:
            if run.device_classes and "device-name" not in node:  # a virtual device of a simulation
                node = {**virtual_node_config(int(node["partition-id"]), int(node["num-partitions"]),
                                              run.device_classes), **node}
            fraction = float(node.get("budget-fraction", 0)) or None
            budget = int(node.get("memory-budget", 0)) or None
            angle = node.get("angle")
            return cls(str(node.get("device-name", f"node-{context.node_id}")), str(node.get("device-profile", "rpi4")),
                       fraction, budget, int(node.get("partition-id", 0)), int(node.get("num-partitions", 1)),
                       None if angle is None else float(angle), FleetData.from_run_config(run), run.seed)
        except (KeyError, TypeError, ValueError) as exc:
            raise FederationError(f"node config {node} is incomplete or has a value of the wrong type: {exc}") from exc


def run_config(context: Context) -> RunConfig:
    """The run's typed configuration (:class:`common.runconfig.RunConfig`); a bad one is a
    :class:`~agent.errors.FederationError`.  Keys this version does not know are left out (the app bundle comes
    from the server, which may be newer than the device): a device trains with what it understands."""
    known = RunConfig.keys()
    try:
        return RunConfig.from_mapping({k: v for k, v in context.run_config.items() if k in known})
    except RunConfigError as exc:
        raise FederationError(str(exc)) from exc


LAUNCHED_AT = "POET_CLIENTAPP_LAUNCHED_AT"  # environment: when the warm runner was asked for this process

_TASKS: dict[tuple[int, str, str, str, str, str], Task] = {}  # per process: by seed, graph, tuning, data, start
_DATA: dict[DeviceSetup, LocalDataset] = {}
_AGENTS: dict[str, _Device] = {}  # agent config path -> the agent's device, built once per process


def task_for(seed: int, graph_file: str = "", tuning: str = "", data: FleetData = FleetData(),
             initial_weights: str = "") -> Task:
    """The fleet's model's :class:`Task` for ``seed`` (the digits', or one sized to ``data``'s data set,
    :func:`agent.digits.fleet_workload`), built once per process: with ``graph_file`` (run config
    ``graph-file``: the graph a simulation profiled once for its whole fleet) every device plans from the same
    node times, else from this process's own extraction.  With ``tuning`` (a strategy of
    :attr:`agent.personalization.Strategy.partial_tuning`) only what that strategy fine-tunes is trainable.
    With ``initial_weights`` (run config ``initial-weights``) the model starts from that file's weights, not the
    seeded ones: the run's start, and the local-only baseline's."""
    key = (seed, graph_file, tuning, data.dataset, data.label_column, initial_weights)
    if key not in _TASKS:
        from agent.digits import fleet_workload
        from agent.errors import WeightsError

        graph = TrainingGraph.load(graph_file) if graph_file else None
        try:
            work = fleet_workload(data, seed, tuning=tuning, initial_weights=initial_weights)
        except WeightsError as exc:  # an error reply: the simulation shows it as the run's failure
            raise FederationError(f"run config initial-weights: {exc}") from exc
        _TASKS[key] = Task(work, graph=graph)
    return _TASKS[key]


def fleet_task(context: Context, setup: DeviceSetup, tuning: str = "") -> Task:
    """A simulated device's :func:`task_for`, as the run config says (graph, start weights)."""
    run = run_config(context)
    return task_for(setup.seed, run.tuning_graph_file if tuning else run.graph_file, tuning, setup.data,
                    run.initial_weights)


def tuning_for(d: _Device, context: Context) -> tuple[Task, DevicePlan]:
    """What the device fine-tunes with in the personalize phase: its own task and plan, or under a strategy that
    tunes part of the model, the task with the rest frozen, planned for the same budget."""
    strategy = personalization(context)
    if not strategy.partial_tuning:
        return d.task, d.plan
    task = fleet_task(context, d.setup, strategy.name)
    try:
        return task, task.plan(d.setup.profile, d.plan.budget_bytes)
    except FederationError as exc:
        raise FederationError(f"{d.setup.name}: {exc}") from exc


def data_for(setup: DeviceSetup) -> LocalDataset:
    """The device's local data: its share of the digits, seen from its angle."""
    if setup not in _DATA:
        from agent.digits import device_dataset

        _DATA[setup] = device_dataset(setup.partition, setup.partitions, data=setup.data, angle=setup.angle,
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


def personalization(context: Context) -> Strategy:
    """The run's personalization strategy (run config ``personalization``)."""
    return strategy_named(run_config(context).personalization)


def shared(weights: dict[str, torch.Tensor], personal: frozenset[str]) -> ArrayRecord:
    """The weights that may leave the device: everything but the personal layers."""
    return ArrayRecord({k: v for k, v in weights.items() if k not in personal})


def merged(received: ArrayRecord, context: Context, task: Task, personal: frozenset[str],
           frozen: frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
    """The full model: received shared weights, with this device's personal layers (initial ones at first) and
    its ``frozen`` base weights under adapters (always the initial ones, read from the file they are kept in)."""
    weights = {k: v for k, v in received.to_torch_state_dict().items() if k not in personal and k not in frozen}
    own = context.state[PERSONAL].to_torch_state_dict() if PERSONAL in context.state else {}
    initial = task.initial
    weights.update({k: own.get(k, initial[k]) for k in personal})
    weights.update({k: initial[k] for k in frozen})
    missing = set(initial) - set(weights)
    if missing:
        raise FederationError(f"the server sent weights without {sorted(missing)[:3]}...: another model or run")
    return {k: weights[k] for k in initial}  # the model's own key order


def _keep(context: Context, weights: dict[str, torch.Tensor], personal: frozenset[str],
          position: tuple[int, int] | None = None, steps: int = 0) -> None:
    if personal:
        context.state[PERSONAL] = ArrayRecord({k: weights[k] for k in personal})
    if position is not None:
        context.state[POSITION] = ConfigRecord({"epoch": position[0], "index": position[1],
                                                "steps": _steps_trained(context) + steps,
                                                "rounds": [*_round_steps(context), steps]})


def _steps_trained(context: Context) -> int:
    """Optimizer steps this device trained in the run's rounds so far."""
    return int(context.state[POSITION].get("steps", 0)) if POSITION in context.state else 0


def _round_steps(context: Context) -> list[int]:
    """The steps of each round this device trained in, in order (each with an optimizer of its own)."""
    return [int(n) for n in context.state[POSITION].get("rounds", [])] if POSITION in context.state else []


def _position(context: Context) -> tuple[int, int]:
    if POSITION not in context.state:
        return 0, 0
    record = context.state[POSITION]
    return int(record["epoch"]), int(record["index"])


def _info(setup: DeviceSetup, plan: DevicePlan) -> ConfigRecord:
    return ConfigRecord({SCHEDULE_ID: plan.schedule.schedule_id, DEVICE_NAME: setup.name,
                         DEVICE_PROFILE: setup.profile})


def _config(msg: Message) -> ConfigRecord:
    return msg.content[CONFIG] if CONFIG in msg.content else ConfigRecord()


@dataclass(frozen=True)
class _Device:
    setup: DeviceSetup
    task: Task
    data: LocalDataset
    plan: DevicePlan
    personal: frozenset[str]
    own_optimizer: bool = False  # a device agent's: it trains with its configured settings, the round's lr aside
    state_dir: Path | None = None  # a device agent's: where its personalized model is kept
    input: str = ""  # the input shape it trains on, as the agent's config says it
    held_bytes: int = 0  # memory held beside every step and planned around (ditto's second model)
    weights_sha256: str | None = None  # a device agent's configured pretrained weights (agent.weights.fingerprint)
    frozen: frozenset[str] = frozenset()  # a device agent's base weights under adapters: they never leave it

    @property
    def budget_bytes(self) -> int:
        """The device's memory budget (-1: none): its plan's, with what it holds beside the steps."""
        return -1 if self.plan.budget_bytes is None else self.plan.budget_bytes + self.held_bytes

    def learning_rate(self, config: ConfigRecord) -> float | None:
        """The round's learning rate for a simulated device; ``None`` (its own) for a device agent."""
        return None if self.own_optimizer else float(config.get(LR, DEFAULTS.lr))


def agent_device(config_path: str) -> _Device:
    """The device as its agent's config describes it: the agent's workload, data file and schedule.

    Built once per process (the agent's warm runner builds it before forking the ClientApps): the
    workload's profile and the schedule come from the agent's cache (:func:`agent.prepare.prepare`;
    the first time, it profiles the workload and gets a schedule as the agent would).
    """
    if config_path not in _AGENTS:
        from agent.config import load_config
        from agent.prepare import prepare
        from agent.data import open_dataset
        from agent.zoo import token_vocabulary

        config = load_config(config_path)
        prepared = prepare(config)
        inputs = prepared.workload.inputs
        shape = tuple((inputs[0] if isinstance(inputs, tuple) else inputs).shape)
        data = open_dataset(config.data.path, shape, holdout=config.data.holdout, seed=config.workload.seed,
                            tokenizer=config.data.tokenizer, vocabulary=token_vocabulary(prepared.workload.model))
        config.swap_dir.mkdir(parents=True, exist_ok=True)
        from engine.training import OptimizerSettings

        task = Task(prepared.workload, config.swap_dir, graph=prepared.graph, segments=prepared.segments,
                    settings=OptimizerSettings.from_config(config.training),
                    tolerance_bytes=config.training.memory_tolerance)
        plan = task.adopt(DevicePlan(prepared.device.name, config.training.memory_budget, prepared.schedule))
        setup = DeviceSetup(config.device.name, prepared.device.name, None, config.training.memory_budget, 0, 1,
                            None, 0.0, config.workload.seed)
        _AGENTS[config_path] = _Device(setup, task, data, plan, frozenset(), state_dir=config.device.state_dir,
                                       input=config.workload.input, weights_sha256=prepared.weights_sha256,
                                       frozen=_frozen_base(prepared.workload.model))
    return _AGENTS[config_path]


def _frozen_base(model: torch.nn.Module) -> frozenset[str]:
    """Under adapters, every state-dict entry that is not an adapter's (the frozen base); else none."""
    from agent.adapters import adapter_keys, has_adapters

    return frozenset(model.state_dict()) - adapter_keys(model) if has_adapters(model) else frozenset()


def _device(context: Context) -> _Device:
    strategy = personalization(context)
    if "agent-config" in context.node_config:
        d = agent_device(str(context.node_config["agent-config"]))
        if strategy.simulation_only:
            raise FederationError(f"{d.setup.name}: personalization {strategy.name} runs in simulations only; a "
                                  "device agent plans for its own measured profile (use finetune, fedper or fedbn)")
        if d.state_dir is not None:  # a restarted SuperNode's fresh context: the run's state from disk
            run_state.restore(context, d.state_dir, d.task.initial)
        return replace(d, personal=strategy.personal_keys(d.task.model), own_optimizer=True)
    setup = DeviceSetup.from_context(context)
    task = fleet_task(context, setup)
    # ditto holds a second whole model (the global one, or its own) beside every step it trains
    held = Ditto.held_bytes(task.initial) if strategy.trains_beside else 0
    try:
        plan = device_plan(task, setup, context)
        if held and plan.budget_bytes is not None:
            plan = task.plan(setup.profile, plan.budget_bytes - held)
    except FederationError as exc:  # an error reply carries no device name: the reason names the device
        beside = f"ditto holds the global model ({held:,} B) beside each step: " if held else ""
        raise FederationError(f"{setup.name}: {beside}{exc}") from exc
    return _Device(setup, task, data_for(setup), plan, strategy.personal_keys(task.model), held_bytes=held,
                   frozen=_frozen_base(task.model))


def _startup_seconds() -> float:
    """Seconds from this ClientApp process's launch to now: the warm runner's stamp, else the process's start
    when it is Flower's ``flwr-clientapp`` program; -1 otherwise (a simulation's long-lived actor)."""
    if LAUNCHED_AT in os.environ:
        return time.time() - float(os.environ[LAUNCHED_AT])
    if os.path.basename(sys.argv[0]).startswith("flwr-clientapp"):
        import psutil

        return time.time() - psutil.Process().create_time()
    return -1.0


def load_clientapp_program() -> None:
    """Import Flower's ``flwr-clientapp`` program and what its first request loads (the warm runner does, once)."""
    import httpcore  # noqa: F401  (httpx loads it with a ClientApp's first client: 0.1 s each otherwise)
    from flwr.supernode.cli import flwr_clientapp  # noqa: F401


def run_clientapp_process(argv: list[str]) -> None:
    """Run Flower's ``flwr-clientapp`` program with ``argv`` in this process (it exits when done): what the
    warm runner's forked children call."""
    from flwr.supernode.cli.flwr_clientapp import flwr_clientapp

    sys.argv = ["flwr-clientapp", *argv]
    flwr_clientapp()


@app.query(INITIAL)
def initial(msg: Message, context: Context) -> Message:
    """The seeded initial weights, shared layers only: the server starts the federation from them."""
    frozen: frozenset[str] = frozenset()
    if "agent-config" in context.node_config:
        d = agent_device(str(context.node_config["agent-config"]))
        task, frozen = d.task, d.frozen
    else:
        task = fleet_task(context, DeviceSetup.from_context(context))
        frozen = _frozen_base(task.model)
    personal = personalization(context).personal_keys(task.model) | frozen
    model: dict[str, Any] = {MODEL_NAME: task.workload.name}
    tied = [f"{alias}={source}" for alias, source in tied_aliases(task.model).items()
            if alias not in personal and source not in personal]
    if tied:  # an imported version may hold each once, as save_pretrained writes them
        model[MODEL_TIED] = tied
    return Message(RecordDict({ARRAYS: shared(task.initial, personal), MODEL: ConfigRecord(model)}), reply_to=msg)


def ditto_train(d: _Device, context: Context, anchor: dict[str, torch.Tensor], steps: int, config: ConfigRecord,
                position: tuple[int, int]) -> TrainOutcome:
    """Ditto's personal model (kept in the device's state; the first global model it is sent to begin with),
    trained ``steps`` steps on the device's data, each followed by a pull towards ``anchor`` (the global model
    of the round) with the run's ``ditto-lambda``, under the device's plan (made for its budget less the second
    model it holds: :func:`_device`)."""
    own = context.state[DITTO].to_torch_state_dict() if DITTO in context.state else anchor
    outcome = Ditto.train_personal(d.task, own, anchor, d.data, d.plan, steps=steps, lr=d.learning_rate(config),
                                   position=position, strength=run_config(context).ditto_lambda)
    context.state[DITTO] = ArrayRecord(outcome.weights)
    return outcome


@app.query(NAME)
def device(msg: Message, context: Context) -> Message:
    """The device's name: the server samples each round's devices by name, so a seed picks the same ones."""
    name = agent_device(str(context.node_config["agent-config"])).setup.name if "agent-config" in context.node_config \
        else DeviceSetup.from_context(context).name
    return Message(RecordDict({DEVICE: ConfigRecord({DEVICE_NAME: name})}), reply_to=msg)


def _round_part(d: _Device, context: Context, config: ConfigRecord) -> RoundPart:
    """A simulated device's part in this round under the run's availability trace; a device agent trains it all
    (its own eligibility decides whether it is online at all)."""
    if "agent-config" in context.node_config or SERVER_ROUND not in config:
        return RoundPart()
    return round_part(d.setup.partition, d.setup.partitions, int(config[SERVER_ROUND]), run_config(context))


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received weights locally under the device's schedule; reply with the shared weights."""
    startup = _startup_seconds()
    d = _device(context)
    config = _config(msg)
    part = _round_part(d, context, config)
    if part.absent:  # no update: the server records why and leaves it out of the average
        return Message(RecordDict({DEVICE: ConfigRecord({**_info(d.setup, d.plan), ABSENT: part.absent})}),
                       reply_to=msg)
    steps = max(1, round(int(config.get(LOCAL_STEPS, DEFAULTS.local_steps)) * part.share))
    received = merged(msg.content[ARRAYS], context, d.task, d.personal, d.frozen)
    outcome = d.task.train(received, d.data, d.plan, steps=steps, lr=d.learning_rate(config),
                           position=_position(context))
    steps_done, energy, peak, seconds = outcome.steps, outcome.energy_j, outcome.peak_bytes, outcome.seconds
    if personalization(context).trains_beside:  # the personal model trains beside, on the same batches
        own = ditto_train(d, context, received, steps, config, _position(context))
        steps_done, energy = steps_done + own.steps, energy + own.energy_j
        peak, seconds = max(peak, own.peak_bytes), seconds + own.seconds
    _keep(context, outcome.weights, d.personal, outcome.position, steps_done)
    if d.state_dir is not None:  # a device agent's state outlives its SuperNode
        run_state.persist(context, d.state_dir)
    loss, accuracy, _ = d.task.evaluate(outcome.weights, d.data)
    metrics = metric_values(**{"num-examples": outcome.examples, "train-loss": outcome.loss, "eval-loss": loss,
                               "accuracy": accuracy, "steps": steps_done, "peak-bytes": peak,
                               "budget-bytes": d.budget_bytes, "energy-j": energy,
                               "seconds": seconds, "startup-seconds": startup})
    return Message(RecordDict({ARRAYS: shared(outcome.weights, d.personal | d.frozen), METRICS: MetricRecord(metrics),
                               DEVICE: _info(d.setup, d.plan)}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """The received weights, with the device's personal layers, on its held-out data."""
    startup = _startup_seconds()
    d = _device(context)
    loss, accuracy, count = d.task.evaluate(merged(msg.content[ARRAYS], context, d.task, d.personal, d.frozen), d.data)
    metrics = metric_values(**{"num-examples": count, "eval-loss": loss, "accuracy": accuracy, "steps": 0,
                               "budget-bytes": d.budget_bytes, "startup-seconds": startup})
    return Message(RecordDict({METRICS: MetricRecord(metrics), DEVICE: _info(d.setup, d.plan)}), reply_to=msg)


def _local_baseline(d: _Device, context: Context, config: ConfigRecord,
                    finetune_steps: int) -> tuple[dict[str, dict[str, torch.Tensor]], int]:
    """The device alone: the initial weights trained on its own data, from its first batch, for as many steps as
    it trained in the run (rounds and fine-tuning), under the same schedule, twice: with one optimizer for all
    of them (``local``), and with the optimizer restarted where the run restarted it, at each round and for
    the fine-tuning (``local-restarted``); both models and the steps.  The device keeps the better of the two
    as its local-only candidate (:func:`_local_candidate`)."""
    lr, parts = d.learning_rate(config), [*_round_steps(context), finetune_steps]
    steps = sum(parts)
    once = d.task.train(d.task.initial, d.data, d.plan, steps=steps, lr=lr).weights
    weights, position = d.task.initial, (0, 0)
    for part in (p for p in parts if p > 0):
        outcome = d.task.train(weights, d.data, d.plan, steps=part, lr=lr, position=position)
        weights, position = outcome.weights, outcome.position
    return {"local": once, "local-restarted": weights}, steps


def _local_candidate(task: Task, variants: dict[str, dict[str, torch.Tensor]], data: LocalDataset,
                     metrics: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The better local-only model on the selection half of the held-out data (accuracy, then loss; one
    optimizer first on a tie);
    ``metrics`` says which (``local-restarted``: 1 where the restarted one was kept)."""
    selection, _ = holdout_halves(data)
    scores = {}
    for name, weights in variants.items():
        loss, accuracy, _ = task.evaluate(weights, selection)
        scores[name] = (accuracy, -loss)  # accuracy, then the lower loss
    restarted = scores["local-restarted"] > scores["local"]
    metrics["local-restarted"] = int(restarted)
    return variants["local-restarted" if restarted else "local"]


def _choice(task: Task, candidates: dict[str, dict[str, torch.Tensor]], data: LocalDataset) -> Choice:
    """Each candidate on both halves of ``data``'s held-out samples, and the one kept
    (:mod:`common.keep_best`)."""
    selection, test = holdout_halves(data)
    chosen = {name: task.evaluate(weights, selection) for name, weights in candidates.items()}
    return choose({name: accuracy for name, (_, accuracy, _) in chosen.items()},
                  {name: task.evaluate(weights, test)[1] for name, weights in candidates.items()},
                  {name: loss for name, (loss, _, _) in chosen.items()}, samples=len(selection.holdout_y))


@app.train(PERSONALIZE)
def personalize(msg: Message, context: Context) -> Message:
    """Global model on local data, then fine-tuned locally under the schedule; metrics only, nothing shared."""
    startup = _startup_seconds()
    d = _device(context)
    config = _config(msg)
    weights = merged(msg.content[ARRAYS], context, d.task, d.personal, d.frozen)
    global_loss, _, _ = d.task.evaluate(weights, d.data)
    task, plan = tuning_for(d, context)
    finetune_steps = int(config.get(FINETUNE_STEPS, DEFAULTS.finetune_steps))
    if personalization(context).trains_beside:  # the personal model, trained on towards the final global model
        outcome = ditto_train(d, context, weights, finetune_steps, config, _position(context))  # under d.plan
    else:
        outcome = task.train(weights, d.data, plan, steps=finetune_steps,
                             lr=d.learning_rate(config), position=_position(context))
    loss, accuracy, count = task.evaluate(outcome.weights, d.data)
    metrics: dict[str, Any] = metric_values(**{
        "num-examples": count, "train-loss": outcome.loss, "eval-loss": loss, "accuracy": accuracy,
        "steps": outcome.steps, "peak-bytes": outcome.peak_bytes, "budget-bytes": d.budget_bytes,
        "energy-j": outcome.energy_j, "seconds": outcome.seconds, "startup-seconds": startup})
    version = int(config.get(GLOBAL_VERSION, -1))
    metrics.update({"global-loss": global_loss, GLOBAL_VERSION: version,
                    "planned-peak-bytes": plan.schedule.predicted_peak_bytes + d.held_bytes})
    candidates = {"global": weights, "personal": outcome.weights}
    if bool(config.get(LOCAL_BASELINE, False)):
        variants, metrics["local-steps-total"] = _local_baseline(d, context, config, outcome.steps)
        candidates["local"] = _local_candidate(d.task, variants, d.data, metrics)
    choice = _choice(task, candidates, d.data)
    metrics.update({f"{name}-accuracy": value for name, value in choice.test.items()})  # the reporting half
    metrics.update({select_accuracy(name): value for name, value in choice.selection.items()})
    metrics.update({select_loss(name): value for name, value in choice.selection_loss.items()})
    metrics.update({"kept": CANDIDATES.index(choice.kept), "kept-accuracy": choice.kept_accuracy,
                    SELECT_SAMPLES: len(holdout_halves(d.data)[0].holdout_y)})
    _keep_model(d, context, choice, candidates[choice.kept], metrics)
    # every candidate waits on the device for the fleet's choice (train.keep): a device agent's in files of
    # their own, not in the SuperNode's memory; a simulated device's in its context
    context.state[CHOSEN] = ConfigRecord(dict(metrics))
    if d.state_dir is not None:
        run_state.write_candidates(d.state_dir, int(context.run_id), candidates)
        run_state.persist(context, d.state_dir)
    else:
        for name, candidate in candidates.items():
            context.state[CANDIDATE + name] = ArrayRecord(candidate)
    return Message(RecordDict({METRICS: MetricRecord(metrics), DEVICE: _info(d.setup, d.plan)}), reply_to=msg)


def _keep_model(d: _Device, context: Context, choice: Choice, weights: dict[str, torch.Tensor],
                metrics: dict[str, Any]) -> None:
    """A device agent keeps ``weights``, the candidate ``choice`` names, with its provenance (the simulation's
    devices keep nothing)."""
    if d.state_dir is None:
        return
    from agent.personal_model import keep

    version = int(metrics.get(GLOBAL_VERSION, -1))
    keep(d.state_dir, weights, model=d.task.workload.name, input=d.input,
         global_version=version if version >= 0 else None, run_id=int(context.run_id),
         personalization=personalization(context).name, steps=int(metrics["steps"]),
         accuracy_before=choice.test["global"], accuracy_after=choice.test["personal"],
         weights_sha256=d.weights_sha256, kept=choice.kept, accuracy_kept=choice.kept_accuracy,
         accuracy_local=choice.test.get("local"))


def _candidate(d: _Device, context: Context, name: str) -> dict[str, torch.Tensor]:
    """The weights of candidate ``name``, waiting for the fleet's choice since personalize."""
    if d.state_dir is not None:
        return run_state.read_candidate(d.state_dir, int(context.run_id), name, d.task.initial)
    return context.state[CANDIDATE + name].to_torch_state_dict()


@app.train(KEEP)
def keep_fleet_choice(msg: Message, context: Context) -> Message:
    """Keep the candidate the fleet chose (``fleet-kept``) where it is not the device's own pick; the personalize
    reply's metrics back with the final choice.  The candidates are let go either way."""
    d = _device(context)
    if CHOSEN not in context.state:
        raise FederationError(f"{d.setup.name}: asked to keep the fleet's choice, but holds no personalization of "
                              f"run {context.run_id} (it did not personalize, or has kept already)")
    metrics = {k: float(v) for k, v in context.state[CHOSEN].items()}
    names = [c for c in CANDIDATES if f"{c}-accuracy" in metrics and select_accuracy(c) in metrics]
    own = CANDIDATES[int(metrics["kept"])]
    choice = choose({c: metrics[select_accuracy(c)] for c in names}, {c: metrics[f"{c}-accuracy"] for c in names},
                    {c: metrics[select_loss(c)] for c in names if select_loss(c) in metrics},
                    fleet=str(_config(msg).get(FLEET_KEPT, "")))
    if choice.by != "fleet":  # the fleet chose no candidate of this device: its own pick stands
        choice = replace(choice, kept=own)
    if choice.kept != own:
        _keep_model(d, context, choice, _candidate(d, context, choice.kept), metrics)
    for name in CANDIDATES:
        context.state.pop(CANDIDATE + name, None)
    del context.state[CHOSEN]
    if d.state_dir is not None:
        run_state.persist(context, d.state_dir)
        run_state.remove_candidates(d.state_dir, int(context.run_id))
    metrics.update({"kept": CANDIDATES.index(choice.kept), "kept-accuracy": choice.kept_accuracy,
                    "kept-by-fleet": int(choice.by == "fleet"), "own-kept": CANDIDATES.index(own),
                    "startup-seconds": _startup_seconds()})
    return Message(RecordDict({METRICS: MetricRecord(metrics), DEVICE: _info(d.setup, d.plan)}), reply_to=msg)
