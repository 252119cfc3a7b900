"""The fleet's Flower run configuration, typed: every key both apps read, its default, and its checks.

``server/federated/flwr_app/pyproject.toml`` declares these keys under ``[tool.flwr.app.config]``
(``flwr run --run-config`` overrides only declared keys); a test checks that the file
declares exactly :meth:`RunConfig.defaults`.  The ServerApp (:mod:`server.federated.serverapp`),
the ClientApp (:mod:`agent.federated.clientapp`), ``poet-edge server federate`` and ``poet-edge
simulate`` all read and write the run config through :class:`RunConfig`, so a key,
its default and its range live here only.

A key is its field's name with ``-`` for ``_`` (``num_server_rounds`` is
``num-server-rounds``).  Imports nothing but the standard library: the server
(no torch) and the device agent (no server) both import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from common.errors import RunConfigError

PERSONALIZATIONS = ("none", "finetune", "fedper", "fedbn", "ditto", "biases-norms")
"""What each device keeps or trains for itself after the rounds: nothing (``none``), the global model fine-tuned
locally (``finetune``), its own head (``fedper``), its own BatchNorm (``fedbn``), a whole personal model trained
beside the global one each round and held near it (``ditto``, with ``ditto-lambda``), or the global model with
only its biases and normalization layers fine-tuned locally (``biases-norms``: parameter-efficient, no gradients
or optimizer state for the other weights)."""

SIMULATION_ONLY = ("ditto", "biases-norms")
"""Strategies a simulated device runs but a device agent refuses (it plans for its own measured profile)."""

AVAILABILITY = ("always", "night")
"""When a simulated device may train a round: ``always``, or only while charging at night (22:00-07:00 in its own
time zone; the fleet's time zones spread evenly round the clock, and rounds are ``round-hours`` apart)."""


@dataclass(frozen=True)
class RunConfig:
    """The fleet app's run config; see the module docstring for how keys are named."""

    # the rounds (the ServerApp)
    num_server_rounds: int = 5
    first_round: int = 1  # the first round's number: a resubmitted run goes on from where one stopped
    fraction_train: float = 1.0  # of the connected devices, those sampled to train each round
    fraction_evaluate: float = 1.0
    min_nodes: int = 2  # the fewest devices a round samples (and waits for to connect)
    round_timeout: float = 600.0  # seconds
    local_steps: int = 10
    lr: float = 0.05
    personalization: str = "finetune"
    finetune_steps: int = 30
    ditto_lambda: float = 0.1  # ditto: how strongly the personal model is pulled towards the global one
    local_baseline: bool = False  # each device also trains alone from the initial weights, with the steps it spent
    seed: int = 0  # the model's initial weights, the data split, the devices sampled each round
    database_url: str = ""  # empty: the database of the server whose SuperLink runs the app
    data_dir: str = ""  # where global model versions go (empty: the server's data folder)
    initial_version: str = "latest"  # latest, none, or a version number
    # a simulation's virtual devices (agent.federated.virtual)
    device_classes: str = ""  # NAME=PROFILE:FRACTION,...
    dataset: str = ""  # a data set saved by Hugging Face datasets (agent.image_sets); empty: the shipped digits
    label_column: str = ""  # its label column (empty: its one ClassLabel column)
    partition_by: str = ""  # a column of natural ids, one device each (FEMNIST's writer_id); empty: split the pool
    samples: int = 0  # training digits per device (0: a whole partition of the pool); the mean with quantity-skew
    label_alpha: float = 0.0  # Dirichlet label skew (0: the natural mix)
    quantity_skew: float = 0.0  # spread of the devices' sample counts: sigma of a log-normal (0: all equal)
    viewpoints: float = 360.0  # the devices' angles spread over this many degrees
    viewpoint_centre: float = 0.0  # ... about this angle (0: upright, the vendor's view); below 360 only
    graph_file: str = ""  # the digits graph profiled once for the fleet (empty: each process extracts)
    tuning_graph_file: str = ""  # ... and with only the parts biases-norms fine-tunes trainable
    initial_weights: str = ""  # a weights file every virtual device starts from (a pretrained model); empty: seeded
    availability: str = "always"  # see AVAILABILITY
    round_hours: float = 1.0  # simulated hours from one round to the next (availability "night")
    dropout: float = 0.0  # chance that an available device is unplugged partway through a round
    straggle: float = 0.0  # chance that an available device finishes only part of its local steps in time

    @classmethod
    def keys(cls) -> frozenset[str]:
        """Every key's name."""
        return frozenset(_key(f.name) for f in fields(cls))

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every key with its default: what the app bundle declares."""
        return cls().to_mapping()

    def to_mapping(self) -> dict[str, Any]:
        """The run config as Flower holds it (``key-name: value``)."""
        return {_key(name): value for name, value in asdict(self).items()}

    @classmethod
    def from_mapping(cls, run: Mapping[str, Any]) -> RunConfig:
        """Read ``run`` (absent keys take their defaults), converting each value to its key's type; raise
        :class:`RunConfigError` naming every unknown key, wrong type and out-of-range value at once."""
        known = {_key(f.name): f for f in fields(cls)}
        problems = [f"unknown key {key!r}" for key in run if key not in known]
        values: dict[str, Any] = {}
        for key, field in known.items():
            if key in run:
                try:
                    values[field.name] = _converted(run[key], type(getattr(cls, field.name)))
                except (TypeError, ValueError):
                    problems.append(f"{key} must be {_TYPE_NAMES[type(getattr(cls, field.name))]}, got {run[key]!r}")
        if problems:
            raise RunConfigError("run config: " + "; ".join(problems))
        config = cls(**values)
        config.check()
        return config

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with ``changes`` (field names), checked."""
        changed = RunConfig(**{**asdict(self), **changes})
        changed.check()
        return changed

    def check(self) -> None:
        """Raise :class:`RunConfigError` listing every out-of-range setting."""
        problems = [text for bad, text in (
            (self.num_server_rounds < 0, "num-server-rounds must be 0 (personalization only) or more"),
            (self.first_round < 1, "first-round must be 1 or more"),
            (not 0 < self.fraction_train <= 1, "fraction-train must be in (0, 1]"),
            (not 0 <= self.fraction_evaluate <= 1, "fraction-evaluate must be in [0, 1]"),
            (self.min_nodes < 1, "min-nodes must be 1 or more"),
            (self.round_timeout <= 0, "round-timeout must be positive"),
            (self.local_steps < 1, "local-steps must be 1 or more"),
            (self.lr <= 0, "lr must be positive"),
            (self.personalization not in PERSONALIZATIONS,
             f"personalization must be one of {', '.join(PERSONALIZATIONS)}"),
            (self.finetune_steps < 0, "finetune-steps must be 0 or more"),
            (self.ditto_lambda < 0, "ditto-lambda must be 0 or more"),
            (not (self.initial_version in ("latest", "none") or self.initial_version.isdigit()),
             "initial-version must be latest, none or a version number"),
            (self.samples < 0, "samples must be 0 (a whole partition) or more"),
            (self.label_alpha < 0, "label-alpha must be 0 (the natural mix) or positive"),
            (self.quantity_skew < 0, "quantity-skew must be 0 (equal shares) or positive"),
            (self.quantity_skew > 0 and self.samples == 0, "quantity-skew needs samples (the mean per device)"),
            (not 0 <= self.viewpoints <= 360, "viewpoints must be in [0, 360] degrees"),
            (not -180 <= self.viewpoint_centre <= 180, "viewpoint-centre must be in [-180, 180] degrees"),
            (self.viewpoint_centre != 0 and self.viewpoints >= 360,
             "viewpoint-centre needs viewpoints under 360 (all the way round has no centre)"),
            (bool(self.partition_by) and not self.dataset, "partition-by needs a dataset (the digits have no ids)"),
            (bool(self.partition_by) and bool(self.samples or self.label_alpha or self.quantity_skew),
             "partition-by keeps each natural id's own data: leave samples, label-alpha and quantity-skew at 0"),
            (self.availability not in AVAILABILITY, f"availability must be one of {', '.join(AVAILABILITY)}"),
            (self.round_hours <= 0, "round-hours must be positive"),
            (not 0 <= self.dropout < 1, "dropout must be in [0, 1)"),
            (not 0 <= self.straggle <= 1, "straggle must be in [0, 1]"),
        ) if bad]
        if problems:
            raise RunConfigError("run config: " + "; ".join(problems))


_TYPE_NAMES = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}


def _key(field_name: str) -> str:
    """A field's run-config key: ``num_server_rounds`` is ``num-server-rounds``."""
    return field_name.replace("_", "-")


def _converted(value: Any, kind: type) -> Any:
    """``value`` as ``kind``; TOML and ``flwr run --run-config`` give typed values, overrides may give text."""
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text not in ("true", "false"):
            raise ValueError(value)
        return text == "true"
    if kind is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(value)
        return int(value)
    if kind is float:
        if isinstance(value, bool):
            raise ValueError(value)
        return float(value)
    return str(value).strip() if isinstance(value, str) else _text(value)


def _text(value: Any) -> str:
    if isinstance(value, (float, bool)):  # a whole number may stand for text: initial-version = 3
        raise ValueError(value)
    return str(value)
