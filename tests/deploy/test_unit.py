"""deploy/poet-agent.service: ``systemd-analyze verify`` accepts it and ``systemd-analyze security`` scores it.

The copy under test has ExecStart pointing at an executable that exists here (verify checks that); everything
else is the file as shipped.  Each check is also shown to fail on a broken copy.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "poet-agent.service"
MAX_EXPOSURE = 3.0  # systemd-analyze's scale: 0 (locked down) to 10 (UNSAFE); --threshold takes ten times it

pytestmark = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is not installed (Debian: apt-get install systemd; .ci/run installs it)",
)


def _executable() -> Path:
    """The poet-edge beside the interpreter running the tests, else the interpreter itself."""
    poet_edge = Path(sys.executable).with_name("poet-edge")
    return poet_edge if poet_edge.is_file() else Path(sys.executable)


def unit_copy(tmp_path: Path, text: str | None = None, name: str = "poet-agent.service") -> Path:
    """Write the unit (or ``text``) into ``tmp_path`` with ExecStart's program replaced by one that exists."""
    text = UNIT.read_text() if text is None else text
    text, count = re.subn(r"(?m)^ExecStart=\S+", f"ExecStart={_executable()}", text)
    assert count == 1, "the unit has exactly one ExecStart= line"
    path = tmp_path / name
    path.write_text(text)
    return path


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return _analyze("verify", "--recursive-errors=no", "--man=no", str(unit))


def security(unit: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the offline security check; return it and the overall exposure it printed."""
    done = _analyze("security", "--offline=yes", f"--threshold={round(MAX_EXPOSURE * 10)}", str(unit))
    found = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", done.stdout)
    assert found, f"no overall exposure in:\n{done.stdout}{done.stderr}"
    return done, float(found.group(1))


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "--no-pager", *args],
        capture_output=True, text=True, encoding="utf-8", timeout=60,
        env={"PATH": "/usr/bin:/bin", "SYSTEMD_COLORS": "0", "LANG": "C.UTF-8"},
    )


def settings(text: str) -> dict[str, list[str]]:
    """Every ``Key=value`` of a unit file, values in order (keys may repeat)."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_verify_passes(tmp_path: Path) -> None:
    unit = unit_copy(tmp_path)
    done = verify(unit)
    assert done.returncode == 0, done.stdout + done.stderr
    assert unit.name not in done.stdout + done.stderr  # not even a warning about it


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        ("ProtectSystem=strict", "ProtectSytem=strict", "Unknown key"),
        ("Type=notify", "Type=notiffy", "service type"),
        ("WatchdogSec=60s", "WatchdogSec=sixty", "sixty"),
    ],
)
def test_verify_fails_on_a_broken_copy(tmp_path: Path, old: str, new: str, complaint: str) -> None:
    text = UNIT.read_text()
    assert old in text
    done = verify(unit_copy(tmp_path, text.replace(old, new), name="broken.service"))
    assert done.returncode != 0
    assert complaint in done.stdout + done.stderr


def test_verify_fails_when_exec_start_is_missing(tmp_path: Path) -> None:
    unit = tmp_path / "missing.service"
    unit.write_text(UNIT.read_text())  # ExecStart=/opt/poet-agent/venv/bin/poet-edge, not installed here
    if Path("/opt/poet-agent/venv/bin/poet-edge").exists():
        pytest.skip("the agent is installed on this machine")
    done = verify(unit)
    assert done.returncode != 0
    assert "is not executable" in done.stdout + done.stderr


def test_exposure_is_at_most_3(tmp_path: Path) -> None:
    done, exposure = security(unit_copy(tmp_path))
    assert exposure <= MAX_EXPOSURE, done.stdout
    assert done.returncode == 0, done.stdout + done.stderr


def test_exposure_check_fails_without_the_hardening(tmp_path: Path) -> None:
    bare = "[Unit]\nDescription=unhardened\n\n[Service]\nType=notify\nExecStart=/x agent run\nUser=poet-agent\n"
    done, exposure = security(unit_copy(tmp_path, bare, name="bare.service"))
    assert exposure > MAX_EXPOSURE
    assert done.returncode != 0


def test_settings_the_agent_relies_on() -> None:
    found = settings(UNIT.read_text())
    expected = {
        "Type": "notify", "NotifyAccess": "main", "WatchdogSec": "60s", "Restart": "on-failure",
        "RestartSec": "10s", "TimeoutStopSec": "60s", "KillMode": "mixed", "User": "poet-agent",
        "Group": "poet-agent", "SupplementaryGroups": "dialout i2c video", "StateDirectory": "poet-agent",
        "ConfigurationDirectory": "poet-agent", "ProtectSystem": "strict", "ReadWritePaths": "/var/lib/poet-agent",
        "Nice": "10", "CPUWeight": "20", "IOSchedulingClass": "idle", "SyslogIdentifier": "poet-agent",
        "ExecStart": "/opt/poet-agent/venv/bin/poet-edge agent run --config /etc/poet-agent/agent.toml",
    }
    assert {key: found.get(key, [None])[-1] for key in expected} == expected
    assert "MemoryHigh" in found and "MemoryMax" in found
    # psutil reads /proc/stat, which ProcSubset=pid hides; PrivateDevices=yes would hide the sensors' nodes.
    assert "ProcSubset" not in found
    assert "PrivateDevices" not in found
    assert {"char-ttyUSB rw", "char-rfcomm rw", "char-i2c rw"} <= set(found["DeviceAllow"])


# -- the fleet server's unit --------------------------------------------------------------------------------------
SERVER_UNIT = REPO / "deploy" / "poet-server.service"


def test_the_server_unit_verifies_and_is_locked_down(tmp_path: Path) -> None:
    unit = unit_copy(tmp_path, SERVER_UNIT.read_text(), name="poet-server.service")
    done = verify(unit)
    assert done.returncode == 0, done.stdout + done.stderr
    assert unit.name not in done.stdout + done.stderr
    done, exposure = security(unit)
    assert exposure <= MAX_EXPOSURE, done.stdout


def test_the_second_server_process_of_deploy_readme_is_the_unit_on_port_8081_and_verifies(tmp_path: Path) -> None:
    """deploy/README.md makes a second server process with this sed line: the copy must differ only in its port
    and journal name, and verify."""
    (line,) = [line for line in (REPO / "deploy" / "README.md").read_text().splitlines()
               if line.startswith("sed -e 's/--port 8080/--port 8081/'")]
    expressions = re.findall(r"-e '([^']*)'", line)
    done = subprocess.run(["sed", *[a for e in expressions for a in ("-e", e)], str(SERVER_UNIT)],
                          capture_output=True, text=True, check=True)
    second, first = settings(done.stdout), settings(SERVER_UNIT.read_text())
    assert second["ExecStart"][-1] == first["ExecStart"][-1].replace("--port 8080", "--port 8081")
    assert second["SyslogIdentifier"] == ["poet-server-2"]
    assert {k: v for k, v in second.items() if k not in ("ExecStart", "SyslogIdentifier")} == \
        {k: v for k, v in first.items() if k not in ("ExecStart", "SyslogIdentifier")}
    unit = unit_copy(tmp_path, done.stdout, name="poet-server-2.service")
    verified = verify(unit)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_the_server_unit_runs_the_server_as_its_own_user_on_its_state_directory() -> None:
    found = settings(SERVER_UNIT.read_text())
    command = found["ExecStart"][-1].split()
    assert command[1:3] == ["server", "run"]
    assert command[command.index("--data-dir") + 1] == "/var/lib/" + found["StateDirectory"][-1]
    assert found["ReadWritePaths"] == ["/var/lib/poet-server"] and found["User"] == ["poet-server"]
    assert found["KillMode"] == ["mixed"] and found["Restart"] == ["on-failure"]
