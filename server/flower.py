"""The fleet's Flower ``ServerApp`` (``server.flower:app``): weighted FedAvg that records every device's reply.

:class:`RecordingFedAvg` is Flower's ``FedAvg`` (``flwr.serverapp.strategy``) that,
before aggregating, turns each reply into a :class:`server.rounds.RoundRow`
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
   the head, ``fedbn``: BatchNorm) is the devices' business (:mod:`agent.flower`):
   they never send them, so the global model is made of the shared layers only.
   Its rows carry the round number after the last.

Run config keys (``[tool.flwr.app.config]``, ``flwr run -c``): ``num-server-rounds``, ``first-round``,
``fraction-train``, ``fraction-evaluate``, ``min-nodes``, ``round-timeout`` (s), ``local-steps``, ``lr``,
``personalization``, ``finetune-steps``, ``local-baseline`` (each device also trains alone from the initial
weights with the steps it spent in the run, and reports that model's accuracy: the local-only baseline),
``initial-version``, ``database-url`` (empty: the database of the
server whose SuperLink runs this app, ``$POET_EDGE_DATABASE_URL``, else record nothing), ``data-dir``
(empty: that server's data folder, ``$POET_EDGE_DATA_DIR``, else keep no versions); the devices also read
``personalization``, ``seed``, ``device-classes``, ``samples``, ``label-alpha``, ``viewpoints`` and ``graph-file``
(:mod:`agent.virtual`).

The same app runs in a deployment (real SuperNodes) and in Flower's simulation
engine (``poet-edge simulate``: virtual SuperNodes on Ray); it uses Flower's
public API only.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from server.db.engine import Database
from server.errors import ModelVersionError, ServerConfigError, ServerError
from server.keys import ServerKey, load_or_create
from server.model_versions import checked_weights, load_version, model_identity, store_version, version_info
from server.config import ServerSettings
from server.rounds import RoundRow, open_store, record_rounds
from server.superlink import DATA_DIR_VARIABLE, DATABASE_VARIABLE

log = logging.getLogger("poet-server")
Recorder = Callable[[list[RoundRow]], None]
PERSONALIZATIONS = ("none", "finetune", "fedper", "fedbn")

app = ServerApp()


@dataclass(frozen=True)
class FederationConfig:
    """The run's settings, from the run config; see the module docstring for the keys."""

    rounds: int = 3
    fraction_train: float = 1.0
    fraction_evaluate: float = 1.0
    min_nodes: int = 2
    round_timeout: float = 600.0
    local_steps: int = 10
    lr: float = 0.05
    personalization: str = "finetune"
    finetune_steps: int = 30
    database_url: str = ""
    data_dir: str = ""
    initial_version: str = "latest"
    first_round: int = 1
    local_baseline: bool = False  # each device also trains alone, with the compute it spent in the run

    @classmethod
    def from_run_config(cls, run: Mapping[str, Any]) -> FederationConfig:
        """Read and check every key; all problems are reported at once."""
        d = cls()
        try:
            config = cls(int(run.get("num-server-rounds", d.rounds)), float(run.get("fraction-train", d.fraction_train)),
                         float(run.get("fraction-evaluate", d.fraction_evaluate)), int(run.get("min-nodes", d.min_nodes)),
                         float(run.get("round-timeout", d.round_timeout)), int(run.get("local-steps", d.local_steps)),
                         float(run.get("lr", d.lr)), str(run.get("personalization", d.personalization)),
                         int(run.get("finetune-steps", d.finetune_steps)),
                         str(run.get("database-url", "")) or os.environ.get(DATABASE_VARIABLE, ""),
                         str(run.get("data-dir", "")), str(run.get("initial-version", d.initial_version)).strip(),
                         int(run.get("first-round", d.first_round)),
                         _flag(run.get("local-baseline", d.local_baseline), "local-baseline"))
        except (TypeError, ValueError) as exc:
            raise ServerConfigError(f"run config has a value of the wrong type: {exc}") from exc
        config.check()
        return config

    def check(self) -> None:
        """Raise :class:`ServerConfigError` listing every out-of-range setting."""
        problems = [text for bad, text in (
            (self.rounds < 0, "num-server-rounds must be 0 (personalization only) or more"),
            (not 0 < self.fraction_train <= 1, "fraction-train must be in (0, 1]"),
            (not 0 <= self.fraction_evaluate <= 1, "fraction-evaluate must be in [0, 1]"),
            (self.min_nodes < 1, "min-nodes must be 1 or more"),
            (self.round_timeout <= 0, "round-timeout must be positive"),
            (self.local_steps < 1, "local-steps must be 1 or more"),
            (self.lr <= 0, "lr must be positive"),
            (self.personalization not in PERSONALIZATIONS,
             f"personalization must be one of {', '.join(PERSONALIZATIONS)}"),
            (self.finetune_steps < 0, "finetune-steps must be 0 or more"),
            (not (self.initial_version in ("latest", "none") or self.initial_version.isdigit()),
             "initial-version must be latest, none or a version number"),
            (self.first_round < 1, "first-round must be 1 or more")) if bad]
        if problems:
            raise ServerConfigError("federation settings: " + "; ".join(problems))


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
    info = msg.content["device"] if "device" in msg.content else ConfigRecord()
    metrics = next(iter(msg.content.metric_records.values()), {})
    return RoundRow(run_id, server_round, phase, node, str(info.get("device-name", f"node-{node}")),
                    {k: v for k, v in metrics.items()}, str(info["schedule-id"]) if "schedule-id" in info else None)


def _device_for_node(node: int) -> str | None:
    data_dir = os.environ.get(DATA_DIR_VARIABLE)
    if not data_dir:
        return None
    from server.supernodes import device_for_node

    try:
        return device_for_node(ServerSettings(data_dir=Path(data_dir)), node)
    except ServerError:
        return None


class RecordingFedAvg(FedAvg):
    """Weighted FedAvg that records a row per device per round before aggregating (module docstring)."""

    def __init__(self, recorder: Recorder, run_id: int, **fedavg: Any) -> None:
        super().__init__(**fedavg)
        self.recorder, self.run_id = recorder, run_id
        self.sent: list[Message] = []  # this round's messages: the grid gives them their ids as it sends them

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self.sent = list(super().configure_train(server_round, arrays, config, grid))
        return self.sent

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        self.sent = list(super().configure_evaluate(server_round, arrays, config, grid))
        return self.sent

    def _record(self, phase: str, server_round: int, replies: list[Message]) -> None:
        rows = [reply_row(m, phase, server_round, self.run_id, self.sent) for m in replies]
        if rows:
            self.recorder(rows)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, Any]:
        replies = in_device_order(replies)
        self._record("train", server_round, replies)
        return super().aggregate_train(server_round, replies)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> Any:
        replies = in_device_order(replies)
        self._record("evaluate", server_round, replies)
        return super().aggregate_evaluate(server_round, replies)


def in_device_order(replies: Iterable[Message]) -> list[Message]:
    """``replies`` by device name, then node id: the weighted average sums in this order, so the same run gives
    the same global model bit for bit whichever device answered first (floating-point addition does not
    commute in its rounding)."""
    def key(msg: Message) -> tuple[str, int]:
        info = msg.content["device"] if not msg.has_error() and "device" in msg.content else ConfigRecord()
        return str(info.get("device-name", "")), int(msg.metadata.src_node_id)

    return sorted(replies, key=key)


def initial_arrays(grid: Grid, config: FederationConfig) -> tuple[ArrayRecord, str]:
    """Ask one device for the model's initial shared weights (``query.initial``); them and the model's identity
    (:func:`server.model_versions.model_identity`: its name and the weights' layout)."""
    nodes = sorted(grid.get_node_ids())
    if not nodes:
        raise ServerError("no device is connected: start SuperNodes (or agents) before the run")
    ask = Message(RecordDict({"config": ConfigRecord()}), dst_node_id=nodes[0], message_type="query.initial")
    replies = [m for m in grid.send_and_receive([ask], timeout=config.round_timeout) if not m.has_error()]
    if not replies or "arrays" not in replies[0].content:
        raise ServerError(f"node {nodes[0]} sent no initial weights: check its log (flwr log RUN_ID)")
    content = replies[0].content
    name = str(content["model"].get("name", "model")) if "model" in content else "model"
    arrays = content["arrays"]
    return arrays, model_identity(name, _numpy(arrays))


def personalize(grid: Grid, arrays: ArrayRecord, config: FederationConfig, recorder: Recorder,
                server_round: int, version: int | None = None) -> list[RoundRow]:
    """Phase 3: every device evaluates the global model (``version``, where stored) and fine-tunes it; their
    rows, recorded."""
    content = RecordDict({"arrays": arrays, "config": ConfigRecord({
        "finetune-steps": config.finetune_steps, "lr": config.lr, "local-baseline": config.local_baseline,
        "global-version": version if version is not None else -1})})
    asks = [Message(content, dst_node_id=node, message_type="train.personalize") for node in grid.get_node_ids()]
    replies = grid.send_and_receive(asks, timeout=config.round_timeout)
    rows = [reply_row(m, "personalize", server_round, grid.run.run_id, asks) for m in replies]
    if rows:
        recorder(rows)
    return rows


@dataclass(frozen=True)
class Federated:
    """What a run leaves: the final global weights and the version they were stored as (``None``: not stored)."""

    arrays: ArrayRecord
    version: int | None
    rounds: int


def run_federation(grid: Grid, config: FederationConfig, recorder: Recorder,
                   models: GlobalModels | None = None) -> Federated:
    """The whole run (module docstring): the starting weights, FedAvg rounds storing each round's global model
    in ``models``, personalization."""
    strategy = RecordingFedAvg(recorder, grid.run.run_id, fraction_train=config.fraction_train,
                               fraction_evaluate=config.fraction_evaluate, min_train_nodes=config.min_nodes,
                               min_evaluate_nodes=config.min_nodes if config.fraction_evaluate else 0,
                               min_available_nodes=config.min_nodes)
    arrays, model = initial_arrays(grid, config)
    version = None
    if models is not None:
        arrays, version = models.start(config.initial_version, model, arrays)
    train_config = ConfigRecord({"local-steps": config.local_steps, "lr": config.lr})
    last = config.first_round + config.rounds - 1
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
    return Federated(arrays, version, config.rounds)


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
    def for_config(cls, config: FederationConfig) -> GlobalModels | None:
        """The store the run config (``data-dir``, else ``$POET_EDGE_DATA_DIR``, and a database) names, or
        ``None`` when it names none."""
        data_dir = config.data_dir or os.environ.get(DATA_DIR_VARIABLE, "")
        if not data_dir or not config.database_url:
            return None
        settings = ServerSettings(data_dir=Path(data_dir))
        return cls(open_store(config.database_url), settings.data_dir, load_or_create(settings.keys_dir))

    def start(self, choice: str, model: str, initial: ArrayRecord) -> tuple[ArrayRecord, int | None]:
        """The weights a run starts from: ``initial`` (``choice`` ``none``, or ``latest`` with no version of
        this model stored yet), the newest version of ``model`` (``latest``), or version ``choice``."""
        if choice == "none":
            return initial, None
        key = self.key.private_key.public_key()
        try:
            if choice == "latest":
                info = version_info(self.database, model=model)
                if info is None:
                    return initial, None
                weights = checked_weights(info, self.data_dir, key)
            else:
                info, weights = load_version(self.database, self.data_dir, key, int(choice))
        except ModelVersionError as exc:
            raise ServerConfigError(f"{exc} (run config initial-version = \"none\" starts afresh)") from exc
        if info.model != model:
            raise ServerConfigError(f"global model version {info.version} is of {info.model!r}, but the devices "
                                    f"train {model!r}: name a version of their model, or initial-version = \"none\"")
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
    config = FederationConfig.from_run_config(context.run_config)
    run_federation(grid, config, store_recorder(config.database_url), GlobalModels.for_config(config))


def _flag(value: Any, key: str) -> bool:
    """A run-config boolean (TOML gives a bool; a string override ``true``/``false`` is taken too)."""
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("true", "false"):
        return str(value).strip().lower() == "true"
    raise ServerConfigError(f"run config {key} must be true or false, got {value!r}")
