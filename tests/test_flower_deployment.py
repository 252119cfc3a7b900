"""A real Flower deployment on 127.0.0.1: the server's supervised SuperLink with TLS and SuperNode authentication,
and three agents whose SuperNodes follow their device's eligibility (a fake sysfs tree plugged and unplugged).

The rounds run ``tests/flower_app`` (a probe app: sleeps, marks, adds one), which exercises the processes; the
product's apps (``agent.flower``, ``server.flower``) have their own tests.  The tests share one deployment and run
in file order.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from agent.daemon.config import load_config
from agent.daemon.supernode import ensure_key, flower_binary
from benchmarks.agent_rig import FakeDevice, agent_command, read_status, write_config
from server.config import FlowerSettings, ServerSettings
from schedules.programs import QUIET, flower_environment, free_port
from server.superlink import SuperLink
from server.supernodes import list_nodes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[1]
APP = Path(__file__).parent / "flower_app"
DEVICES = ("pi-0", "pi-1", "pi-2")

# The agent's daemon with a worker that only idles: these tests are about the SuperNode, not local training.
AGENT = """
import signal, sys
from agent.daemon.config import load_config
from agent.daemon.supervisor import Daemon, configure_logging
configure_logging()
idle = [sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGUSR1, lambda *a: sys.exit(0)); signal.pause()"]
sys.exit(Daemon(load_config(sys.argv[1]), worker_command=idle).run())
"""



def make_tls(directory: Path) -> Path:
    """A CA and a server certificate for localhost / 127.0.0.1 (``ca.crt``, ``server.pem``, ``server.key``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "poet-edge test CA")])

    def certificate(subject: x509.Name, public: Any) -> x509.CertificateBuilder:
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name).public_key(public)
                .serial_number(x509.random_serial_number()).not_valid_before(now)
                .not_valid_after(now + datetime.timedelta(days=1)))

    ca = certificate(ca_name, ca_key.public_key()).add_extension(
        x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256())
    server = certificate(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]), key.public_key()) \
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False).sign(ca_key, hashes.SHA256())
    (directory / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "server.pem").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    (directory / "server.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                             serialization.PrivateFormat.PKCS8,
                                                             serialization.NoEncryption()))
    return directory


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Fleet:
    """The SuperLink, three devices (fake sysfs, agent config, agent process) and helpers over them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        tls = make_tls(root / "tls")
        self.settings = ServerSettings(data_dir=root / "server",
                                       flower=FlowerSettings(port=free_port(), tls_dir=tls))
        self.superlink = SuperLink(self.settings)
        self.devices: dict[str, FakeDevice] = {}
        self.configs: dict[str, Path] = {}
        self.agents: dict[str, subprocess.Popen] = {}
        for name in DEVICES:
            home = root / name
            home.mkdir()
            self.devices[name] = FakeDevice(home / "root")
            self.configs[name] = write_config(
                home, self.devices[name], home / "data.csv", "unet", "1x3x8x8", device_name=name,
                flower_enabled=True, flower_superlink=self.settings.flower.address,
                flower_root_certificates=str(tls / "ca.crt"), flower_runtime_port=free_port())

    def start_agent(self, name: str) -> None:
        log = open(self.root / name / "agent.log", "ab")
        self.agents[name] = subprocess.Popen([sys.executable, "-c", AGENT, str(self.configs[name])], cwd=REPO,
                                             env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def status(self, name: str) -> dict[str, Any]:
        return read_status(self.root / name)

    def online(self) -> dict[str, int]:
        """Device name -> node id of the SuperNodes the SuperLink sees online."""
        try:
            nodes = list_nodes(self.settings)
        except Exception:  # the SuperLink is restarting
            return {}
        return {node["device"]: int(node["node-id"]) for node in nodes if node["status"] == "online"}

    def close(self) -> None:
        for agent in self.agents.values():
            if agent.poll() is None:
                agent.send_signal(signal.SIGTERM)
        for agent in self.agents.values():
            try:
                agent.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
        self.superlink.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    fleet = Fleet(tmp_path_factory.mktemp("flower"))
    try:
        fleet.superlink.start()
        fleet.superlink.wait_ready(60)
        yield fleet
    finally:
        fleet.close()


def test_registered_keys_get_node_ids_and_the_devices_come_online(fleet: Fleet) -> None:
    for name in DEVICES:
        public = ensure_key(load_config(fleet.configs[name]).supernode_key_path)
        done = subprocess.run([*agent_command("server", "supernode", "register", name, str(public)),
                               "--data-dir", str(fleet.settings.data_dir)],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert f"registered {name}: node id" in done.stdout
    for name in DEVICES:
        fleet.start_agent(name)
    online = wait_for(lambda: (nodes := fleet.online()).keys() >= set(DEVICES) and nodes, 90, "three SuperNodes")
    names = json.loads((fleet.settings.flower_dir / "supernodes.json").read_text())
    assert {name: names[name]["node_id"] for name in DEVICES} == {name: online[name] for name in DEVICES}
    assert all(fleet.status(name)["supernode"].startswith("running") for name in DEVICES)


def test_an_unregistered_key_is_refused(fleet: Fleet, tmp_path: Path) -> None:
    import psutil

    key, output = tmp_path / "stranger.key", tmp_path / "stranger.log"
    ensure_key(key)
    with open(output, "wb") as log:  # a file, not a pipe: the SuperExec it leaves would hold a pipe open
        stranger = subprocess.Popen(
            [str(flower_binary("flower-supernode")), "--superlink", fleet.settings.flower.address,
             "--root-certificates", str(fleet.settings.flower.tls_dir / "ca.crt"),
             "--auth-supernode-private-key", str(key), "--port", str(free_port())],
            env=flower_environment(tmp_path / "home", flower_binary("flower-supernode").parent),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    below: set[Any] = set()
    try:
        deadline = time.monotonic() + 60
        while stranger.poll() is None and time.monotonic() < deadline:
            below.update(psutil.Process(stranger.pid).children(recursive=True))
            time.sleep(0.1)
        assert stranger.poll() not in (None, 0)
        assert "Exit Code: 305" in output.read_text()  # Flower's "could not activate the SuperNode"
    finally:
        if stranger.poll() is None:
            stranger.kill()
        for process in below:  # the SuperExec it started in a session of its own
            try:
                process.kill()
            except psutil.Error:
                pass
        stranger.wait()


def test_the_supernode_follows_eligibility(fleet: Fleet) -> None:
    fleet.devices["pi-1"].unplug()
    wait_for(lambda: fleet.status("pi-1").get("supernode", "").startswith("stopped"), 30, "pi-1's SuperNode stops")
    wait_for(lambda: "pi-1" not in fleet.online(), 90, "pi-1 offline at the SuperLink")
    assert not _flower_processes_of(fleet.agents["pi-1"].pid)  # the whole group went, SuperExec included
    fleet.devices["pi-1"].plug()
    wait_for(lambda: "pi-1" in fleet.online(), 90, "pi-1 online again")


def test_a_superlink_crash_is_restarted_and_the_supernodes_reconnect_with_their_ids(fleet: Fleet) -> None:
    before = wait_for(lambda: (nodes := fleet.online()).keys() >= set(DEVICES) and nodes, 90, "three online")
    starts = fleet.superlink.starts
    fleet.superlink.kill()
    wait_for(lambda: fleet.superlink.starts > starts, 30, "the supervisor restarts the SuperLink")
    fleet.superlink.wait_ready(60)
    after = wait_for(lambda: (nodes := fleet.online()).keys() >= set(DEVICES) and nodes, 120, "three online again")
    assert {name: after[name] for name in DEVICES} == {name: before[name] for name in DEVICES}


def test_two_rounds_complete_with_a_device_unplugged_mid_round(fleet: Fleet, tmp_path: Path) -> None:
    wait_for(lambda: fleet.online().keys() >= set(DEVICES), 120, "three online")
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, **QUIET, "FLWR_HOME": str(fleet.superlink.home)}
    done = subprocess.run([str(flower_binary("flwr")), "run", str(APP), "poet-edge", "--format", "json",
                           "--run-config", f"out-dir='{out}' train-seconds=6.0"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout)["success"], done.stdout + done.stderr
    wait_for(lambda: (out / "pi-2.round1.started").exists(), 120, "pi-2 training in round 1")
    fleet.devices["pi-2"].unplug()
    result = json.loads(wait_for(lambda: (out / "server.json").exists() and (out / "server.json").read_text(),
                                 240, "the ServerApp's result"))
    first, second = result["rounds"]["1"], result["rounds"]["2"]
    assert first["devices"] == ["pi-0", "pi-1"] and len(first["errors"]) == 1  # pi-2 answered with an error
    assert second["devices"] == ["pi-0", "pi-1"] and not second["errors"]  # pi-2 was not sampled any more
    assert result["final"] == [2.0, 2.0, 2.0]


def _flower_processes_of(agent_pid: int) -> list[str]:
    import psutil

    return [" ".join(p.cmdline()[:2]) for p in psutil.Process(agent_pid).children(recursive=True)
            if any("flower" in part or "flwr" in part for part in p.cmdline()[:2])]
