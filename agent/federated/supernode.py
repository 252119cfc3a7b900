"""The device's Flower SuperNode: running while the device is eligible, stopped (whole group) when it is not.

The SuperLink samples only connected SuperNodes, so a device that is not
eligible (unplugged, busy, hot, outside quiet hours) must not be connected.
:meth:`SuperNode.follow` is called at every eligibility check: it starts
``flower-supernode`` in its own process group when the device becomes
eligible and stops the group when it no longer is.  Stopping is SIGTERM to
the group and to every process the SuperNode started (its SuperExec detaches
into a session of its own), then SIGKILL after :data:`STOP_SECONDS`.  A
SuperNode stopped in the middle of a round has its message answered with an
error at once, so the round goes on with the others instead of waiting.

Each message's ClientApp is forked ready-loaded by the agent's warm runner
(:mod:`agent.federated.runner`, ``[flower] warm_clientapps``, on by default):
it starts with the SuperNode and stops with it, and the launcher it answers
comes first on the SuperNode's ``PATH`` as ``flwr-clientapp``.  SuperExec's
task poll is shortened to :data:`TASK_POLL_SECONDS` (Flower's default is 1 s).

Files, under ``state_dir/flower``: ``supernode.key`` (ECDSA P-384, OpenSSH,
mode 0600; made on first use unless ``[flower] auth_key`` names one) with its
``supernode.key.pub`` for the operator to register (``poet-edge server
supernode register NAME KEY.pub``), ``supernode.log`` (the SuperNode's
output), ``home/`` (its ``FLWR_HOME``), ``bin/flwr-clientapp`` (the launcher),
``clientapps.sock`` and ``clientapps.log`` (the warm runner's socket and output).  The key gives the node a stable id
across restarts.  Flower is run as a program, never imported here: this
module lives in the daemon's small process.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from agent.federated import launcher
from agent.federated.launcher import PROGRAM_VARIABLE, SOCKET_VARIABLE
from agent.config import AgentConfig
from agent.errors import SuperNodeKeyError
from common.backoff import Backoff
from common.process_tree import stop_tree
from common.programs import find_program, flower_environment

log = logging.getLogger("poet-agent")

STOP_SECONDS = 10.0
RETRY_FIRST_SECONDS = 5.0
RETRY_MAX_SECONDS = 300.0
REFUSED_MARK = "Exit Code: 305"  # Flower's code for a SuperNode the SuperLink would not activate
LAUNCHER_NAME = "flwr-clientapp"
TASK_POLL_SECONDS = 0.2  # FLWR_SUPEREXEC_TASK_POLL_INTERVAL: how soon a pulled message gets its ClientApp


def ensure_key(path: Path) -> Path:
    """The SuperNode's private key at ``path``, made (ECDSA P-384, OpenSSH, 0600) when absent; returns the
    public key's path (``path`` + ``.pub``), written beside it whenever missing."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    public = path.with_name(path.name + ".pub")
    try:
        if path.exists():
            key = serialization.load_ssh_private_key(path.read_bytes(), password=None)
        else:
            key = ec.generate_private_key(ec.SECP384R1())
            path.parent.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as out:
                out.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                            serialization.NoEncryption()))
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp384r1":
            raise SuperNodeKeyError(f"{path}: Flower takes ECDSA P-384 keys (ssh-keygen -t ecdsa -b 384 -m "
                                    "OpenSSH), or remove the file and the agent makes one")
        if not public.exists():
            public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                             serialization.PublicFormat.OpenSSH) + b"\n")
    except (OSError, ValueError, TypeError) as exc:
        raise SuperNodeKeyError(f"{path}: cannot read or make the SuperNode key: {exc}") from exc
    return public


def install_launcher(bin_dir: Path, python: str = sys.executable) -> Path:
    """Write the launcher (:mod:`agent.federated.launcher`) as ``bin_dir/flwr-clientapp``; returns it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    target = bin_dir / LAUNCHER_NAME
    source = Path(launcher.__file__).read_text(encoding="utf-8")
    temporary = target.with_name(target.name + ".tmp")
    temporary.write_text(f"#!{python} -IS\n{source}", encoding="utf-8")
    temporary.chmod(0o755)
    temporary.replace(target)
    return target


def flower_binary(name: str) -> Path:
    """The Flower program ``name`` (:func:`common.programs.find_program`), or a clear error."""
    found = find_program(name)
    if found is None:
        raise SuperNodeKeyError(f"{name} not found beside {sys.executable} or on PATH: install the agent with "
                                "pip install 'poet-edge[device]' (it brings Flower)")
    return found


def supernode_command(config: AgentConfig) -> list[str]:
    """The ``flower-supernode`` command line for this device."""
    f = config.flower
    node_config = f'device-name="{config.device.name}" agent-config="{config.path.resolve()}"'
    command = [str(flower_binary("flower-supernode")), "--superlink", f.superlink, "--port", str(f.runtime_port),
               "--node-config", node_config]
    if f.auth:  # with a key Flower never self-registers: the key must be registered, auth on or off
        command += ["--auth-supernode-private-key", str(config.supernode_key_path.resolve())]
    if f.root_certificates is not None:
        command += ["--root-certificates", str(f.root_certificates.resolve())]
    return command


class SuperNode:
    """The SuperNode process, following the device's eligibility (see the module docstring).

    A SuperNode that exits by itself while the device is eligible is started again after 5 s, doubling up to
    5 minutes; one the SuperLink refused (an unregistered key) says so in :attr:`state`.
    """

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.process: subprocess.Popen | None = None
        self.runner: subprocess.Popen | None = None  # the warm ClientApp runner, while the SuperNode runs
        self._runner_environment: dict[str, str] = {}
        self._runner_backoff = Backoff(RETRY_FIRST_SECONDS, RETRY_MAX_SECONDS)
        self.state = "stopped: not eligible"
        self.backoff = Backoff(RETRY_FIRST_SECONDS, RETRY_MAX_SECONDS)
        self._log_offset = 0
        self.public_key = ensure_key(config.supernode_key_path)
        if not config.flower.auth:
            return
        log.info("Flower SuperNode key %s: the operator registers it with `poet-edge server supernode register "
                 "%s %s`", config.supernode_key_path, config.device.name, self.public_key)

    @property
    def running(self) -> bool:
        """Whether the SuperNode process is alive."""
        return self.process is not None and self.process.poll() is None

    def clientapps(self) -> int:
        """How many ClientApps the warm runner has running now (a round's message being answered)."""
        import psutil

        # before its socket exists the runner's only child is the one preparing the workload
        if self.runner is None or self.runner.poll() is not None or not self.socket_path.exists():
            return 0
        try:
            return sum(1 for child in psutil.Process(self.runner.pid).children() if child.status() != "zombie")
        except psutil.Error:
            return 0

    def follow(self, eligible: bool, now: float) -> None:
        """Start or stop the SuperNode so that it runs exactly while ``eligible``.  Never raises: a failure (a
        missing Flower program, an unwritable folder) stops what was started, is logged and put in
        :attr:`state`, and the start is tried again later, as after an exit."""
        try:
            self._follow(eligible, now)
        except Exception as exc:  # the agent's daemon must outlive any trouble with Flower
            log.exception("Flower SuperNode: cannot follow the device's eligibility")
            self.stop(f"failed: {exc}; starting again in {self.backoff.failed(now):.0f} s")

    def _follow(self, eligible: bool, now: float) -> None:
        if self.process is not None and self.process.poll() is not None:
            self._exited(now)
        if eligible and self.process is None and self.backoff.due(now):
            self._start()
        elif eligible and self.process is not None and self.config.flower.warm_clientapps:
            self._keep_runner(self._runner_environment, now)
        elif not eligible and (self.process is not None or self.runner is not None):
            self.stop("stopped: not eligible")
        elif not eligible:
            self.backoff.reset()
            if not self.state.startswith("refused"):
                self.state = "stopped: not eligible"

    def _start(self) -> None:
        f = self.config.flower
        self.config.flower_dir.mkdir(parents=True, exist_ok=True)
        programs = flower_binary("flower-supernode").parent
        environment = flower_environment(self.config.flower_dir / "home", programs)
        environment["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(TASK_POLL_SECONDS)
        if f.warm_clientapps:
            self._keep_runner(dict(environment))  # the ClientApps it forks share the SuperNode's FLWR_HOME
            installed = install_launcher(self.config.flower_dir / "bin")
            environment.update({"PATH": f"{installed.parent}{os.pathsep}{environment['PATH']}",
                                SOCKET_VARIABLE: str(self.socket_path),
                                PROGRAM_VARIABLE: str(flower_binary("flwr-clientapp"))})
        with open(self.log_path, "ab") as output:
            self._log_offset = output.tell()  # this run's output starts here: an exit is read from its own lines
            self.process = subprocess.Popen(supernode_command(self.config), env=environment, stdin=subprocess.DEVNULL,
                                            stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
                                            cwd=self.config.flower_dir)
        self.state = f"running (pid {self.process.pid}), connected to {f.superlink}"
        log.info("Flower SuperNode started (pid %d) for %s; output in %s", self.process.pid, f.superlink,
                 self.log_path)

    def _exited(self, now: float) -> None:
        code = self.process.returncode
        self.process = None
        self._stop_runner()  # it serves this SuperNode only
        if REFUSED_MARK in _read_from(self.log_path, self._log_offset):
            self.state = (f"refused by the SuperLink: its key is not registered (poet-edge server supernode "
                          f"register {self.config.device.name} {self.public_key})")
            self.backoff.failed(now, wait=RETRY_MAX_SECONDS)  # until the operator registers it
        else:
            self.state = f"exited with {code}; starting again in {self.backoff.failed(now):.0f} s"
        log.warning("Flower SuperNode %s (see %s)", self.state, self.log_path)

    @property
    def log_path(self) -> Path:
        """The SuperNode's output, appended across starts."""
        return self.config.flower_dir / "supernode.log"

    @property
    def socket_path(self) -> Path:
        """Where the warm runner listens for the launcher."""
        return self.config.flower_dir / "clientapps.sock"

    def _keep_runner(self, environment: dict[str, str], now: float | None = None) -> None:
        """Start the warm runner unless it runs.  One that ended is started again after 5 s, doubling up to
        5 minutes while it keeps ending (meanwhile the launcher starts Flower's own ClientApps)."""
        self._runner_environment = environment
        if self.runner is not None and self.runner.poll() is None:
            return
        if self.runner is not None:  # it ended: said once, and started again when the backoff allows
            wait = self._runner_backoff.failed(now if now is not None else 0.0)
            log.warning("warm ClientApp runner exited with %s (see %s); starting it again in %.0f s",
                        self.runner.returncode, self.config.flower_dir / "clientapps.log", wait)
            self.runner = None
        if now is not None and not self._runner_backoff.due(now):
            return
        with open(self.config.flower_dir / "clientapps.log", "ab") as output:
            self.runner = subprocess.Popen(
                [sys.executable, "-m", "agent.federated.runner", "--config", str(self.config.path.resolve()),
                 "--socket", str(self.socket_path), "--supernode-log", str(self.log_path)], env=environment,
                stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
                cwd=self.config.flower_dir)

    def stop(self, state: str = "stopped") -> None:
        """Stop the SuperNode and every process it started, and the warm runner with its ClientApps (SIGTERM,
        then SIGKILL after :data:`STOP_SECONDS`)."""
        process, self.process = self.process, None
        self.state = state
        if process is not None and process.poll() is None:  # first: it would launch ClientApps meanwhile
            if not stop_tree(process, STOP_SECONDS):
                log.warning("Flower SuperNode did not stop within %g s: killed", STOP_SECONDS)
            log.info("Flower SuperNode %s", state)
        self._stop_runner()

    def _stop_runner(self) -> None:
        runner, self.runner = self.runner, None
        self._runner_backoff.reset()
        if runner is not None and runner.poll() is None and not stop_tree(runner, STOP_SECONDS):
            log.warning("warm ClientApp runner did not stop within %g s: killed", STOP_SECONDS)


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""

