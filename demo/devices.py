"""A device for the agent's tests and benchmark: a fake sysfs tree (the outside world), a config, and a real
``poet-edge agent run`` process to start, watch and stop."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]  # on PYTHONPATH: a factory may live in the repository's tests


class FakeDevice:
    """A sysfs tree with a mains charger and a battery, and a CPU thermal zone, under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.supplies = root / "sys/class/power_supply"
        self.plug()
        self.temperature(45.0)

    def _write(self, directory: Path, **files: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for name, value in files.items():
            (directory / name).write_text(f"{value}\n")

    def plug(self) -> None:
        self._write(self.supplies / "AC", type="Mains", online="1")
        self._write(self.supplies / "BAT0", type="Battery", status="Charging", capacity="80")

    def unplug(self) -> None:
        self._write(self.supplies / "AC", type="Mains", online="0")
        self._write(self.supplies / "BAT0", type="Battery", status="Discharging", capacity="43")

    def temperature(self, celsius: float) -> None:
        self._write(self.root / "sys/class/thermal/thermal_zone0", type="cpu-thermal", temp=str(int(celsius * 1000)))


def write_config(directory: Path, device: FakeDevice, data: Path, model: str, input: str, **overrides: Any) -> Path:
    """An agent config for this fake device, training ``model`` at batch shape ``input`` on ``data``;
    ``section_key=value`` overrides a key (``training_steps_per_window=5``), ``None`` removes it."""
    sections: dict[str, dict[str, Any]] = {
        "device": {"name": "test-device", "state_dir": str(directory / "state"), "swap_dir": str(directory / "swap"),
                   "sysfs_root": str(device.root)},
        "workload": {"model": model, "input": input, "seed": 3, "threads": 1, "profile_repeats": 1},
        "data": {"path": str(data), "holdout": 0.2},
        "training": {"memory_budget": "16MB", "steps_per_window": 40, "checkpoint_every": 5, "optimizer": "sgd",
                     "learning_rate": 0.05, "momentum": 0.9, "backoff_seconds": 1, "window_gap_seconds": 3600,
                     "step_cancel_seconds": 5},
        "schedule": {"solve_time_limit": 20},
        "eligibility": {"max_foreground_cpu_percent": 100, "idle_seconds": 0, "poll_seconds": 0.2,
                        "training_poll_seconds": 0.1},
        "energy": {"meter": "estimate"},
    }
    for key, value in overrides.items():
        section, _, name = key.partition("_")
        if value is None:
            sections[section].pop(name, None)
        else:
            sections.setdefault(section, {})[name] = value
    text = "\n".join(f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in table.items())
                     for name, table in sections.items())
    path = directory / "agent.toml"
    path.write_text(text)
    return path


def _toml(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, bool) else str(value).lower()


def copy_prepared(template_state: Path, state: Path) -> None:
    """Reuse a profile made once for the whole module (profiling is per device and workload, not per test)."""
    if (template_state / "prepared").is_dir():
        shutil.copytree(template_state / "prepared", state / "prepared", dirs_exist_ok=True)


def agent_command(*args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from common.cli import main; sys.exit(main())", *args]


def start_agent(config: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``poet-edge agent run --config`` in its own process group (so a kill reaches its worker too)."""
    environment = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.Popen(agent_command("agent", "run", "--config", str(config)), env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True)


def read_status(config_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((config_dir / "state/status.json").read_text())
    except (OSError, ValueError):
        return {}


def poll_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.2) -> Any:
    """Call ``predicate()`` every ``interval`` s until it is truthy; its value, or ``None`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, process: subprocess.Popen | None = None,
             interval: float = 0.05) -> Any:
    """Poll until ``predicate()`` is truthy; fail with the agent's output when it never is."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the agent exited ({process.returncode}) before {what}:\n{process.stdout.read()}")
        time.sleep(interval)
    output = ""
    if process is not None:
        stop(process)
        output = process.stdout.read()
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{output}")


def stop(process: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
    """Signal the agent (the whole group for SIGKILL, as systemd's KillMode=mixed does at the end)."""
    if process.poll() is None:
        if sig == signal.SIGKILL:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.send_signal(sig)
    return process.wait(timeout)
