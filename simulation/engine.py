"""Flower's simulation engine, driven as programs: a SuperLink in simulation mode, ``flwr run``, ``flwr list``.

:func:`run_on_engine` runs the fleet's Flower app (``server/federated/flwr_app``,
:mod:`server.federated.runs`) on ``N`` virtual SuperNodes:

1. a ``flower-superlink --simulation`` supervised by :class:`server.federated.superlink.SuperLink`
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

import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any

from server.config import FlowerSettings, ServerSettings
from common.programs import free_port
from server.federated.runs import start_run, wait_finished
from server.federated.superlink import SuperLink

RAY_ENVIRONMENT = {"RAY_USAGE_STATS_ENABLED": "0"}  # Ray's own telemetry



def run_on_engine(run_config: dict[str, Any], devices: int, cpus_per_device: int, scratch: Path,
                  timeout: float = 3600.0) -> int:
    """Run the app on ``devices`` virtual SuperNodes; returns Flower's run id once the run has completed.

    Raises :class:`server.errors.FlowerError` when the run fails or outlasts ``timeout`` seconds (the ServerApp's log tail
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
        run_id = start_run(superlink.home, run_config, "--federation-config",
                           f"num-supernodes={devices} client-resources-num-cpus={cpus_per_device}")
        wait_finished(superlink.home, run_id, timeout)
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
