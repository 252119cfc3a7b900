"""Finding Flower's programs and their environment (common.programs)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from common.programs import QUIET, find_program, flower_environment, free_port


def test_a_program_beside_this_python_is_found_before_path_and_a_missing_one_is_none() -> None:
    assert find_program(Path(sys.executable).name) == Path(sys.executable).parent / Path(sys.executable).name
    assert find_program("no-such-program-poet-edge") is None


def test_the_environment_is_quiet_has_its_home_and_puts_the_programs_first(tmp_path: Path) -> None:
    environment = flower_environment(tmp_path / "home", tmp_path / "bin")
    assert {k: environment[k] for k in QUIET} == QUIET and environment["FLWR_HOME"] == str(tmp_path / "home")
    assert environment["PATH"].split(os.pathsep)[0] == str(tmp_path / "bin")


def test_a_free_port_can_be_listened_on() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", free_port()))
        listener.listen()
