"""Flower's programs as both the server and the agent run them: where they are, and their environment.

Neither side imports Flower here (only ``agent.federated.clientapp`` and ``server.federated.serverapp``
do); they start ``flower-superlink``, ``flower-supernode`` and ``flwr`` as
processes of the same virtual environment.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

# Flower reports usage and checks for updates by default; a fleet's machines do neither.
QUIET = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}


def find_program(name: str) -> Path | None:
    """The program ``name`` beside this Python (its virtual environment), else on ``PATH``; ``None`` if neither."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return beside
    found = shutil.which(name)
    return None if found is None else Path(found)


def flower_environment(home: Path, programs: Path) -> dict[str, str]:
    """This process's environment with ``FLWR_HOME``, Flower quiet, and ``programs`` first on ``PATH`` (a
    SuperLink starts ``flower-superexec`` by name)."""
    path = os.environ.get("PATH", "")
    return {**os.environ, **QUIET, "FLWR_HOME": str(home),
            "PATH": f"{programs}{os.pathsep}{path}" if path else str(programs)}


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (for a program about to be started on it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
