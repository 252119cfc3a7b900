"""Run one simulated federation: the fleet's run config, Flower's simulation engine, the rows read back."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent.federated.virtual import FleetData
from common.runconfig import RunConfig
from common.errors import CommandError
from simulation.profile import profile_once
from simulation.fleet import DEFAULT_CLASSES, DEFAULT_DATA, DeviceClass, classes_config, fleet_node_configs
from simulation.report import SimulationReport, build_report


@dataclass(frozen=True)
class SimulationSettings:
    """What ``poet-edge simulate`` runs: the fleet, and the run config both apps read."""

    devices: int = 20
    classes: tuple[DeviceClass, ...] = DEFAULT_CLASSES
    rounds: int = 5
    local_steps: int = 10
    finetune_steps: int = 30
    lr: float = 0.05
    personalization: str = "finetune"
    data: FleetData = DEFAULT_DATA
    seed: int = 0
    database_url: str = ""  # empty: a temporary SQLite database
    cpus_per_device: int = 1  # Ray's client-resources-num-cpus: devices training at once = cores / this
    fraction: float = 1.0  # of the devices, those sampled to train (and evaluate) each round
    min_devices: int = 2  # the fewest a round samples
    availability: str = "always"  # common.runconfig.AVAILABILITY
    round_hours: float = 1.0
    dropout: float = 0.0
    straggle: float = 0.0
    local_baseline: bool = True  # every device also trains alone: the baseline personalization must beat
    ditto_lambda: float = 0.1
    initial_weights: str = ""  # a weights file every device starts from (agent.vendor); empty: seeded

    def run_config(self, database_url: str, graph_file: str = "", tuning_graph_file: str = "") -> dict[str, Any]:
        """The run config both apps read (:class:`common.runconfig.RunConfig`)."""
        return RunConfig(
            num_server_rounds=self.rounds, fraction_train=self.fraction, fraction_evaluate=self.fraction,
            min_nodes=min(self.min_devices, self.devices), local_steps=self.local_steps, lr=self.lr,
            personalization=self.personalization, finetune_steps=self.finetune_steps, seed=self.seed,
            ditto_lambda=self.ditto_lambda,
            database_url=database_url, device_classes=classes_config(self.classes), **self.data.run_config(),
            initial_version="none",  # each simulation from the devices' initial weights
            local_baseline=self.local_baseline, graph_file=graph_file, tuning_graph_file=tuning_graph_file,
            initial_weights=self.initial_weights,
            availability=self.availability,
            round_hours=self.round_hours, dropout=self.dropout, straggle=self.straggle).to_mapping()


def simulate(settings: SimulationSettings) -> SimulationReport:
    """Run the federation on ``settings.devices`` virtual devices in Flower's simulation engine; report what
    the server stored."""
    from server.federated.rounds import open_store, round_rows
    from agent.personalization import strategy
    from simulation.engine import run_on_engine

    nodes = fleet_node_configs(settings.devices, settings.classes)
    with tempfile.TemporaryDirectory(prefix="poet-simulate-") as scratch:
        url = settings.database_url or f"sqlite:///{Path(scratch) / 'rounds.db'}"
        open_store(url).dispose()  # migrated before the ServerApp writes, so a bad URL fails here
        model = {"dataset": settings.data.dataset, "label_column": settings.data.label_column}
        graph = profile_once(settings.seed, **model)
        tuning = settings.personalization if strategy(settings.personalization).partial_tuning else ""
        tuning_graph = str(profile_once(settings.seed, tuning=tuning, **model)) if tuning else ""
        started = time.time()
        try:
            run_id = run_on_engine(settings.run_config(url, str(graph), tuning_graph), settings.devices,
                                   settings.cpus_per_device, Path(scratch))
            finished = time.time()
            database = open_store(url)
            rows = round_rows(database, run_id, limit=100_000)
            database.dispose()
            _check_every_device_answered(rows, nodes)
        except Exception:  # the scratch folder goes: its logs are what explains the failure
            kept = _keep_logs(Path(scratch))
            if kept is not None:
                print(f"simulate: the run's logs are kept in {kept}", file=sys.stderr)
            raise
    info = {**asdict(settings), "classes": [asdict(c) for c in settings.classes], "run_id": run_id}
    return build_report(rows, nodes, info, started, finished)


def _check_every_device_answered(rows: list[Any], nodes: list[dict[str, Any]]) -> None:
    """Every device must personalize (or, in a run without personalization, answer at least once): name each
    that did not with the reason its replies gave (an infeasible budget names the smallest feasible one),
    rather than report a partial fleet as whole.  A device absent from a round (availability, drop-out) is not
    a failure."""
    final = [r for r in rows if r.phase == "personalize"]
    answered = {r.device_name for r in (final or rows) if "error" not in r.metrics}
    failed = sorted({n["device-name"] for n in nodes} - answered)
    if failed:
        errors = [str(r.metrics["error"]) for r in rows if "error" in r.metrics]

        def reason(name: str) -> str:  # an error reply names its device only in its text (agent.federated.clientapp._device)
            return next((e for e in reversed(errors) if f"{name}:" in e), "no reply at all")

        named = "; ".join(f"{name}: {reason(name)}" for name in failed[:3])
        raise CommandError(f"{len(failed)} of {len(nodes)} devices failed ({named}"
                           + (f"; and {len(failed) - 3} more" if len(failed) > 3 else "") + ")")


def _keep_logs(scratch: Path) -> Path | None:
    """Copy the run's log files out of ``scratch`` into a folder that stays; None when there were none."""
    logs = [p for p in scratch.rglob("*.log") if p.is_file()]
    if not logs:
        return None
    kept = Path(tempfile.mkdtemp(prefix="poet-simulate-logs-"))
    for log in logs:
        target = kept / log.relative_to(scratch)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(log, target)
    return kept
