"""Stopping a process and everything it started: the Flower SuperLink (server) and SuperNode (agent).

Flower's processes start helpers that leave the process group (SuperExec
detaches into its own session), so a group signal alone misses them: every
descendant is found *before* signalling and signalled too.  psutil (in the
device and server installs) is imported on use, so the planner stays light.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any


def descendants(pid: int) -> list[Any]:
    """psutil handles of every process below ``pid`` (they refuse to signal a reused pid)."""
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def signal_tree(pid: int, sig: int, below: list[Any] | None = None) -> None:
    """Send ``sig`` to the process group led by ``pid`` and to each process in ``below`` (by default, its
    descendants now)."""
    import psutil

    below = descendants(pid) if below is None else below
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for process in below:
        try:
            if process.is_running():
                process.send_signal(sig)
        except psutil.Error:
            pass


def stop_tree(process: subprocess.Popen, seconds: float) -> bool:
    """SIGTERM to ``process``'s tree, SIGKILL to what is left after ``seconds``; True if it stopped in time."""
    below = descendants(process.pid)
    signal_tree(process.pid, signal.SIGTERM, below)
    try:
        process.wait(seconds)
        in_time = True
    except subprocess.TimeoutExpired:
        in_time = False
    signal_tree(process.pid, signal.SIGKILL, below)
    process.wait()
    return in_time
