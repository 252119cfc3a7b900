"""Flower's simulation engine, driven as programs: a SuperLink in simulation mode, ``flwr run``, ``flwr list``.

:func:`run_on_engine` runs the Flower app in ``simulation/flwr_app`` (shipped as
package data, so it works from an installed package; it holds only a
``pyproject.toml`` whose components are the installed ``server.flower:app``
and ``agent.flower:app``) on ``N`` virtual SuperNodes:

1. a ``flower-superlink --simulation`` supervised by :class:`server.superlink.SuperLink`
   (``FlowerSettings(simulation=True)``) in a scratch folder: its own
   ``FLWR_HOME`` and ``config.toml`` connection, a free port, telemetry and the
   update check off, no runtime dependency installation, the virtual
   environment's ``bin`` on ``PATH`` (it starts ``flower-superexec`` by name);
2. ``flwr run APP poet-edge --federation-config "num-supernodes=N
   client-resources-num-cpus=C" --run-config FILE``: the SuperLink's SuperExec
   starts ``flwr-simulation``, which runs the ServerApp and the ClientApps on Ray
   (one long-lived Ray actor per ``C`` cores, each serving many virtual devices:
   torch is imported once per actor, not once per message);
3. ``flwr list --run-id ID`` polled until the run has finished;
4. the SuperLink and everything below it stopped, then any process still
   naming the scratch folder or Ray's own (``RAY_TMPDIR``, a short folder under
   ``/tmp``: Ray's ``raylet`` and ``gcs_server`` keep their session and sockets
   there) killed, and Ray's folder removed, so nothing outlives the command.

Flower and Ray are never imported here (``flwr`` is a program to this package).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from server.config import FlowerSettings, ServerSettings
from server.errors import FlowerError
from schedules.programs import free_port
from server.superlink import CONNECTION, SuperLink, flower_binary, flower_environment

APP_DIR = Path(__file__).resolve().parent / "flwr_app"
POLL_SECONDS = 1.0
RAY_ENVIRONMENT = {"RAY_USAGE_STATS_ENABLED": "0"}  # Ray's own telemetry



def toml_value(value: Any) -> str:
    """``value`` as a TOML literal (bool, int, float, str: JSON's string escapes are TOML's)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


def run_on_engine(run_config: dict[str, Any], devices: int, cpus_per_device: int, scratch: Path,
                  timeout: float = 3600.0) -> int:
    """Run the app on ``devices`` virtual SuperNodes; returns Flower's run id once the run has completed.

    Raises :class:`FlowerError` when the run fails or outlasts ``timeout`` seconds (the ServerApp's log tail
    in the message).  Every process started is stopped before returning.
    """
    flower = FlowerSettings(port=free_port(), supernode_auth=False, simulation=True)  # loopback only
    settings = ServerSettings(data_dir=scratch, flower=flower)
    # Ray's session lives in a short folder of its own: its socket paths must fit the 107 bytes of AF_UNIX
    ray_dir = Path(tempfile.mkdtemp(prefix="poet-ray-", dir="/tmp" if Path("/tmp").is_dir() else None))
    temporary = scratch / "tmp"  # TMPDIR of every process below (devices' swap folders): removed with scratch
    temporary.mkdir(exist_ok=True)
    superlink = SuperLink(settings, {**RAY_ENVIRONMENT, "RAY_TMPDIR": str(ray_dir), "TMPDIR": str(temporary)})
    previous = _exit_on_sigterm()
    try:
        superlink.start()
        superlink.wait_ready(60)
        overrides = scratch / "run-config.toml"
        overrides.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in run_config.items()), encoding="utf-8")
        answer = _flwr(superlink.home, "run", str(APP_DIR), CONNECTION, "--run-config", str(overrides),
                       "--federation-config", f"num-supernodes={devices} client-resources-num-cpus={cpus_per_device}")
        if not answer.get("success"):
            raise FlowerError(f"flwr run refused the simulation: {answer.get('error-message', answer)}")
        run_id = int(answer["run-id"])
        _wait_finished(superlink.home, run_id, timeout)
        return run_id
    finally:
        superlink.stop()
        kill_leftovers(scratch)
        kill_leftovers(ray_dir)
        shutil.rmtree(ray_dir, ignore_errors=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm() -> Any:
    """Make SIGTERM unwind (so the cleanup runs) as Ctrl-C does; the previous handler, or ``None`` off the main
    thread (where handlers cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, stop)


def _wait_finished(home: Path, run_id: int, timeout: float) -> None:
    """Poll the run's status until it has finished; raise unless it completed."""
    deadline = time.monotonic() + timeout
    status = ""
    while time.monotonic() < deadline:
        runs = _flwr(home, "list", CONNECTION, "--run-id", str(run_id)).get("runs", [])
        status = str(runs[0].get("status", "")) if runs else ""
        if status.startswith("finished"):
            break
        time.sleep(POLL_SECONDS)
    if status == "finished:completed":
        return
    tail = _log_tail(home, run_id)
    raise FlowerError(f"the simulation run {run_id} ended {status or 'unfinished'} "
                       f"({'timed out after %g s' % timeout if not status.startswith('finished') else 'see below'})"
                       f"; its log ends:\n{tail}")


def _flwr(home: Path, *arguments: str) -> dict[str, Any]:
    """``flwr ARGUMENTS --format json`` against the scratch ``FLWR_HOME``; its JSON answer."""
    command = [str(flower_binary("flwr")), *arguments, "--format", "json"]
    try:
        done = subprocess.run(command, env=flower_environment(home), capture_output=True, text=True, timeout=120)
        return dict(json.loads(done.stdout))
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        raise FlowerError(f"{' '.join(command[:2])} failed: {exc}") from exc


def _log_tail(home: Path, run_id: int, lines: int = 40) -> str:
    """The last lines of the run's log (``flwr log ID --show``), or why there are none."""
    command = [str(flower_binary("flwr")), "log", str(run_id), CONNECTION, "--show"]
    try:
        done = subprocess.run(command, env=flower_environment(home), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(no log: {exc})"
    return "\n".join((done.stdout + done.stderr).strip().splitlines()[-lines:])


def kill_leftovers(scratch: Path) -> list[int]:
    """Kill every process (and its descendants) whose command line names ``scratch``; returns their pids.

    Ray's ``gcs_server``, ``raylet`` and their workers outlive a ``flwr-simulation`` that was killed; their
    command lines name the session folder under ``RAY_TMPDIR``.
    """
    import psutil

    marker = str(scratch)
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in process.info["cmdline"] or ()):
                found += [process, *process.children(recursive=True)]
        except psutil.Error:
            pass
    for process in found:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(found, timeout=10)
    return [p.pid for p in found]
