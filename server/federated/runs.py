"""Federated runs on a SuperLink, driven with Flower's ``flwr`` program: submit the app, follow it to its end.

The app is ``server/federated/flwr_app`` (:data:`APP_DIR`, shipped as package data): only a
``pyproject.toml`` whose components are the installed ``server.federated.serverapp:app`` and
``agent.federated.clientapp:app`` and whose ``[tool.flwr.app.config]`` declares every run-config
key either app reads (``flwr run --run-config`` overrides only declared keys).  The
bundle carries no code, so the SuperLink installs nothing.  ``poet-edge server
federate`` runs it on the fleet's SuperLink, ``poet-edge simulate`` on a SuperLink in
simulation mode (:mod:`simulation.engine`).  Flower is a program here, never imported.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from server.errors import FlowerError
from server.federated.superlink import CONNECTION, flower_binary, flower_environment

APP_DIR = Path(__file__).resolve().parent / "flwr_app"
POLL_SECONDS = 1.0
UNREACHABLE_GRACE = 60.0


def toml_value(value: Any) -> str:
    """``value`` as a TOML literal (bool, int, float, str: JSON's string escapes are TOML's)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


def start_run(home: Path, run_config: dict[str, Any], *extra: str) -> int:
    """``flwr run APP poet-edge`` with ``run_config`` (written beside ``home``) and ``extra`` arguments; the run id."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", prefix="run-config-", dir=home.parent,
                                     encoding="utf-8") as overrides:
        overrides.write("".join(f"{k} = {toml_value(v)}\n" for k, v in run_config.items()))
        overrides.flush()
        answer = flwr(home, "run", str(APP_DIR), CONNECTION, "--run-config", overrides.name, *extra)
    if not answer.get("success"):
        raise FlowerError(f"flwr run refused the run: {answer.get('error-message', answer)}")
    return int(answer["run-id"])


def wait_finished(home: Path, run_id: int, timeout: float) -> None:
    """Poll the run's status until it has finished; raise unless it completed.  A SuperLink that stops
    answering is waited for :data:`UNREACHABLE_GRACE` seconds (its supervisor restarts it within seconds)."""
    deadline = time.monotonic() + timeout
    status, unreachable_since = "", None
    while time.monotonic() < deadline:
        try:
            runs = _answered(flwr(home, "list", CONNECTION, "--run-id", str(run_id))).get("runs", [])
            unreachable_since = None
        except FlowerError:
            unreachable_since = unreachable_since or time.monotonic()
            if time.monotonic() - unreachable_since > UNREACHABLE_GRACE:
                raise
            runs = []
        status = str(runs[0].get("status", "")) if runs else ""
        if status.startswith("finished"):
            break
        time.sleep(POLL_SECONDS)
    if status == "finished:completed":
        return
    tail = log_tail(home, run_id)
    raise FlowerError(f"run {run_id} ended {status or 'unfinished'} "
                       f"({'timed out after %g s' % timeout if not status.startswith('finished') else 'see below'})"
                       f"; its log ends:\n{tail}")


def wait_reachable(home: Path, grace: float = UNREACHABLE_GRACE) -> None:
    """Return once the SuperLink answers ``flwr list``; raise :class:`FlowerError` after ``grace`` seconds."""
    deadline = time.monotonic() + grace
    while True:
        try:
            _answered(flwr(home, "list", CONNECTION))
            return
        except FlowerError:
            if time.monotonic() > deadline:
                raise
            time.sleep(POLL_SECONDS)


def _answered(answer: dict[str, Any]) -> dict[str, Any]:
    if answer.get("success") is False:
        raise FlowerError(f"the SuperLink did not answer: {answer.get('error-message', answer)}")
    return answer


def flwr(home: Path, *arguments: str) -> dict[str, Any]:
    """``flwr ARGUMENTS --format json`` with ``FLWR_HOME=home``; its JSON answer."""
    command = [str(flower_binary("flwr")), *arguments, "--format", "json"]
    try:
        done = subprocess.run(command, env=flower_environment(home), capture_output=True, text=True, timeout=120)
        return dict(json.loads(done.stdout))
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        raise FlowerError(f"{' '.join(command[:2])} failed: {exc}") from exc


def log_tail(home: Path, run_id: int, lines: int = 40) -> str:
    """The last lines of the run's log (``flwr log ID --show``), or why there are none."""
    command = [str(flower_binary("flwr")), "log", str(run_id), CONNECTION, "--show"]
    try:
        done = subprocess.run(command, env=flower_environment(home), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(no log: {exc})"
    return "\n".join((done.stdout + done.stderr).strip().splitlines()[-lines:])


