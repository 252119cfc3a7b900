"""The warm ClientApp runner's pieces that stand alone: the ``flwr-clientapp`` launcher and the wait for a message.

The whole path (SuperExec -> launcher -> runner -> forked ClientApp) runs in tests/test_flower_deployment.py.
Here Flower's program and the SuperNode's log are the outside world: a stand-in program that records its
arguments, and a log file written the way the SuperNode writes it.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

from agent.federated.launcher import PROGRAM_VARIABLE, SOCKET_VARIABLE
from agent.federated.runner import MessageArrival
from agent.federated.supernode import install_launcher


def flower_stand_in(tmp_path: Path) -> tuple[Path, Path]:
    """A program in the place of Flower's ``flwr-clientapp`` that writes its arguments to a file."""
    record = tmp_path / "arguments"
    program = tmp_path / "real-flwr-clientapp"
    program.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    program.chmod(0o755)
    return program, record


def test_the_launcher_becomes_flowers_program_when_no_runner_answers(tmp_path: Path) -> None:
    program, record = flower_stand_in(tmp_path)
    launcher = install_launcher(tmp_path / "bin")
    assert launcher.name == "flwr-clientapp" and os.access(launcher, os.X_OK)
    arguments = ["--runtime-api-address", "127.0.0.1:9094", "--token", "abc", "--insecure"]
    for socket in (str(tmp_path / "nobody-listens.sock"), None):  # a stopped runner, or none configured
        record.unlink(missing_ok=True)
        environment = {**os.environ, PROGRAM_VARIABLE: str(program)}
        environment.pop(SOCKET_VARIABLE, None)
        if socket:
            environment[SOCKET_VARIABLE] = socket
        done = subprocess.run([str(launcher), *arguments], env=environment, capture_output=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert record.read_text().split() == arguments  # Flower's program got exactly the launch's arguments


def test_the_launcher_says_what_is_missing_without_flowers_program(tmp_path: Path) -> None:
    launcher = install_launcher(tmp_path / "bin")
    environment = {k: v for k, v in os.environ.items() if k not in (PROGRAM_VARIABLE, SOCKET_VARIABLE)}
    done = subprocess.run([str(launcher), "--token", "abc"], env=environment, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode != 0 and PROGRAM_VARIABLE in done.stderr


def test_a_runner_waits_for_the_message_the_supernode_is_receiving(tmp_path: Path) -> None:
    log = tmp_path / "supernode.log"
    log.write_text("INFO :      Receiving: train message (ID: old)\n")  # an earlier run's, unfinished
    arrival = MessageArrival(log)
    assert arrival.wait(0.1)  # what was logged before the runner started does not count

    with open(log, "a") as out:
        out.write("INFO :      [RUN 7]\nINFO :      Receiving: train message (ID: 1)\n")
    started = time.monotonic()
    assert not arrival.wait(0.3)  # the weights are still coming
    assert time.monotonic() - started >= 0.3

    def arrive() -> None:
        time.sleep(0.2)
        with open(log, "a") as out:
            out.write("INFO :      Received successfully\n")

    writer = threading.Thread(target=arrive)
    writer.start()
    started = time.monotonic()
    assert arrival.wait(5.0)
    assert 0.15 <= time.monotonic() - started < 2.0
    writer.join()

    with open(log, "a") as out:  # a failed receive ends the wait too
        out.write("INFO :      Receiving: evaluate message (ID: 2)\nERROR :     Failed to receive message 2: gone\n")
    assert arrival.wait(0.1)


def test_without_a_supernode_log_the_runner_does_not_wait() -> None:
    assert MessageArrival(None).wait(5.0)


def test_a_runner_leaves_a_launch_to_a_launcher_that_gave_up(tmp_path: Path) -> None:
    import json
    import socket

    from agent.federated.runner import Runner

    runner = Runner(str(tmp_path / "agent.toml"), tmp_path / "clientapps.sock", threads=1)
    listener = runner.listen()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as launcher:
            launcher.connect(str(runner.socket_path))
            launcher.sendall(json.dumps({"argv": ["--token", "abc"], "launched_at": time.time()}).encode() + b"\n")
        # the launcher timed out and closed: it starts Flower's own ClientApp, so the runner must fork none
        runner._accept(listener)
        assert runner.children == set()
    finally:
        listener.close()


def test_the_log_lines_the_runner_follows_are_the_ones_the_installed_supernode_writes() -> None:
    import inspect

    from flwr.supernode import start_client_internal

    # the SuperNode formats them with logging's %-style: the runner matches the text before the first %
    source = inspect.getsource(start_client_internal)
    for line in (MessageArrival.STARTED, *MessageArrival.ENDED):
        assert f'"{line}' in source, f"flower-supernode no longer logs {line!r}: update MessageArrival"
