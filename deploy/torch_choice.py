#!/usr/bin/env python3
"""Which PyTorch build the device agent's venv gets on this machine, from what its CPU reports.

``deploy/install.sh`` runs this with the interpreter that will make the venv (stdlib only: nothing is
installed yet), and reads its answer as ``key=value`` lines:

    kind      ``pinned``: the version ``constraints.txt`` pins, from the package index (x86_64);
              ``cpu-index``: PyTorch's CPU-only build from its own wheel index (aarch64);
              ``system``: the torch this interpreter already has (NVIDIA's, on a Jetson), kept
    spec      the requirement to install (``torch==2.14.1``), or the one to keep
    index     the index ``spec`` comes from (``cpu-index`` only)
    fallback  a CPU-only build from the package index, for where that index is out of reach or its build
              stops on this CPU (``cpu-index`` only)
    isa       what the CPU implements, as far as PyTorch cares (``armv8.0``: no LSE atomics, ``armv8.1+``)
    reason    one line for the operator

It asks the interpreter (``platform.machine()``, the kernel's ``uname -m`` as this Python sees it: a
32-bit userland on a 64-bit kernel says ``armv7l``), ``/proc/cpuinfo``'s ``Features`` and the files
JetPack leaves (``/etc/nv_tegra_release``, the device tree's model).  ``--check`` instead runs the
smallest workload that fails on a build the CPU cannot run (import, a 64x64 matmul, a convolution's
backward), in the venv after the install: a build that executes an instruction the CPU lacks dies
with SIGILL (exit status 132 in the shell).

Exit status: 0 an answer (or ``--check`` passed), 1 no PyTorch build fits this machine (the message
says what to do), 2 bad usage.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"

# The last CPU-only aarch64 builds on the package index (PyPI): from 2.11 on, its aarch64 wheels are
# CUDA 13 builds (about 3 GB with their libraries) whose BLAS executes ARMv8.1 atomics (LDADDAL).
# 2.10.0 stops at import on an ARMv8.0 core (Cortex-A72: SIGILL, seen under qemu's cortex-a72 model,
# and pytorch/pytorch#176993); 2.9.1 runs there.  Both run on an ARMv8.2 core (cortex-a76 model).
PYPI_CPU_BUILD = {"armv8.0": "2.9.1", "armv8.1+": "2.10.0"}
OLDEST_TORCH = (2, 9)  # pyproject.toml's lower bound for the device extra

# 32-bit ARM userlands: PyTorch publishes no builds for them.
ARM32 = ("armv6l", "armv7l", "armv8l", "arm")


class NoBuild(Exception):
    """No PyTorch build fits this machine; the message says what to do."""


@dataclass(frozen=True)
class Machine:
    """What the installer knows of the machine: the interpreter's architecture, the CPU's features, JetPack."""

    arch: str
    features: frozenset[str]
    jetson: str | None  # the L4T release or board model where JetPack is installed, else None
    system_torch: str | None  # the version of a torch the interpreter already imports, else None

    @property
    def isa(self) -> str:
        # LSE atomics (``atomics``) are the ARMv8.1 instructions PyTorch's newer aarch64 builds execute
        # unconditionally; everything from the Pi 5's Cortex-A76 and the Jetsons' cores up has them.
        return "armv8.1+" if "atomics" in self.features else "armv8.0"


@dataclass(frozen=True)
class Choice:
    kind: str
    spec: str
    isa: str = ""
    index: str = ""
    fallback: str = ""
    reason: str = ""

    def lines(self) -> list[str]:
        return [f"{key}={value}" for key, value in vars(self).items()]


def cpu_features(cpuinfo: str) -> frozenset[str]:
    """The features every core reports in /proc/cpuinfo (a big.LITTLE board lists each core; a build must
    run on all of them, so only what they all have counts)."""
    per_core = [frozenset(line.split(":", 1)[1].split()) for line in cpuinfo.splitlines()
                if line.split(":", 1)[0].strip() == "Features" and ":" in line]
    return frozenset.intersection(*per_core) if per_core else frozenset()


def jetson_release(root: Path) -> str | None:
    """JetPack's L4T release line, or the device tree's model where it names a Jetson; None elsewhere."""
    release = root / "etc" / "nv_tegra_release"
    if release.is_file():
        return release.read_text(errors="replace").splitlines()[0].strip("# ").strip() or "L4T"
    model = root / "proc" / "device-tree" / "model"
    if model.is_file():
        name = model.read_bytes().rstrip(b"\0").decode(errors="replace").strip()
        if "jetson" in name.lower():
            return name
    return None


def installed_torch() -> str | None:
    """The version of the torch this interpreter imports (its own site-packages), without importing it."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def system_torch() -> str | None:
    """The torch in this interpreter's system site-packages, which a venv made ``--system-site-packages``
    sees; None where there is none, or where this interpreter is itself a venv's (its packages stay its own)."""
    return installed_torch() if sys.prefix == sys.base_prefix else None


def release(version: str) -> tuple[int, ...]:
    """``2.9.1+cpu`` -> (2, 9, 1); ``2.5.0a0+872d972e41.nv24.08`` -> (2, 5, 0)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0].split("a")[0].split("rc")[0])[:3])


def choose(machine: Machine, pinned: str | None) -> Choice:
    """The build for ``machine``; ``pinned`` is the version constraints.txt pins for x86_64 (or None)."""
    arch = machine.arch
    if arch in ("x86_64", "amd64"):
        return Choice("pinned", f"torch=={pinned}" if pinned else "torch",
                      reason="x86_64: the version constraints.txt pins, from the package index")
    if arch in ARM32:
        raise NoBuild(f"this Python runs as {arch} (32-bit ARM), and PyTorch publishes no 32-bit ARM builds: "
                      "install a 64-bit OS (Raspberry Pi OS 64-bit, Ubuntu for arm64), where "
                      "`python3 -c 'import platform; print(platform.machine())'` prints aarch64")
    if arch not in ("aarch64", "arm64"):
        raise NoBuild(f"no known PyTorch build for {arch}: install torch into a venv yourself, "
                      "then run install.sh --venv DIR")
    isa = machine.isa
    if machine.jetson and machine.system_torch:
        if release(machine.system_torch)[:2] >= OLDEST_TORCH:
            return Choice("system", f"torch=={machine.system_torch}", isa=isa,
                          reason=f"Jetson ({machine.jetson}): keeping the torch this Python has "
                                 f"({machine.system_torch}, NVIDIA's for JetPack)")
        note = (f"the torch this Python has ({machine.system_torch}) is older than "
                f"{'.'.join(map(str, OLDEST_TORCH))}, which the agent needs, so the venv gets its own; ")
    elif machine.jetson:
        note = "this Python has no torch of NVIDIA's (pip install it first to keep it); "
    else:
        note = ""
    build = PYPI_CPU_BUILD[isa]
    cpu = "no LSE atomics: an ARMv8.0 core such as the Pi 4's Cortex-A72" if isa == "armv8.0" \
        else "LSE atomics: ARMv8.1 or newer"
    return Choice("cpu-index", f"torch=={pinned}" if pinned else "torch", isa=isa, index=CPU_INDEX,
                  fallback=f"torch=={build}",
                  reason=f"aarch64, {cpu}{' (Jetson: ' + machine.jetson + ')' if machine.jetson else ''}: "
                         f"{note}PyTorch's CPU-only build from its wheel index, else {build} from the "
                         "package index (its last CPU-only aarch64 build that runs on this CPU)")


def smoke_check() -> int:
    """The smallest workload that runs into a build's CPU requirements; prints torch's version as pip knows it
    (PyPI's aarch64 2.9.1 says ``2.9.1+cpu`` in ``torch.__version__`` and ``2.9.1`` to pip)."""
    import torch  # noqa: PLC0415 - in the venv, after the install

    a = torch.randn(64, 64)
    (a @ a).sum().item()  # BLAS
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    torch.nn.functional.conv2d(x, torch.randn(4, 3, 3, 3)).sum().backward()  # oneDNN / Arm Compute Library
    print(installed_torch() or torch.__version__)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pinned", default="", help="the torch version constraints.txt pins (x86_64's)")
    parser.add_argument("--cpuinfo", type=Path, default=Path("/proc/cpuinfo"), help=argparse.SUPPRESS)
    parser.add_argument("--machine", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, default=Path("/"), help=argparse.SUPPRESS)
    parser.add_argument("--check", action="store_true", help="run the smoke check in this interpreter's torch")
    args = parser.parse_args(argv)
    if args.check:
        return smoke_check()
    try:
        cpuinfo = args.cpuinfo.read_text(errors="replace")
    except OSError:
        cpuinfo = ""
    machine = Machine(arch=args.machine or platform.machine(), features=cpu_features(cpuinfo),
                      jetson=jetson_release(args.root), system_torch=system_torch())
    try:
        choice = choose(machine, args.pinned or None)
    except NoBuild as exc:
        print(f"torch_choice: {exc}", file=sys.stderr)
        return 1
    print("\n".join(choice.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
