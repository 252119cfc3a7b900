"""deploy/install.sh staged into a temporary root (DESTDIR) with the real systemd-sysusers and systemctl.

The venv is the one running these tests (``--venv``), so no pip install runs, except in the one test that
lets the script create its own venv from a small local wheel, offline.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "deploy" / "install.sh"
UNIT = "etc/systemd/system/poet-agent.service"
WANTS = "etc/systemd/system/multi-user.target.wants/poet-agent.service"
SYSUSERS = "usr/lib/sysusers.d/poet-agent.conf"
CONFIG = "etc/poet-agent/agent.toml"
STATE = "var/lib/poet-agent"
EXEC_ARGS = "agent run --config /etc/poet-agent/agent.toml"

pytestmark = pytest.mark.skipif(
    shutil.which("systemd-sysusers") is None or shutil.which("systemctl") is None,
    reason="systemd-sysusers or systemctl is not installed (Debian: apt-get install systemd; .ci/run installs it)",
)


@pytest.fixture
def template(tmp_path: Path) -> Path:
    path = tmp_path / "agent.example.toml"
    path.write_text("# placeholder config for the installer tests\n[agent]\n")
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "root"


@pytest.fixture
def venv() -> Path:
    """The virtual environment running the tests (/work/main/.venv under `make test`)."""
    prefix = Path(sys.prefix)
    if not os.access(prefix / "bin" / "poet-edge", os.X_OK):
        pytest.skip(f"{prefix} has no bin/poet-edge: run the tests from the project's venv")
    return prefix


@pytest.fixture
def own_venv(tmp_path: Path) -> Path:
    """A stand-in for an operator's venv, so that the uninstall tests show it survives without risking .venv."""
    path = tmp_path / "operator-venv"
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "poet-edge").write_text("#!/bin/sh\nexit 0\n")
    (path / "bin" / "poet-edge").chmod(0o755)
    return path


def install(root: Path | None, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run install.sh with DESTDIR=root (none when root is None)."""
    environ = {k: v for k, v in os.environ.items() if k != "DESTDIR"} | (env or {})
    if root is not None:
        environ["DESTDIR"] = str(root)
    return subprocess.run(["bash", str(INSTALL), *args], capture_output=True, text=True, env=environ, timeout=300)


def installed(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = install(root, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """Everything a rerun could change: files' content, mode, owner and mtime; links' targets; dirs' mode/owner."""
    found: dict[str, tuple[object, ...]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        key = str(path.relative_to(root))
        if stat.S_ISLNK(info.st_mode):
            found[key] = ("link", os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):  # not mtime: systemd-sysusers takes a lock file in etc/ on every run
            found[key] = ("dir", info.st_mode, info.st_uid, info.st_gid)
        else:
            found[key] = ("file", info.st_mode, info.st_uid, info.st_gid, info.st_mtime_ns, path.read_bytes())
    return found


def passwd_entry(root: Path, name: str) -> list[str] | None:
    for line in (root / "etc" / "passwd").read_text().splitlines():
        if line.split(":")[0] == name:
            return line.split(":")
    return None


def group_members(root: Path, name: str) -> list[str]:
    for line in (root / "etc" / "group").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == name:
            return fields[3].split(",") if fields[3] else []
    raise AssertionError(f"no group {name} in {root}/etc/group")


def test_install_stages_the_tree(root: Path, template: Path, venv: Path) -> None:
    installed(root, "--venv", str(venv), "--config-template", str(template))

    unit = (root / UNIT).read_text()
    assert f"\nExecStart={venv}/bin/poet-edge {EXEC_ARGS}\n" in unit
    assert os.readlink(root / WANTS) == "/etc/systemd/system/poet-agent.service"
    user = passwd_entry(root, "poet-agent")
    assert user is not None and user[5] == "/var/lib/poet-agent"
    assert all("poet-agent" in group_members(root, group) for group in ("dialout", "i2c", "video"))
    assert (root / SYSUSERS).is_file()
    assert (root / CONFIG).read_text() == template.read_text()
    assert stat.S_IMODE((root / CONFIG).stat().st_mode) == 0o640
    assert (root / STATE / "swap").is_dir()
    assert stat.S_IMODE((root / STATE).stat().st_mode) == 0o750
    assert not (root / "opt").exists()  # --venv: no venv of its own
    if os.geteuid() == 0:  # as root it hands the state to the user, by the IDs in the staged passwd
        assert (root / STATE).stat().st_uid == int(user[2])
        assert (root / STATE / "swap").stat().st_uid == int(user[2])


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_installed_unit_verifies(root: Path, template: Path, venv: Path) -> None:
    installed(root, "--venv", str(venv), "--config-template", str(template))
    done = subprocess.run(
        ["systemd-analyze", "--no-pager", "verify", "--recursive-errors=no", "--man=no", str(root / UNIT)],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "poet-agent.service" not in done.stdout + done.stderr


def test_second_run_changes_nothing_and_keeps_an_edited_config(root: Path, template: Path, venv: Path) -> None:
    args = ("--venv", str(venv), "--config-template", str(template))
    installed(root, *args)
    (root / CONFIG).write_text("# the operator's own\n[agent]\nname = 'pi-17'\n")
    before = snapshot(root)

    done = installed(root, *args)

    assert snapshot(root) == before
    assert "keeping" in done.stdout


def test_uninstall_removes_the_unit_and_keeps_config_and_state(
    root: Path, template: Path, own_venv: Path
) -> None:
    installed(root, "--venv", str(own_venv), "--config-template", str(template))
    (root / STATE / "swap" / "pages.bin").write_bytes(b"\0" * 16)

    installed(root, "--uninstall", "--venv", str(own_venv))

    assert not (root / UNIT).exists()
    assert not (root / WANTS).is_symlink()
    assert not (root / SYSUSERS).exists()
    assert (root / CONFIG).read_text() == template.read_text()
    assert (root / STATE / "swap" / "pages.bin").is_file()
    assert (own_venv / "bin" / "poet-edge").is_file()  # a venv it did not create stays
    installed(root, "--uninstall")  # and again: nothing left to remove is no error


def test_purge_removes_config_and_state(root: Path, template: Path, own_venv: Path) -> None:
    installed(root, "--venv", str(own_venv), "--config-template", str(template))

    installed(root, "--uninstall", "--purge")

    for path in (UNIT, WANTS, SYSUSERS, "etc/poet-agent", STATE):
        assert not (root / path).exists() and not (root / path).is_symlink(), path
    assert (own_venv / "bin" / "poet-edge").is_file()


def _wheel(directory: Path) -> Path:
    """A minimal pure-Python wheel providing a ``poet-edge`` command and a (empty) ``device`` extra."""
    info = "poet_edge_stub-0.1.dist-info"
    files = {
        "poet_edge_stub.py": "def main() -> int:\n    return 0\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: poet-edge-stub\nVersion: 0.1\nProvides-Extra: device\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": "[console_scripts]\npoet-edge = poet_edge_stub:main\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = directory / "poet_edge_stub-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path


def test_its_own_venv_is_created_and_removed(root: Path, template: Path, tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    offline = {"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHON": sys.executable}
    args = ("--source", str(wheel), "--config-template", str(template))
    done = install(root, *args, env=offline)
    assert done.returncode == 0, done.stdout + done.stderr

    assert f"\nExecStart=/opt/poet-agent/venv/bin/poet-edge {EXEC_ARGS}\n" in (root / UNIT).read_text()
    assert os.access(root / "opt/poet-agent/venv/bin/poet-edge", os.X_OK)
    before = snapshot(root)
    done = install(root, *args, env=offline)  # again: the venv is kept, pip finds the wheel already installed
    assert done.returncode == 0, done.stdout + done.stderr
    assert snapshot(root) == before

    done = install(root, "--uninstall", env=offline)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (root / "opt/poet-agent").exists()


def test_refuses_a_live_install_without_root(tmp_path: Path) -> None:
    command = ["bash", str(INSTALL), "--venv", sys.prefix]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root and setpriv (util-linux) is missing to drop privileges")
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
    environ = {k: v for k, v in os.environ.items() if k != "DESTDIR"}
    done = subprocess.run(command, capture_output=True, text=True, env=environ, cwd=tmp_path, timeout=60)
    assert done.returncode == 1
    assert "needs root" in done.stderr and "DESTDIR" in done.stderr


def test_missing_systemd_tools_are_named(root: Path, tmp_path: Path, template: Path, venv: Path) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run(
        [bash, str(INSTALL), "--venv", str(venv), "--config-template", str(template)],
        capture_output=True, text=True, env={"PATH": str(empty), "DESTDIR": str(root)}, timeout=60,
    )
    assert done.returncode == 1
    assert "systemd-sysusers" in done.stderr and "systemctl" in done.stderr
    assert not root.exists()


def test_missing_config_template_fails_before_changing_anything(root: Path, tmp_path: Path, venv: Path) -> None:
    done = install(root, "--venv", str(venv), "--config-template", str(tmp_path / "absent.toml"))
    assert done.returncode == 1
    assert "absent.toml" in done.stderr and "--config-template" in done.stderr
    assert not (root / UNIT).exists() and not (root / SYSUSERS).exists()


def test_the_default_template_is_deploy_agent_example_toml(root: Path, venv: Path) -> None:
    example = REPO / "deploy" / "agent.example.toml"
    done = install(root, "--venv", str(venv))
    if example.is_file():
        assert done.returncode == 0, done.stdout + done.stderr
        assert (root / CONFIG).read_bytes() == example.read_bytes()
    else:  # before it is written: a clear refusal that names it
        assert done.returncode == 1 and "agent.example.toml" in done.stderr


def test_help_and_usage_errors(root: Path) -> None:
    done = install(root, "--help")
    assert done.returncode == 0 and "--uninstall" in done.stdout and "--config-template" in done.stdout
    assert install(root, "--bogus").returncode == 2
    assert install(root, "--prefix", "relative/path").returncode == 2
    assert install(root, "--purge").returncode == 2
    assert not root.exists()
