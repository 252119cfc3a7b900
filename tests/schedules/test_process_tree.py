"""stop_tree: a process, its group and a descendant that left the group (as Flower's SuperExec does) all stop."""

from __future__ import annotations

import subprocess
import time

import pytest

from common.process_tree import descendants, stop_tree

psutil = pytest.importorskip("psutil")


def test_a_tree_with_a_detached_child_is_stopped_whole() -> None:
    # The shell ignores SIGTERM, so only the SIGKILL after the grace period stops it; one child is detached.
    process = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 300 & setsid sleep 300 & wait"],
                               start_new_session=True)
    deadline = time.monotonic() + 10
    while len(below := descendants(process.pid)) < 2:
        assert time.monotonic() < deadline, "the children did not start"
        time.sleep(0.05)
    assert stop_tree(process, seconds=0.5) is False  # it had to be killed
    _, alive = psutil.wait_procs(below, timeout=5)
    assert alive == [] and process.returncode is not None
