"""The layers point one way, and the planner installs and runs without the device's libraries.

``schedules`` (the planner) never imports torch, Flower, ``agent`` or
``benchmarks``; ``agent`` and ``server`` import Flower only inside ``agent.federated`` and ``server.federated``.  The
contracts live in ``pyproject.toml`` (``[tool.importlinter]``) and are checked
here by import-linter on the real import graph.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.schedules.graphs import linear_graph

REPO = Path(__file__).resolve().parents[1]

# Run Python as a server's install would: the device's libraries cannot be imported.
WITHOUT_DEVICE_LIBRARIES = """
import sys
for name in ("torch", "torchvision", "transformers", "flwr", "crc32c"):
    sys.modules[name] = None  # as if not installed: importing it raises ModuleNotFoundError
from common.cli import main
sys.exit(main(sys.argv[1:]))
"""


def poet_edge_without_device_libraries(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_DEVICE_LIBRARIES, *argv], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def test_import_contracts_are_kept() -> None:
    done = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_the_planner_solves_and_lists_every_command_without_torch(tmp_path) -> None:
    graph = tmp_path / "graph.json"
    linear_graph(6).save(graph)
    done = poet_edge_without_device_libraries("solve", str(graph), "--device", "rpi4", "--runtime", "1.5",
                                              "-o", str(tmp_path / "schedule.json"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "schedule.json").stat().st_size > 0
    listing = poet_edge_without_device_libraries("--help")
    assert listing.returncode == 0
    assert "profile" in listing.stdout and "validate" in listing.stdout  # registered, though they need torch


def test_device_commands_without_torch_say_what_to_install(tmp_path) -> None:
    done = poet_edge_without_device_libraries("profile", "--model", "resnet18", "--swap-dir", str(tmp_path),
                                              "-o", str(tmp_path / "g.json"), "--device-out", str(tmp_path / "d.json"))
    assert done.returncode == 2
    assert "pip install 'poet-edge[device]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_no_two_modules_import_each_other_even_inside_functions() -> None:
    """A circle of two (a run-time import each way, at the top or inside a function) says two modules are one
    job split wrongly, or one job's parts in the wrong place; annotations only (``TYPE_CHECKING``) do not run."""
    import grimp

    packages = ("common", "schedules", "engine", "agent", "server", "simulation", "demo", "benchmarks")
    graph = grimp.build_graph(*packages, cache_dir=None, exclude_type_checking_imports=True)
    circles = sorted({tuple(sorted((module, other))) for module in graph.modules
                      for other in graph.find_modules_directly_imported_by(module)
                      if module in graph.find_modules_directly_imported_by(other)})
    assert circles == []
