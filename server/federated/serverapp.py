"""The fleet's Flower ``ServerApp`` (``server.federated.serverapp:app``): weighted FedAvg that records every device's reply.

:class:`RecordingFedAvg` is Flower's ``FedAvg`` (``flwr.serverapp.strategy``) that,
before aggregating, turns each reply into a :class:`server.federated.rounds.RoundRow`
(node id from ``metadata.src_node_id``, device name and schedule id from the
reply's ``device`` ConfigRecord, metrics from its MetricRecord) and hands the
rows to a recorder: the rounds table when the run config names a database.

:func:`run_federation` is the whole run, in three phases:

1. the starting weights: ``query.initial`` to one node gives the model's initial
   shared weights and its name (the server builds no model: it imports no torch);
   where the server keeps global models (:class:`GlobalModels`: a database and a
   data folder), the run starts instead from the newest stored version of the same
   model (``initial-version = "latest"``), a version it names, or afresh (``"none"``);
2. ``num-server-rounds`` rounds of FedAvg (train, then evaluate on the devices'
   held-out data), numbered from ``first-round``; each round's global model is
   stored as a new signed version (:mod:`server.model_versions`) whose parent is
   the version it started from, so a run cut short leaves every finished round
   behind and a later run (``poet-edge server federate`` retries one) goes on from
   there;
3. personalization (unless ``personalization = "none"``): ``train.personalize``
   to every node with the final global weights and their version; each device
   reports the global model's accuracy on its own data and the accuracy after
   fine-tuning under its schedule.  Which layers stay on the device (``fedper``:
   the head, ``fedbn``: BatchNorm) is the devices' business (:mod:`agent.federated.clientapp`):
   they never send them, so the global model is made of the shared layers only.
   Each device also reports every candidate's accuracy on the selection half of its held-out data; the
   server pools them (:func:`common.keep_best.fleet_choice`) and sends the fleet's choice back
   (``train.keep``), which every device then keeps: twenty samples of one device cannot tell its candidates
   apart, the fleet's can.  Both phases' rows (``personalize``, ``keep``) carry the round number after the last.

Each round's devices are a seeded draw (:class:`DeviceSampler`): the same seed samples the same devices.

The run config is :class:`common.runconfig.RunConfig` (keys, defaults and checks); an empty ``database-url``
means the database of the server whose SuperLink runs this app (``$POET_EDGE_DATABASE_URL``, else record
nothing), an empty ``data-dir`` that server's data folder (``$POET_EDGE_DATA_DIR``, else keep no versions).

The same app runs in a deployment (real SuperNodes) and in Flower's simulation
engine (``poet-edge simulate``: virtual SuperNodes on Ray); it uses Flower's
public API only.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from common.errors import RunConfigError
from common.keep_best import CANDIDATES, fleet_choice
from common.messages import (ABSENT, ARRAYS, CONFIG, DEVICE, DEVICE_NAME, FINETUNE_STEPS, FLEET_KEPT, GLOBAL_VERSION,
                             LOCAL_BASELINE, LOCAL_STEPS, LR, MODEL, MODEL_NAME, MODEL_TIED, QUERY_INITIAL, QUERY_NAME,
                             SCHEDULE_ID, SELECT_SAMPLES, SERVER_ROUND, TRAIN_KEEP, TRAIN_PERSONALIZE, select_accuracy,
                             select_loss)
from common.runconfig import RunConfig
from server.db.engine import Database
from server.errors import ModelVersionError, ServerConfigError, ServerError
from server.keys import ServerKey, load_or_create
from server.model_versions import (checked_weights, fit, identities, load_version, model_identity, store_version,
                                   version_info)
from server.config import ServerSettings
from server.federated.rounds import RoundRow, open_store, record_rounds
from server.federated.superlink import DATA_DIR_VARIABLE, DATABASE_VARIABLE

log = logging.getLogger("poet-server")
Recorder = Callable[[list[RoundRow]], None]

app = ServerApp()


def federation_config(run: Mapping[str, Any]) -> RunConfig:
    """The run's settings (:class:`common.runconfig.RunConfig`); an empty ``database-url`` becomes the database
    of the server whose SuperLink runs this app (``$POET_EDGE_DATABASE_URL``).  Every problem is reported at
    once, as a :class:`~server.errors.ServerConfigError`."""
    try:
        config = RunConfig.from_mapping(run)
    except RunConfigError as exc:
        raise ServerConfigError(str(exc)) from exc
    return config if config.database_url else config.replace(database_url=os.environ.get(DATABASE_VARIABLE, ""))


def reply_row(msg: Message, phase: str, server_round: int, run_id: int, sent: Iterable[Message] = ()) -> RoundRow:
    """The stored row for one device's reply.  An error reply (a device that stopped mid-round, a ClientApp
    that raised) becomes a row whose metrics are ``{"error": reason}``; the SuperLink sends those for a departed
    node, so its node is the destination of the message it answers (among ``sent``), and its name the device
    registered for that node when the server's data folder is known (``$POET_EDGE_DATA_DIR``)."""
    node = msg.metadata.src_node_id
    if msg.has_error():
        node = next((m.metadata.dst_node_id for m in sent
                     if m.metadata.message_id == msg.metadata.reply_to_message_id), node)
        return RoundRow(run_id, server_round, phase, node, _device_for_node(node) or f"node-{node}",
                        {"error": f"{msg.error.reason} (code {msg.error.code})"})
    info = msg.content[DEVICE] if DEVICE in msg.content else ConfigRecord()
    metrics = next(iter(msg.content.metric_records.values()), {})
    why = absent(msg)
    figures = {ABSENT: why} if why else {k: v for k, v in metrics.items()}
    return RoundRow(run_id, server_round, phase, node, str(info.get(DEVICE_NAME, f"node-{node}")),
                    figures, str(info[SCHEDULE_ID]) if SCHEDULE_ID in info else None)


def _device_for_node(node: int) -> str | None:
    data_dir = os.environ.get(DATA_DIR_VARIABLE)
    if not data_dir:
        return None
    from server.federated.supernodes import device_for_node

    try:
        return device_for_node(ServerSettings(data_dir=Path(data_dir)), node)
    except ServerError:
        return None


class RecordingFedAvg(FedAvg):
    """Weighted FedAvg that samples each round's devices with the run's seed (:class:`DeviceSampler`) and records a
    row per device per round before aggregating (module docstring)."""

    def __init__(self, recorder: Recorder, run_id: int, sampler: DeviceSampler, **fedavg: Any) -> None:
        super().__init__(**fedavg)
        self.recorder, self.run_id, self.sampler = recorder, run_id, sampler
        self.sent: list[Message] = []  # this round's messages: the grid gives them their ids as it sends them

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        nodes = self.sampler.sample(grid, "train", server_round, self.fraction_train, self.min_train_nodes)
        self.sent = self._messages(MessageType.TRAIN, server_round, arrays, config, nodes)
        return self.sent

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        nodes = self.sampler.sample(grid, "evaluate", server_round, self.fraction_evaluate, self.min_evaluate_nodes)
        self.sent = self._messages(MessageType.EVALUATE, server_round, arrays, config, nodes)
        return self.sent

    def _messages(self, kind: str, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                  nodes: list[int]) -> list[Message]:
        config[SERVER_ROUND] = server_round  # as Flower's FedAvg does: the devices know which round it is
        log.info("round %d: %s on %d devices", server_round, kind, len(nodes))
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return [Message(record, dst_node_id=node, message_type=kind) for node in nodes]

    def _record(self, phase: str, server_round: int, replies: list[Message]) -> None:
        rows = [reply_row(m, phase, server_round, self.run_id, self.sent) for m in replies]
        if rows:
            self.recorder(rows)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, Any]:
        replies = in_device_order(replies)
        self._record("train", server_round, replies)
        updates = [m for m in replies if not absent(m)]  # an absent device sent no update to average
        return super().aggregate_train(server_round, updates) if updates else (None, None)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> Any:
        replies = in_device_order(replies)
        self._record("evaluate", server_round, replies)
        return super().aggregate_evaluate(server_round, replies)




def absent(msg: Message) -> str:
    """Why a train reply carries no update (a simulated device not available this round), else ``""``."""
    if msg.has_error() or DEVICE not in msg.content:
        return ""
    return str(msg.content[DEVICE].get(ABSENT, ""))


def in_device_order(replies: Iterable[Message]) -> list[Message]:
    """``replies`` by device name, then node id: the weighted average sums in this order, so the same run gives
    the same global model bit for bit whichever device answered first (floating-point addition does not
    commute in its rounding)."""
    def key(msg: Message) -> tuple[str, int]:
        info = msg.content[DEVICE] if not msg.has_error() and DEVICE in msg.content else ConfigRecord()
        return str(info.get(DEVICE_NAME, "")), int(msg.metadata.src_node_id)

    return sorted(replies, key=key)


@dataclass
class DeviceSampler:
    """Each round's devices: a seeded draw over the connected devices ordered by name, so a run with the same
    seed samples the same devices (a simulation's node ids are random; Flower's own sampling is unseeded).

    With a fraction below 1 the devices are asked their names once (``query.device``); one that does not
    answer sorts by its node id.  Waits up to ``wait_seconds`` for ``min_nodes`` devices to connect.
    """

    seed: int
    min_nodes: int
    wait_seconds: float
    names: dict[int, str] = field(default_factory=dict)

    def sample(self, grid: Grid, phase: str, server_round: int, fraction: float, minimum: int) -> list[int]:
        """The nodes of ``phase`` in ``server_round``: ``fraction`` of the connected ones, at least ``minimum``."""
        if fraction <= 0:
            return []
        nodes = self._connected(grid)
        if fraction < 1:
            self._learn_names(grid, nodes)
        ordered = sorted(nodes, key=lambda n: (self.names.get(n, ""), n))
        size = min(len(ordered), max(int(len(ordered) * fraction), minimum))
        if size == len(ordered):
            return ordered
        return sorted(random.Random(f"{self.seed}:{phase}:{server_round}").sample(ordered, size),
                      key=ordered.index)

    def _connected(self, grid: Grid) -> list[int]:
        deadline = time.monotonic() + self.wait_seconds
        while len(nodes := sorted(grid.get_node_ids())) < self.min_nodes:
            if time.monotonic() > deadline:
                raise ServerError(f"{len(nodes)} devices connected, fewer than min-nodes {self.min_nodes}, after "
                                  f"{self.wait_seconds:.0f} s: start more SuperNodes (agents) or lower min-nodes")
            log.info("waiting for devices: %d connected, %d needed", len(nodes), self.min_nodes)
            time.sleep(1.0)
        return nodes

    def _learn_names(self, grid: Grid, nodes: list[int]) -> None:
        unknown = [n for n in nodes if n not in self.names]
        if not unknown:
            return
        asks = [Message(RecordDict({CONFIG: ConfigRecord()}), dst_node_id=n, message_type=QUERY_NAME)
                for n in unknown]
        for reply in grid.send_and_receive(asks, timeout=self.wait_seconds):
            if not reply.has_error() and DEVICE in reply.content:
                self.names[reply.metadata.src_node_id] = str(reply.content[DEVICE].get(DEVICE_NAME, ""))
        for node in unknown:  # one that did not answer sorts by its node id: not asked (and waited for) again
            self.names.setdefault(node, "")


@dataclass(frozen=True)
class DevicesModel:
    """The model the devices train, as one of them describes it: its initial shared weights, its name, and which
    weights are tied to another (``alias -> source``)."""

    arrays: ArrayRecord
    name: str
    tied: dict[str, str]

    @property
    def identity(self) -> str:
        """What its versions are stored as (:func:`server.model_versions.model_identity`)."""
        return model_identity(self.name, _numpy(self.arrays))

    def identities(self) -> tuple[str, ...]:
        """Every identity a version it can start from may carry (:func:`server.model_versions.identities`)."""
        return identities(self.name, _numpy(self.arrays), self.tied)


def initial_arrays(grid: Grid, config: RunConfig) -> DevicesModel:
    """Ask one device for the model's initial shared weights (``query.initial``), its name and its tied
    weights."""
    nodes = sorted(grid.get_node_ids())
    if not nodes:
        raise ServerError("no device is connected: start SuperNodes (or agents) before the run")
    ask = Message(RecordDict({CONFIG: ConfigRecord()}), dst_node_id=nodes[0], message_type=QUERY_INITIAL)
    replies = [m for m in grid.send_and_receive([ask], timeout=config.round_timeout) if not m.has_error()]
    if not replies or ARRAYS not in replies[0].content:
        raise ServerError(f"node {nodes[0]} sent no initial weights: check its log (flwr log RUN_ID)")
    content = replies[0].content
    model = content[MODEL] if MODEL in content else {}
    tied = dict(str(pair).split("=", 1) for pair in model.get(MODEL_TIED, []) if "=" in str(pair))
    return DevicesModel(content[ARRAYS], str(model.get(MODEL_NAME, "model")), tied)


def personalize(grid: Grid, arrays: ArrayRecord, config: RunConfig, recorder: Recorder,
                server_round: int, version: int | None = None) -> list[RoundRow]:
    """Phase 3: every device evaluates the global model (``version``, where stored) and fine-tunes it; their
    rows, recorded."""
    content = RecordDict({ARRAYS: arrays, CONFIG: ConfigRecord({
        FINETUNE_STEPS: config.finetune_steps, LR: config.lr, LOCAL_BASELINE: config.local_baseline,
        GLOBAL_VERSION: version if version is not None else -1})})
    asks = [Message(content, dst_node_id=node, message_type=TRAIN_PERSONALIZE) for node in grid.get_node_ids()]
    replies = grid.send_and_receive(asks, timeout=config.round_timeout)
    rows = [reply_row(m, "personalize", server_round, grid.run.run_id, asks) for m in replies]
    if rows:
        recorder(rows)
    chose = [row for row in rows if SELECT_SAMPLES in row.metrics]
    fleet = pooled_choice(chose)
    if fleet is None:  # nothing to pool: every device keeps its own pick
        return rows
    log.info("personalization: the fleet's %d devices keep the %s model", len(chose), fleet)
    keep = RecordDict({CONFIG: ConfigRecord({FLEET_KEPT: fleet})})
    asks = [Message(keep, dst_node_id=row.node_id, message_type=TRAIN_KEEP) for row in chose]
    kept = [reply_row(m, "keep", server_round, grid.run.run_id, asks)
            for m in grid.send_and_receive(asks, timeout=config.round_timeout)]
    if kept:
        recorder(kept)
    return rows + kept


def pooled_choice(rows: Iterable[RoundRow]) -> str | None:
    """The candidate the fleet keeps (:func:`common.keep_best.fleet_choice`: the baseline unless another is ahead
    on the devices' selection halves with 95% confidence, in accuracy or in loss at no less accuracy), from their
    personalize rows."""
    rows = list(rows)
    return fleet_choice([({c: float(r.metrics[select_accuracy(c)]) for c in CANDIDATES
                           if select_accuracy(c) in r.metrics}, int(r.metrics[SELECT_SAMPLES])) for r in rows],
                        [{c: float(r.metrics[select_loss(c)]) for c in CANDIDATES if select_loss(c) in r.metrics}
                         for r in rows])


@dataclass(frozen=True)
class Federated:
    """What a run leaves: the final global weights and the version they were stored as (``None``: not stored)."""

    arrays: ArrayRecord
    version: int | None
    rounds: int


def run_federation(grid: Grid, config: RunConfig, recorder: Recorder,
                   models: GlobalModels | None = None) -> Federated:
    """The whole run (module docstring): the starting weights, FedAvg rounds storing each round's global model
    in ``models``, personalization."""
    sampler = DeviceSampler(config.seed, config.min_nodes, config.round_timeout)
    strategy = RecordingFedAvg(recorder, grid.run.run_id, sampler, fraction_train=config.fraction_train,
                               fraction_evaluate=config.fraction_evaluate, min_train_nodes=config.min_nodes,
                               min_evaluate_nodes=config.min_nodes if config.fraction_evaluate else 0,
                               min_available_nodes=config.min_nodes)
    devices = initial_arrays(grid, config)
    arrays, model, version = devices.arrays, devices.identity, None
    if models is not None:
        arrays, version = models.start(config.initial_version, devices)
    train_config = ConfigRecord({LOCAL_STEPS: config.local_steps, LR: config.lr})
    last = config.first_round + config.num_server_rounds - 1
    for server_round in range(config.first_round, last + 1):
        log.info("round %d of %d, from global model version %s", server_round, last, version)
        replies = grid.send_and_receive(strategy.configure_train(server_round, arrays, train_config, grid),
                                        timeout=config.round_timeout)
        aggregated, train_metrics = strategy.aggregate_train(server_round, replies)
        if aggregated is None:  # no usable reply: the round leaves the model as it was, and no new version
            log.warning("round %d: no device's training could be aggregated", server_round)
            continue
        arrays = aggregated
        replies = grid.send_and_receive(strategy.configure_evaluate(server_round, arrays, ConfigRecord(), grid),
                                        timeout=config.round_timeout)
        evaluate_metrics = strategy.aggregate_evaluate(server_round, replies)
        if models is not None:
            metrics = {**_prefixed("train", train_metrics), **_prefixed("evaluate", evaluate_metrics)}
            version = models.store(arrays, grid.run.run_id, server_round, version, model, metrics)
    if config.personalization != "none":
        personalize(grid, arrays, config, recorder, last + 1, version)
    return Federated(arrays, version, config.num_server_rounds)


def _prefixed(phase: str, metrics: Any) -> dict[str, Any]:
    return {f"{phase}.{key}": value for key, value in (metrics or {}).items()}


def _numpy(arrays: ArrayRecord) -> dict[str, Any]:
    return {name: array.numpy() for name, array in arrays.items()}


@dataclass(frozen=True)
class GlobalModels:
    """Where the ServerApp keeps each round's global model: the server's database, data folder and signing key
    (:mod:`server.model_versions`)."""

    database: Database
    data_dir: Path
    key: ServerKey

    @classmethod
    def for_config(cls, config: RunConfig) -> GlobalModels | None:
        """The store the run config (``data-dir``, else ``$POET_EDGE_DATA_DIR``, and a database) names, or
        ``None`` when it names none."""
        data_dir = config.data_dir or os.environ.get(DATA_DIR_VARIABLE, "")
        if not data_dir or not config.database_url:
            return None
        settings = ServerSettings(data_dir=Path(data_dir))
        return cls(open_store(config.database_url), settings.data_dir, load_or_create(settings.keys_dir))

    def start(self, choice: str, devices: DevicesModel) -> tuple[ArrayRecord, int | None]:
        """The weights a run starts from: the devices' initial ones (``choice`` ``none``, or ``latest`` with no
        version of their model stored yet), the newest version of their model, a federated or an imported one
        (``latest``), or version ``choice``; in the devices' order, tied weights filled in."""
        if choice == "none":
            return devices.arrays, None
        key = self.key.private_key.public_key()
        accepted = devices.identities()
        try:
            if choice == "latest":
                info = version_info(self.database, model=accepted)
                if info is None:
                    return devices.arrays, None
                weights = checked_weights(info, self.data_dir, key)
            else:
                info, weights = load_version(self.database, self.data_dir, key, int(choice))
            if info.model not in accepted:
                raise ServerConfigError(f"global model version {info.version} is of {info.model!r}, but the devices "
                                        f"train {devices.identity!r}: name a version of their model, or "
                                        "initial-version = \"none\"")
            weights = fit(weights, _numpy(devices.arrays), devices.tied, f"global model version {info.version}")
        except ModelVersionError as exc:
            raise ServerConfigError(f"{exc} (run config initial-version = \"none\" starts afresh)") from exc
        log.info("starting from global model version %d (run %s, round %d)", info.version, info.run_id, info.round)
        return ArrayRecord({name: Array(value) for name, value in weights.items()}), info.version

    def store(self, arrays: ArrayRecord, run_id: int, server_round: int, parent: int | None, model: str,
              metrics: dict[str, Any]) -> int:
        """Store ``arrays`` as the round's version; its number."""
        info = store_version(self.database, self.data_dir, self.key.private_key, _numpy(arrays), run_id=run_id,
                             round=server_round, parent=parent, model=model, metrics=metrics)
        log.info("round %d: global model version %d stored (%s)", server_round, info.version, info.sha256[:12])
        return info.version


def store_recorder(database_url: str) -> Recorder:
    """A recorder writing to the server's database at ``database_url``; one that only logs for ``""``."""
    if not database_url:
        return lambda rows: log.info("round rows (not stored: no database-url): %d", len(rows))
    database = open_store(database_url)

    def record(rows: list[RoundRow]) -> None:
        record_rounds(database, rows)

    return record


@app.main()
def main(grid: Grid, context: Context) -> None:
    """The ServerApp: settings from the run config, rows into the server's store."""
    config = federation_config(context.run_config)
    run_federation(grid, config, store_recorder(config.database_url), GlobalModels.for_config(config))
