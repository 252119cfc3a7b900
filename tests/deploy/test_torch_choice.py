"""deploy/torch_choice.py: the torch build install.sh gives a device, from what its CPU and OS report.

The machines are real /proc/cpuinfo texts and JetPack's files in a temporary root; the interpreter is the one
this venv was made from (a system Python, not a venv's), with or without this venv's torch on its path (as a
JetPack Python has NVIDIA's).  ``make test-arm64`` runs the script on emulated Pi 4 and Pi 5 cores and
installs what it picks.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "torch_choice.py"
SYSTEM_PYTHON = getattr(sys, "_base_executable", None) or sys.executable  # the venv's base interpreter
TORCH_SITE = Path(importlib.metadata.distribution("torch").locate_file(""))  # where this venv's torch lies

PI4 = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm crc32 cpuid
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd08
CPU revision\t: 3

Hardware\t: BCM2835
Model\t\t: Raspberry Pi 4 Model B Rev 1.4
"""
PI5 = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU part\t: 0xd0b

Model\t\t: Raspberry Pi 5 Model B Rev 1.0
"""
ORIN = PI5.replace("0xd0b", "0xd42").replace("Raspberry Pi 5 Model B Rev 1.0", "NVIDIA Jetson Orin Nano")
# A board whose cores differ (big.LITTLE): a build must run on the little ones too.
MIXED = PI5 + "\nprocessor\t: 1\nFeatures\t: fp asimd evtstrm crc32 cpuid\nCPU part\t: 0xd03\n"


def choose(tmp_path: Path, cpuinfo: str, machine: str = "aarch64", *, pinned: str = "2.14.1", root: Path | None = None,
           with_torch: bool = True) -> tuple[int, dict[str, str], str]:
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if with_torch:
        env["PYTHONPATH"] = str(TORCH_SITE)
    done = subprocess.run([SYSTEM_PYTHON, str(SCRIPT), "--pinned", pinned, "--cpuinfo", str(path), "--machine", machine,
                           "--root", str(root or tmp_path / "no-jetpack")], capture_output=True, text=True, timeout=60,
                          env=env)
    answer = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    return done.returncode, answer, done.stderr


def jetpack_root(tmp_path: Path) -> Path:
    root = tmp_path / "jetson"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "nv_tegra_release").write_text("# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic\n")
    return root


def test_a_pi_4_gets_the_cpu_build_or_the_last_pypi_build_that_runs_on_armv8_0(tmp_path):
    status, answer, _ = choose(tmp_path, PI4)
    assert status == 0
    assert answer["kind"] == "cpu-index" and answer["spec"] == "torch==2.14.1"
    assert answer["index"] == "https://download.pytorch.org/whl/cpu"
    assert answer["isa"] == "armv8.0" and answer["fallback"] == "torch==2.9.1"
    assert "Cortex-A72" in answer["reason"]


@pytest.mark.parametrize("cpuinfo", [PI5, ORIN])
def test_a_pi_5_or_an_orin_core_gets_the_newer_fallback(tmp_path, cpuinfo):
    status, answer, _ = choose(tmp_path, cpuinfo)
    assert status == 0
    assert answer["kind"] == "cpu-index" and answer["isa"] == "armv8.1+" and answer["fallback"] == "torch==2.10.0"


def test_every_core_must_have_the_feature(tmp_path):
    assert choose(tmp_path, MIXED)[1]["isa"] == "armv8.0"


def test_an_unreadable_cpuinfo_takes_the_build_that_runs_on_any_aarch64_core(tmp_path):
    assert choose(tmp_path, "")[1]["fallback"] == "torch==2.9.1"


def test_a_jetson_keeps_the_torch_its_python_has(tmp_path):
    status, answer, _ = choose(tmp_path, ORIN, root=jetpack_root(tmp_path))
    assert status == 0, answer
    assert answer["kind"] == "system" and answer["spec"] == f"torch=={importlib.metadata.version('torch')}"
    assert "R36" in answer["reason"] and "keeping" in answer["reason"]


def test_a_jetson_without_nvidias_torch_gets_the_cpu_build_and_is_told(tmp_path):
    status, answer, _ = choose(tmp_path, ORIN, root=jetpack_root(tmp_path), with_torch=False)
    assert status == 0
    assert answer["kind"] == "cpu-index" and "no torch of NVIDIA's" in answer["reason"]


def test_a_jetson_is_known_by_its_device_tree_too(tmp_path):
    root = tmp_path / "dt"
    (root / "proc" / "device-tree").mkdir(parents=True)
    (root / "proc" / "device-tree" / "model").write_bytes(b"NVIDIA Jetson Orin Nano Developer Kit\0")
    assert choose(tmp_path, ORIN, root=root)[1]["kind"] == "system"
    (root / "proc" / "device-tree" / "model").write_bytes(b"Raspberry Pi 5 Model B Rev 1.0\0")
    assert choose(tmp_path, PI5, root=root)[1]["kind"] == "cpu-index"


def test_a_jetson_torch_older_than_the_agent_needs_is_left_to_the_system(tmp_path):
    spec = importlib.util.spec_from_file_location("torch_choice", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["torch_choice"] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["torch_choice"]
    machine = module.Machine("aarch64", frozenset({"atomics"}), "R36", "2.5.0a0+872d972e41.nv24.08")
    choice = module.choose(machine, "2.14.1")
    assert choice.kind == "cpu-index" and "older than 2.9" in choice.reason


def test_x86_64_keeps_the_pinned_version(tmp_path):
    status, answer, _ = choose(tmp_path, "flags\t: fpu sse2 avx2\n", machine="x86_64")
    assert status == 0 and answer["kind"] == "pinned" and answer["spec"] == "torch==2.14.1"


@pytest.mark.parametrize("machine", ["armv7l", "armv6l"])
def test_a_32_bit_arm_userland_is_told_to_install_a_64_bit_os(tmp_path, machine):
    status, answer, stderr = choose(tmp_path, PI4, machine=machine)
    assert status == 1 and not answer
    assert "64-bit OS" in stderr and machine in stderr


def test_an_unknown_architecture_is_named(tmp_path):
    status, _, stderr = choose(tmp_path, "", machine="riscv64")
    assert status == 1 and "riscv64" in stderr and "--venv" in stderr


def test_a_torch_in_a_venvs_python_is_not_taken_for_the_systems(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(ORIN)
    done = subprocess.run([sys.executable, str(SCRIPT), "--cpuinfo", str(path), "--machine", "aarch64",
                           "--root", str(jetpack_root(tmp_path))], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "kind=cpu-index" in done.stdout  # --system-site-packages would not see it


def test_the_check_runs_torch_and_prints_its_version_as_pip_knows_it():
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == importlib.metadata.version("torch")
