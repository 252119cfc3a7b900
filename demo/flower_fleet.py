"""A Flower deployment on 127.0.0.1 for the deployment test and the overhead benchmark: the server's supervised
SuperLink with TLS and SuperNode authentication, and device agents (``poet-edge agent run``) on fake sysfs trees.

Each device trains the digits model (``agent.digits:digits_workload``) on its own rotated share of the digits (a
``.npz`` data file) under its own activation budget.  Rounds are submitted with ``poet-edge server federate`` and
land in the server's rounds table (:meth:`Fleet.rows`).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import signal
import subprocess
from pathlib import Path
from typing import Any, Callable

from agent.config import load_config
from agent.federated.supernode import ensure_key
from agent.digits import write_device_data
from demo.devices import REPO, FakeDevice, agent_command, poll_until, read_status, write_config
from common.programs import free_port
from server.config import FlowerSettings, ServerSettings
from server.federated.superlink import SuperLink
from server.federated.supernodes import list_nodes

MODEL = "agent.digits:digits_workload"
# A plain step of the digits model at batch 16 in an agent, whole: 1.7 MB of its own, the rest the pager's
# I/O buffers; no schedule fits below about 0.85 of it.
PLAIN_PEAK_BYTES = 5_950_000


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
    """Poll until ``predicate()`` is truthy; its value.  AssertionError after ``timeout`` seconds."""
    value = poll_until(predicate, timeout, 0.25)
    if not value:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")
    return value


class Fleet:
    """The SuperLink and the devices (fake sysfs, agent config, agent process), with helpers over them.

    ``budgets`` maps each device's name to its ``training.memory_budget``; ``warm`` is ``[flower]
    warm_clientapps``.
    """

    def __init__(self, root: Path, budgets: dict[str, str], warm: bool = True) -> None:
        self.root = root
        tls = make_tls(root / "tls")
        self.settings = ServerSettings(data_dir=root / "server", flower=FlowerSettings(port=free_port(), tls_dir=tls))
        self.superlink = SuperLink(self.settings)
        self.names = list(budgets)
        self.devices: dict[str, FakeDevice] = {}
        self.configs: dict[str, Path] = {}
        self.agents: dict[str, subprocess.Popen] = {}
        for index, name in enumerate(self.names):
            home = root / name
            home.mkdir()
            self.devices[name] = FakeDevice(home / "root")
            data = write_device_data(home / "digits.npz", index, len(self.names))
            self.configs[name] = write_config(
                home, self.devices[name], data, MODEL, "16x1x8x8", device_name=name,
                training_memory_budget=budgets[name], flower_enabled=True, flower_warm_clientapps=warm,
                flower_superlink=self.settings.flower.address, flower_root_certificates=str(tls / "ca.crt"),
                flower_runtime_port=free_port())

    def start(self) -> None:
        """Start the SuperLink and wait until it takes SuperNodes."""
        self.superlink.start()
        self.superlink.wait_ready(60)

    def register(self, name: str) -> subprocess.CompletedProcess:
        """``poet-edge server supernode register`` for the device's key (made as the agent would)."""
        public = ensure_key(load_config(self.configs[name]).supernode_key_path)
        return subprocess.run([*agent_command("server", "supernode", "register", name, str(public)),
                               "--data-dir", str(self.settings.data_dir)], cwd=REPO, capture_output=True, text=True,
                              timeout=120)

    def start_agent(self, name: str) -> None:
        """``poet-edge agent run`` for the device, its output in ``NAME/agent.log``."""
        with open(self.root / name / "agent.log", "ab") as log:
            self.agents[name] = subprocess.Popen(agent_command("agent", "run", "--config", str(self.configs[name])),
                                                 cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=log,
                                                 stderr=subprocess.STDOUT, start_new_session=True)

    def status(self, name: str) -> dict[str, Any]:
        return read_status(self.root / name)

    def flower_file(self, name: str, file: str) -> Path:
        """A file of the device's ``state_dir/flower`` (``supernode.log``, ``clientapps.log``, ...)."""
        return self.root / name / "state/flower" / file

    def online(self) -> dict[str, int]:
        """Device name -> node id of the SuperNodes the SuperLink sees online."""
        try:
            nodes = list_nodes(self.settings)
        except Exception:  # the SuperLink is restarting
            return {}
        return {node["device"]: int(node["node-id"]) for node in nodes if node["status"] == "online"}

    def wait_online(self, timeout: float = 120) -> dict[str, int]:
        """Every device online at the SuperLink, its SuperNode running and its warm runner (if any) listening."""
        def ready() -> dict[str, int] | None:
            online = self.online()
            if online.keys() < set(self.names):
                return None
            for name in self.names:
                if not self.status(name).get("supernode", "").startswith("running"):
                    return None
                if load_config(self.configs[name]).flower.warm_clientapps and \
                        not self.flower_file(name, "clientapps.sock").exists():
                    return None
            return online

        return wait_for(ready, timeout, f"{', '.join(self.names)} online")

    def clientapps(self, name: str) -> list[Any]:
        """The ClientApp processes the device's warm runner has forked and that still run."""
        import psutil

        try:
            tree = psutil.Process(self.agents[name].pid).children(recursive=True)
        except psutil.Error:
            return []
        found = []
        for process in tree:
            try:  # SuperExec leaves its launchers as zombies: they have no command line
                if "agent.federated.runner" in " ".join(process.cmdline()):
                    found += process.children()
            except psutil.Error:
                pass
        return found

    def federate(self, output: Path, *options: str) -> subprocess.Popen:
        """``poet-edge server federate OPTIONS`` in the background, its output in ``output``."""
        with open(output, "wb") as log:
            return subprocess.Popen([*agent_command("server", "federate", "--data-dir", str(self.settings.data_dir),
                                                    *options)],
                                    cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=log,
                                    stderr=subprocess.STDOUT)

    def rows(self, run_id: int) -> list[Any]:
        """The run's rows in the server's rounds table."""
        from server.federated.rounds import open_store, round_rows

        return round_rows(open_store(self.settings.database_url), run_id)

    def close(self) -> None:
        """Stop the agents (SIGTERM; the whole group after 60 s) and the SuperLink."""
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


def run_id_of(output: Path) -> int:
    """The run id ``poet-edge server federate`` printed."""
    return int(output.read_text().split("federated run ")[1].split()[0])
