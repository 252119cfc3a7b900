"""The agent's status: one JSON object the daemon keeps in ``state_dir/status.json``.

``poet-edge agent status`` prints it; the reporter seam sends it to the fleet.
The keys ``state``, ``reason`` and ``steps_done`` are stable; the others are
documented in :data:`FIELDS`.  The file is replaced atomically (written beside
it, then renamed), so a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

STATES = ("waiting", "preparing", "training", "backing off", "stopped")

FIELDS: dict[str, str] = {
    "state": "one of waiting, preparing, training, backing off, stopped",
    "reason": "why, in words a person reads",
    "steps_done": "training steps done on this device for this workload (those past steps_saved are lost if "
                  "training fails before the next checkpoint)",
    "steps_saved": "training steps the newest checkpoint holds: what survives a crash (null before a window "
                   "restored one)",
    "since": "Unix time the state began",
    "device": "the configured device name",
    "pid": "the daemon's process id",
    "updated": "Unix time of this status",
    "eligible": "whether the device may train now",
    "eligibility": "each monitor's verdict: name, eligible, reason",
    "power_source": "mains, usb, battery... (null where the kernel does not say)",
    "charging": "on external power, or no battery at all",
    "battery_percent": "the lowest battery's charge (null with no battery)",
    "under_voltage": "a Raspberry Pi's supply is too weak now (null where vcgencmd is absent)",
    "temperature_c": "the hottest thermal zone, degrees Celsius (null with no sensor)",
    "cpu_load": "foreground CPU percent, the agent's own niced work left out",
    "loss": "loss of the last step",
    "holdout_loss": "loss on the held-out data after the last window",
    "holdout_accuracy": "accuracy on the held-out data after the last window (null for regression)",
    "kept_model": "the model the last personalization kept: global, personal or local (null before any)",
    "kept_accuracy": "its accuracy on the held-out half the choice never saw",
    "kept_margin_global": "kept minus the global model's accuracy there (a share: 0.05 is 5 points)",
    "kept_margin_local": "kept minus the local-only model's, where the run trained one",
    "schedule_id": "the schedule in use",
    "schedule_from": "where it came from (cache, schedule file, local solve)",
    "memory_budget_bytes": "the schedule's memory budget: what a step may use beyond the loaded model",
    "peak_bytes": "the last step's memory: its peak RSS beyond the process with the model loaded",
    "bound_bytes": "what that may reach: the budget + training.memory_tolerance",
    "memory_parts": "the last step's measured peak of each part: activations, gradients, optimizer state",
    "planned_parts": "what the schedule planned for each part (runtime included)",
    "rss_baseline_bytes": "the training process's RSS with the model loaded (the daemon kills it far above this "
                          "plus the bound)",
    "energy_j": "joules of the steps this daemon ran, from the energy meter (an estimate where there is none)",
    "energy_source": "which meter measured energy_j",
    "data": "the local data set in words, skipped samples included",
    "samples_skipped": "unreadable or malformed samples skipped",
    "last_error": "the last error's message, or null",
    "storage_free_bytes": "free bytes on the fullest disk of the state and swap directories (null without the "
                          "storage check)",
    "checkpoints_passed_over": "damaged checkpoints the last window passed over to resume from an older one "
                               "(each renamed aside to NAME.damaged), or null",
    "step_seconds": "how long the last step took",
    "last_checkpoint_seconds": "how long the last checkpoint took",
    "network": "the [network] condition on the fleet's traffic: the interface in use and whether it may be used",
    "supernode": "the Flower SuperNode: running, stopped (and why) or refused by the SuperLink (null without "
                 "[flower])",
    "last_stop_after_step_seconds": "from the end of the last step to the training process's stop (checkpoint "
                                    "included), the last time training stopped",
}


def initial_status(device: str) -> dict[str, Any]:
    """Every field present, as before anything has happened."""
    status: dict[str, Any] = {key: None for key in FIELDS}
    status.update(state="waiting", reason="starting", steps_done=0, since=time.time(), device=device,
                  pid=os.getpid(), eligible=False, eligibility=[], energy_j=0.0)
    return status


def unsaved_steps(status: dict[str, Any]) -> int:
    """Steps trained since the newest checkpoint: lost if training fails before the next one (0 before a window
    restored one)."""
    saved = status.get("steps_saved")
    return max(0, (status.get("steps_done") or 0) - saved) if saved is not None else 0


def write_status(path: Path, status: dict[str, Any]) -> None:
    """Replace the status file atomically."""
    status["updated"] = time.time()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(status, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def read_status(path: Path) -> dict[str, Any] | None:
    """The last status the daemon wrote, marked ``stopped`` when its process is gone; ``None`` if none."""
    try:
        status = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None
    if not isinstance(status, dict):
        return None
    if status.get("state") != "stopped" and not _alive(status.get("pid")):
        status["reason"] = f"the agent is not running (it was {status.get('state')}: {status.get('reason')})"
        status["state"] = "stopped"
    return status


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: the daemon runs as its own user
    return True
