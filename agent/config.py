"""The agent's configuration: one TOML file, validated at start with every problem reported at once.

``deploy/agent.example.toml`` documents every key.  :func:`load_config` reads
the file, fills defaults and raises :class:`ConfigError` listing all problems
(a wrong type, a missing path, an unknown key...) so an operator fixes the file
in one pass.  This module imports neither torch nor the planner: the waiting
daemon reads its config too.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from engine.energy.detect import MeterConfig
from agent.errors import ConfigError
from agent.monitors.quiet import parse_window
from agent.zoo_names import ZOO_INPUTS, chunked_loss_problems, model_problems
from agent.weight_files import is_pretrained_folder, problems as weights_problems
from common.units import parse_bytes

if TYPE_CHECKING:
    from agent.monitors.network import NetworkMonitor


OPTIMIZERS = ("sgd", "adam", "adamw")
ADAPTERS = ("none", "lora")  # workload.adapters (agent.adapters)


@dataclass(frozen=True)
class DeviceSection:
    """``[device]``: who this device is and where it keeps its files."""

    name: str = ""
    state_dir: Path = Path("/var/lib/poet-agent")
    swap_dir: Path | None = None  # default: state_dir / "swap"
    sysfs_root: Path = Path("/")


@dataclass(frozen=True)
class WorkloadSection:
    """``[workload]``: the model trained on this device."""

    model: str = ""
    input: str = ""
    seed: int = 0
    max_nodes: int | None = None
    threads: int | str = "all"  # torch compute threads while a window trains: "all" (every core) or a number
    profile_repeats: int = 5
    chunked_loss: bool = False  # language models: the next-token loss without all logits (not bit-identical)
    # pretrained weights to start from: a .safetensors/.pt state dict, or a save_pretrained folder (agent.weights)
    weights: Path | None = None
    adapters: str = "none"  # "lora": train LoRA adapters of the frozen model (agent.adapters), share only them
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = ()  # module names; empty: peft's defaults for a transformers architecture

    @property
    def compute_threads(self) -> int:
        """The thread count a window trains (and its profile is measured) with: ``threads``, or every core
        this process may run on."""
        return every_core() if self.threads == "all" else int(self.threads)


@dataclass(frozen=True)
class DataSection:
    """``[data]``: the device's own training data."""

    path: Path | None = None
    holdout: float = 0.1
    tokenizer: Path | None = None  # splits a .txt path into token ids: a tokenizer.json, or a save_pretrained folder


@dataclass(frozen=True)
class TrainingSection:
    """``[training]``: budget, optimizer and the rhythm of training windows."""

    memory_budget: int = 0
    runtime_budget: float | None = None
    steps_per_window: int = 100
    checkpoint_every: int = 25
    optimizer: str = "sgd"
    learning_rate: float = 0.01
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    accumulation: int = 1  # micro-batches per optimizer step (their gradients summed)
    clip_norm: float = 0.0  # clip gradients to this global norm; 0: no clipping
    step_cancel_seconds: float = 30.0
    window_gap_seconds: float = 0.0
    max_window_seconds: float = 0.0  # a window stops (with a checkpoint) after this long; 0: no cap
    backoff_seconds: float = 30.0
    nice: int = 10
    memory_tolerance: int = 8_000_000  # bytes a step's measured part may exceed its plan


@dataclass(frozen=True)
class ScheduleSection:
    """``[schedule]``: where the schedule comes from and whom to trust."""

    file: Path | None = None
    public_key: Path | None = None
    solve_time_limit: float = 60.0


@dataclass(frozen=True)
class EligibilitySection:
    """``[eligibility]``: when the device may train."""

    require_charging: bool = True
    min_battery_percent: float = 15.0  # battery not low, as JobScheduler's default condition
    min_free_storage: int = 200_000_000  # bytes free on the state and swap directories' disks
    max_foreground_cpu_percent: float = 20.0
    idle_seconds: float = 60.0
    cpu_hysteresis_percent: float = 5.0
    max_temperature_c: float = 70.0
    temperature_hysteresis_c: float = 5.0
    quiet_hours: str = ""
    start_jitter_seconds: float = 0.0  # up to this long after becoming eligible, a share fixed by the device name
    poll_seconds: float = 5.0
    training_poll_seconds: float = 0.5


@dataclass(frozen=True)
class NetworkSection:
    """``[network]``: which networks the fleet's traffic (heartbeats, schedules, federated rounds) may use
    (:mod:`agent.monitors.network`); training itself never waits for a network."""

    require_unmetered: bool = False
    allowed_interfaces: tuple[str, ...] = ()  # shell patterns ("wlan0", "eth*"); empty: any interface
    metered_interfaces: tuple[str, ...] = ("wwan*", "ppp*", "rmnet*", "usb*")  # without NetworkManager's word


@dataclass(frozen=True)
class MetricsSection:
    """``[metrics]``: an optional Prometheus endpoint."""

    prometheus: str = ""  # "127.0.0.1:9101"; empty: off


@dataclass(frozen=True)
class ServerSection:
    """``[server]``: the fleet server this device reports to and gets schedules from; no ``url``, no fleet."""

    url: str = ""  # "https://fleet.example:8080"
    enrolment_token: str = ""  # exchanged once for the device token (kept in state_dir/fleet/device-token)
    public_key: Path | None = None  # the server's pinned Ed25519 public key (PEM): required with url
    heartbeat_seconds: float = 30.0
    queue_limit: int = 1000  # heartbeats kept on disk while the server is unreachable (oldest dropped)
    timeout_seconds: float = 10.0
    ca_file: Path | None = None  # a private CA's certificate (PEM) for the server's TLS


@dataclass(frozen=True)
class FlowerSection:
    """``[flower]``: the Flower SuperNode the agent runs while the device is eligible (:mod:`agent.federated.supernode`)."""

    enabled: bool = False
    superlink: str = ""  # the fleet's SuperLink, HOST:PORT: "fleet.example:9092"
    root_certificates: Path | None = None  # the CA that signed the SuperLink's certificate (default: system CAs)
    auth: bool = True  # authenticate with auth_key (the SuperLink admits registered keys only); false: the
    # SuperNode registers itself with a fresh key each start (a SuperLink run with --no-flower-auth)
    auth_key: Path | None = None  # ECDSA P-384 OpenSSH private key; default state_dir/flower/supernode.key (made)
    runtime_port: int = 9094  # the SuperNode's local port for its ClientApps (127.0.0.1)
    warm_clientapps: bool = True  # fork each message's ClientApp ready-loaded (agent.federated.runner)


@dataclass(frozen=True)
class AgentConfig:
    """The whole config file, validated."""

    path: Path
    device: DeviceSection = field(default_factory=DeviceSection)
    workload: WorkloadSection = field(default_factory=WorkloadSection)
    data: DataSection = field(default_factory=DataSection)
    training: TrainingSection = field(default_factory=TrainingSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    eligibility: EligibilitySection = field(default_factory=EligibilitySection)
    network: NetworkSection = field(default_factory=NetworkSection)
    energy: MeterConfig = field(default_factory=MeterConfig)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    server: ServerSection = field(default_factory=ServerSection)
    flower: FlowerSection = field(default_factory=FlowerSection)

    @property
    def swap_dir(self) -> Path:
        """Where page files go: ``[device] swap_dir``, else ``state_dir/swap``."""
        return self.device.swap_dir or self.device.state_dir / "swap"

    @property
    def history_path(self) -> Path:
        """The record of past training windows (:mod:`agent.daemon.history`)."""
        return self.device.state_dir / "history.jsonl"

    def network_monitor(self) -> "NetworkMonitor":
        """The ``[network]`` condition on the fleet's traffic."""
        from agent.monitors.network import NetworkMonitor

        n = self.network
        return NetworkMonitor(require_unmetered=n.require_unmetered, allowed_interfaces=n.allowed_interfaces,
                              metered_interfaces=n.metered_interfaces, root=self.device.sysfs_root)

    @property
    def status_path(self) -> Path:
        """The daemon's status file, read by ``poet-edge agent status``."""
        return self.device.state_dir / "status.json"

    @property
    def fleet_dir(self) -> Path:
        """The fleet's files on the device: the device token, the heartbeat queue, downloaded schedules."""
        return self.device.state_dir / "fleet"

    @property
    def flower_dir(self) -> Path:
        """The SuperNode's files on the device: its key, its log, its ``FLWR_HOME``."""
        return self.device.state_dir / "flower"

    @property
    def supernode_key_path(self) -> Path:
        """The SuperNode's private key: ``[flower] auth_key``, else ``flower_dir/supernode.key``."""
        return self.flower.auth_key or self.flower_dir / "supernode.key"

    @property
    def device_token_path(self) -> Path:
        """This device's token from the fleet server (mode 0600), written at enrolment."""
        return self.fleet_dir / "device-token"


_SECTIONS: dict[str, type] = {
    "device": DeviceSection, "workload": WorkloadSection, "data": DataSection, "training": TrainingSection,
    "schedule": ScheduleSection, "eligibility": EligibilitySection, "network": NetworkSection,
    "energy": MeterConfig, "metrics": MetricsSection,
    "server": ServerSection, "flower": FlowerSection,
}
_PATHS = {"state_dir", "swap_dir", "sysfs_root", "path", "file", "public_key", "ca_file", "root_certificates",
          "auth_key", "tokenizer", "weights"}
_SIZES = {"memory_budget", "memory_tolerance", "min_free_storage"}
_PATTERNS = {"allowed_interfaces", "metered_interfaces"}  # lists of shell patterns
_RENAMED = {("training", "memory_slack"): "training.memory_slack was replaced by training.memory_tolerance: bytes a "
            "step's measured memory may exceed its plan, the same for any model (e.g. \"8MB\")"}


def load_config(path: str | Path) -> AgentConfig:
    """Read and validate the TOML file at ``path``; raises :class:`ConfigError` with every problem found."""
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file (start from deploy/agent.example.toml)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    problems: list[str] = []
    sections: dict[str, Any] = {}
    for name in document:
        if name not in _SECTIONS:
            problems.append(f"unknown section [{name}] (sections: {', '.join(_SECTIONS)})")
    for name, cls in _SECTIONS.items():
        table = document.get(name, {})
        if not isinstance(table, dict):
            problems.append(f"[{name}] must be a table")
            table = {}
        sections[name] = _section(name, cls, table, path.parent, problems)
    config = AgentConfig(path=path, **sections)
    problems += _check(config)
    if problems:
        raise ConfigError(f"{path}: {len(problems)} problem{'s' if len(problems) > 1 else ''}:\n  "
                          + "\n  ".join(problems))
    return config


def _section(name: str, cls: type, table: dict[str, Any], base: Path, problems: list[str]) -> Any:
    """Build one section's dataclass from its table, converting paths and sizes; defaults where absent."""
    known = {f.name: f for f in fields(cls)}
    values: dict[str, Any] = {}
    for key, value in table.items():
        # the energy section names its meter "kind" in the dataclass and "meter" in the file
        attr = "kind" if (name, key) == ("energy", "meter") else key
        if (name, key) in _RENAMED:
            problems.append(_RENAMED[name, key])
            continue
        if attr not in known:
            problems.append(f"{name}.{key}: unknown key (keys: {', '.join(sorted(known))})")
            continue
        converted = _convert(f"{name}.{key}", attr, value, known[attr].default, base, problems)
        if converted is not _INVALID:
            values[attr] = converted
    return cls(**values)


_INVALID = object()


def every_core() -> int:
    """The cores this process may run on (its CPU affinity: a cgroup or ``taskset`` may allow fewer than exist)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _convert(label: str, attr: str, value: Any, default: Any, base: Path, problems: list[str]) -> Any:
    if attr == "threads":
        if value == "all" or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        problems.append(f'{label} must be "all" (every core) or a whole number of threads, not {value!r}')
        return _INVALID
    if attr == "lora_targets":
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            problems.append(f"{label} must be a list of module names, such as [\"q_proj\", \"v_proj\"]")
            return _INVALID
        return tuple(v.strip() for v in value)
    if attr in _PATTERNS:
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            problems.append(f"{label} must be a list of interface names or patterns, such as [\"wlan0\", \"eth*\"]")
            return _INVALID
        return tuple(v.strip() for v in value)
    if attr in _PATHS:
        if not isinstance(value, str) or not value:
            problems.append(f"{label} must be a path string, not {value!r}")
            return _INVALID
        return (base / value) if not Path(value).is_absolute() else Path(value)
    if attr in _SIZES:
        try:
            return parse_bytes(value)
        except (ValueError, TypeError) as exc:
            problems.append(f"{label}: {exc}")
            return _INVALID
    if isinstance(default, bool):
        if not isinstance(value, bool):
            problems.append(f"{label} must be true or false, not {value!r}")
            return _INVALID
        return value
    if isinstance(default, int) and not isinstance(default, bool) or attr in {"max_nodes"}:
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{label} must be a whole number, not {value!r}")
            return _INVALID
        return value
    if isinstance(default, float) or attr in {"runtime_budget", "interval_s"}:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{label} must be a number, not {value!r}")
            return _INVALID
        return float(value)
    if not isinstance(value, str):
        problems.append(f"{label} must be a string, not {value!r}")
        return _INVALID
    return value


def _check(c: AgentConfig) -> list[str]:
    """Problems between and within values that the types alone do not catch."""
    found: list[str] = []
    positive = {
        "workload.threads": c.workload.compute_threads, "workload.profile_repeats": c.workload.profile_repeats,
        "training.steps_per_window": c.training.steps_per_window,
        "training.checkpoint_every": c.training.checkpoint_every,
        "training.learning_rate": c.training.learning_rate,
        "training.step_cancel_seconds": c.training.step_cancel_seconds,
        "training.backoff_seconds": c.training.backoff_seconds,
        "schedule.solve_time_limit": c.schedule.solve_time_limit,
        "eligibility.poll_seconds": c.eligibility.poll_seconds,
        "eligibility.training_poll_seconds": c.eligibility.training_poll_seconds,
    }
    found += [f"{key} must be positive" for key, value in positive.items() if value <= 0]
    if c.eligibility.start_jitter_seconds < 0:
        found.append("eligibility.start_jitter_seconds must be >= 0 (0: start as soon as eligible)")
    if c.eligibility.idle_seconds < 0:
        found.append("eligibility.idle_seconds must be >= 0 (0: eligible as soon as the other conditions hold)")
    supplies = c.device.sysfs_root / "sys" / "class" / "power_supply"
    # else a mistyped root reads as "no battery" and trains on a discharging one; without the charging
    # condition (a mains-powered device, which may have no power supply class at all) nothing depends on it
    if c.eligibility.require_charging and not supplies.is_dir():
        found.append(f"device.sysfs_root = {str(c.device.sysfs_root)!r}: it has no sys/class/power_supply, so the "
                     "agent could not tell whether the device is charging; leave it out to read this machine's "
                     "(\"/\"), or set eligibility.require_charging = false for a mains-powered device")
    if not c.device.name:
        found.append("device.name is required (how the fleet knows this device)")
    if c.workload.weights is not None:
        found += weights_problems(c.workload.weights)
    from_folder = c.workload.weights is not None and is_pretrained_folder(c.workload.weights)
    if not c.workload.model and not from_folder:
        found.append(f"workload.model is required: a zoo name ({', '.join(ZOO_INPUTS)}), package.module:factory, "
                     "or left out with workload.weights a save_pretrained folder")
    if from_folder and not c.workload.model and not c.workload.input:
        found.append("workload.input is required with a pretrained folder: batch x sequence for a language model "
                     "(e.g. 8x128), else the batch shape the model takes")
    if c.workload.input and not re.fullmatch(r"\d+(x\d+)*", c.workload.input.lower()):
        found.append(f"workload.input = {c.workload.input!r}: expected a batch shape such as 8x3x32x32")
    elif c.workload.model:
        found += model_problems(c.workload.model, c.workload.input)
        found += chunked_loss_problems(c.workload.model, c.workload.chunked_loss)
    if c.workload.adapters not in ADAPTERS:
        found.append(f"workload.adapters = {c.workload.adapters!r}: one of {', '.join(ADAPTERS)}")
    if c.workload.lora_rank < 1:
        found.append("workload.lora_rank must be at least 1")
    if c.workload.lora_alpha <= 0:
        found.append("workload.lora_alpha must be positive")
    if not 0 <= c.workload.lora_dropout < 1:
        found.append("workload.lora_dropout must be in [0, 1)")
    if c.workload.max_nodes is not None and c.workload.max_nodes < 2:
        found.append("workload.max_nodes must be at least 2")
    found += _data_problems(c)
    if c.training.memory_budget <= 0:
        found.append("training.memory_budget is required: what a training step may use beyond the loaded model "
                     "(activations, gradients, optimizer state), e.g. \"60MB\"")
    if c.training.runtime_budget is not None and c.training.runtime_budget < 1:
        found.append("training.runtime_budget is a factor of the plain step time, at least 1 (e.g. 1.3)")
    if c.training.optimizer not in OPTIMIZERS:
        found.append(f"training.optimizer = {c.training.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
    if not 0 <= c.training.momentum < 1:
        found.append("training.momentum must be in [0, 1)")
    if c.training.nesterov and (c.training.optimizer != "sgd" or c.training.momentum <= 0):
        found.append("training.nesterov needs optimizer = \"sgd\" and a momentum above 0")
    if c.training.accumulation < 1:
        found.append("training.accumulation is micro-batches per step: at least 1")
    if c.training.clip_norm < 0:
        found.append("training.clip_norm must be >= 0 (0: no clipping)")
    if c.training.weight_decay < 0:
        found.append("training.weight_decay must be >= 0")
    if not 0 <= c.training.nice <= 19:
        found.append("training.nice must be in 0..19")
    if c.training.memory_tolerance < 0:
        found.append("training.memory_tolerance must be >= 0 bytes")
    if c.training.window_gap_seconds < 0:
        found.append("training.window_gap_seconds must be >= 0")
    if c.training.max_window_seconds < 0:
        found.append("training.max_window_seconds must be >= 0 (0: no cap)")
    if c.eligibility.min_free_storage < 0:
        found.append("eligibility.min_free_storage must be >= 0 bytes (0: no check)")
    for key, p in (("schedule.file", c.schedule.file), ("schedule.public_key", c.schedule.public_key)):
        if p is not None and not p.is_file():
            found.append(f"{key} = {str(p)!r}: no such file")
    if c.schedule.file is not None and c.schedule.public_key is None:
        found.append("schedule.file needs schedule.public_key: the agent runs only schedules signed by a key "
                     "it trusts (make one with `poet-edge keys`, sign with `poet-edge solve --sign`)")
    if not 0 <= c.eligibility.min_battery_percent <= 100:
        found.append("eligibility.min_battery_percent must be in 0..100")
    if not 0 < c.eligibility.max_foreground_cpu_percent <= 100:
        found.append("eligibility.max_foreground_cpu_percent must be in (0, 100]")
    if c.eligibility.cpu_hysteresis_percent < 0 or c.eligibility.temperature_hysteresis_c < 0:
        found.append("eligibility hysteresis values must be >= 0")
    if c.eligibility.quiet_hours:
        try:
            parse_window(c.eligibility.quiet_hours)
        except ValueError as exc:
            found.append(f"eligibility.quiet_hours: {exc}")
    if c.metrics.prometheus and not re.fullmatch(r"[\w.\-\[\]:]+:\d{1,5}", c.metrics.prometheus):
        found.append(f"metrics.prometheus = {c.metrics.prometheus!r}: expected HOST:PORT, e.g. 127.0.0.1:9101")
    found += c.energy.problems()
    found += _server_problems(c)
    found += _flower_problems(c)
    return found


def _data_problems(c: AgentConfig) -> list[str]:
    """``[data]``: the path, the holdout, and a tokenizer for text."""
    d = c.data
    found = []
    if d.path is None:
        found.append("data.path is required: a folder of class subfolders of images, a .npz, .pt or .csv file, "
                     "or token ids for a language model (a .npy file, or a .txt file with data.tokenizer)")
    elif d.path.suffix.lower() == ".txt" and d.tokenizer is None:
        found.append(f"data.path = {str(d.path)!r} is text: set data.tokenizer to the tokenizer that splits it into "
                     "the model's token ids (a tokenizer.json file, or a folder written by save_pretrained)")
    if d.tokenizer is not None and not d.tokenizer.exists():
        found.append(f"data.tokenizer = {str(d.tokenizer)!r}: no such file or folder")
    if not 0 <= d.holdout < 1:
        found.append(f"data.holdout must be in [0, 1), not {d.holdout}")
    return found


def _flower_problems(c: AgentConfig) -> list[str]:
    """``[flower]``: checked only when enabled."""
    f = c.flower
    if not f.enabled:
        return []
    found = []
    if not re.fullmatch(r"[\w.\-]+:\d{1,5}|\[[0-9a-fA-F:.]+\]:\d{1,5}", f.superlink):
        found.append(f"flower.superlink = {f.superlink!r}: expected the SuperLink's HOST:PORT, e.g. "
                     "fleet.example:9092 (no https://)")
    if not 1 <= f.runtime_port <= 65535:
        found.append(f"flower.runtime_port must be in 1..65535, not {f.runtime_port}")
    if f.root_certificates is not None and not f.root_certificates.is_file():
        found.append(f"flower.root_certificates = {str(f.root_certificates)!r}: no such file")
    key = c.supernode_key_path
    if key.exists() and not key.is_file():
        found.append(f"flower.auth_key = {str(key)!r}: not a file")
    elif f.auth_key is not None and not key.exists() and not key.parent.is_dir():
        found.append(f"flower.auth_key = {str(key)!r}: its folder does not exist (the agent makes the key there)")
    return found


def _server_problems(c: AgentConfig) -> list[str]:
    """``[server]``: checked only with a url (without one the device is outside any fleet)."""
    s = c.server
    found = [f"server.{key} must be positive" for key, value in (
        ("heartbeat_seconds", s.heartbeat_seconds), ("timeout_seconds", s.timeout_seconds),
        ("queue_limit", s.queue_limit)) if value <= 0]
    if not s.url:
        return found
    if not _valid_url(s.url):
        found.append(f"server.url = {s.url!r}: expected http(s)://HOST[:PORT][/PATH], e.g. https://fleet.example:8080")
    if s.public_key is None:
        found.append("server.url needs server.public_key: the fleet server's Ed25519 public key (PEM), copied to "
                     "the device by the operator; the agent never trusts a key it got over the network")
    for key, p in (("server.public_key", s.public_key), ("server.ca_file", s.ca_file)):
        if p is not None and not p.is_file():
            found.append(f"{key} = {str(p)!r}: no such file")
    if not s.enrolment_token and not c.device_token_path.is_file():
        found.append("server.enrolment_token is required until this device has enrolled: ask the operator for "
                     "one (`poet-edge server enrol-token`)")
    return found


def _valid_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # raises ValueError for a port that is not a number in 0..65535
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and not parts.query and not parts.fragment
