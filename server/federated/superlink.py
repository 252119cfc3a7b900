"""The fleet server's Flower SuperLink: started as a child process group, restarted when it dies, stopped with us.

``poet-edge server run --flower`` runs ``flower-superlink`` beside the device
API.  Its files live in ``DATA_DIR/flower`` (:attr:`ServerSettings.flower_dir`):

- ``state.db``: the SuperLink's state (``--database``), so registered and
  connected SuperNodes survive a SuperLink restart;
- ``home/``: ``FLWR_HOME`` for the SuperLink and the ``flwr`` CLI; its
  ``config.toml`` names this SuperLink ``poet-edge`` (address, CA);
- ``superlink.log``: the SuperLink's output, appended across restarts.

With ``FlowerSettings(simulation=True)`` the same supervisor runs a SuperLink
in simulation mode (``--simulation``: virtual SuperNodes on Ray, for
``poet-edge simulate``, :mod:`simulation.engine`).

Flower is run as programs, never imported: the server stays importable
without Flower, and a crash in the SuperLink is a process exit we can see.
Telemetry and the update check are off, and runtime dependency installation
is disabled (with it the SuperLink runs ``uv sync`` for each run and
downloads the app's dependencies).
"""

from __future__ import annotations

import logging
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from server.config import TLS_FILES, FlowerSettings, ServerSettings
from common import programs
from common.backoff import Backoff
from common.process_tree import signal_tree, stop_tree
from common.programs import find_program
from server.errors import FlowerError

log = logging.getLogger("poet-edge.superlink")

CONNECTION = "poet-edge"  # the SuperLink's name in FLWR_HOME/config.toml, for `flwr run . poet-edge`
DATABASE_VARIABLE = "POET_EDGE_DATABASE_URL"  # the server's database, for the ServerApps this SuperLink runs
DATA_DIR_VARIABLE = "POET_EDGE_DATA_DIR"  # the server's data folder (node id -> device name), for the same
BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 60.0
STABLE_SECONDS = 60.0  # a SuperLink that ran this long before dying starts the backoff over
STOP_SECONDS = 15.0  # the SuperLink's graceful shutdown waits for open connections


def flower_binary(name: str) -> Path:
    """The Flower program ``name`` (:func:`common.programs.find_program`), or a clear error."""
    found = find_program(name)
    if found is None:
        raise FlowerError(f"{name} not found beside {sys.executable} or on PATH: install the server with "
                          "pip install 'poet-edge[server]' (it brings Flower)")
    return found


def flower_environment(home: Path) -> dict[str, str]:
    """The environment for the server's Flower programs, with ``home`` as ``FLWR_HOME``."""
    return programs.flower_environment(home, flower_binary("flower-superlink").parent)


def tls_files(flower: FlowerSettings) -> dict[str, Path]:
    """The CA, certificate and key in ``tls_dir`` by file name (absolute); raises if one is missing."""
    if flower.tls_dir is None:
        return {}
    files = {name: (flower.tls_dir / name).resolve() for name in TLS_FILES}
    missing = [str(path) for path in files.values() if not path.is_file()]
    if missing:
        raise FlowerError(f"Flower TLS files missing: {', '.join(missing)} (deploy/README.md shows how to make "
                          "the CA and the server certificate)")
    return files


def superlink_command(settings: ServerSettings) -> list[str]:
    """The ``flower-superlink`` command line for these settings."""
    flower = settings.flower
    assert flower is not None
    command = [str(flower_binary("flower-superlink")), "--disable-runtime-dependency-installation",
               "--database", str((settings.flower_dir / "state.db").resolve()),
               "--host", flower.host, "--port", str(flower.port)] + (["--simulation"] if flower.simulation else [])
    tls = tls_files(flower)
    if not tls:
        return [*command, "--insecure"]
    command += ["--ssl-ca-certfile", str(tls["ca.crt"]), "--ssl-certfile", str(tls["server.pem"]),
                "--ssl-keyfile", str(tls["server.key"])]
    return [*command, "--enable-supernode-auth"] if flower.node_auth else command


def write_connection(settings: ServerSettings) -> Path:
    """Write ``FLWR_HOME/config.toml`` naming this SuperLink ``poet-edge`` (the default) for the ``flwr`` CLI."""
    flower = settings.flower
    assert flower is not None
    home = settings.flower_dir / "home"
    home.mkdir(parents=True, exist_ok=True)
    tls = tls_files(flower)
    security = (f'root-certificates = "{tls["ca.crt"]}"\n' if tls else "insecure = true\n")
    text = (f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "{flower.address}"\n{security}')
    path = home / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


class SuperLink:
    """One supervised ``flower-superlink``: :meth:`start`, :meth:`wait_ready`, :meth:`stop`.

    A watcher thread restarts the SuperLink whenever it exits unasked, after 1 s, doubling up to 60 s while it
    keeps dying young.  The SuperLink runs in its own process group; stopping sends SIGTERM to that group and
    to every process it started in another one (its SuperExec detaches into a session of its own), then
    SIGKILL to whatever is left after :data:`STOP_SECONDS`.

    Parameters
    ----------
    settings:
        The server's settings; ``settings.flower`` must be set.
    extra_environment:
        Variables the SuperLink and the ServerApps it starts see besides Flower's own.
    """

    def __init__(self, settings: ServerSettings, extra_environment: dict[str, str] | None = None) -> None:
        if settings.flower is None:
            raise FlowerError("the server was not configured with a Flower SuperLink (--flower)")
        self.settings = settings
        self.flower = settings.flower
        self.extra_environment = extra_environment or {}
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    @property
    def home(self) -> Path:
        """``FLWR_HOME`` of the SuperLink and of the ``flwr`` commands run against it."""
        return self.settings.flower_dir / "home"

    @property
    def log_path(self) -> Path:
        """The SuperLink's output, appended across restarts."""
        return self.settings.flower_dir / "superlink.log"

    def start(self) -> None:
        """Start the SuperLink and its watcher; raises :class:`FlowerError` when it cannot be started."""
        self.settings.flower_dir.mkdir(parents=True, exist_ok=True)
        write_connection(self.settings)
        self.command = superlink_command(self.settings)
        self._spawn()
        self._watcher = threading.Thread(target=self._watch, name="superlink-watcher", daemon=True)
        self._watcher.start()

    def _spawn(self) -> None:
        # the ServerApps this SuperLink runs record their rounds in this server's store, with device names
        server = {} if self.flower.simulation else {DATA_DIR_VARIABLE: str(self.settings.data_dir.resolve()),
                                                    DATABASE_VARIABLE: self.settings.database_url}
        environment = {**flower_environment(self.home), **server, **self.extra_environment}
        with open(self.log_path, "ab") as output:
            try:
                process = subprocess.Popen(self.command, env=environment, stdin=subprocess.DEVNULL, stdout=output,
                                           stderr=subprocess.STDOUT, start_new_session=True,
                                           cwd=self.settings.flower_dir)
            except OSError as exc:
                raise FlowerError(f"cannot start {self.command[0]}: {exc}") from exc
        with self._lock:
            self.process = process
            self.starts += 1
        log.info("Flower SuperLink started (pid %d) on %s, output in %s", process.pid, self.flower.address,
                 self.log_path)

    def _watch(self) -> None:
        backoff = Backoff(BACKOFF_FIRST_SECONDS, BACKOFF_MAX_SECONDS, stable_after=STABLE_SECONDS)
        while not self._stopping.is_set():
            process = self.process
            backoff.started(time.monotonic())
            code = process.wait()
            if self._stopping.is_set():
                return
            wait = backoff.failed(time.monotonic())
            log.warning("Flower SuperLink exited with %s; restarting in %.0f s (see %s)", code, wait, self.log_path)
            signal_tree(process.pid, signal.SIGKILL)  # what it left behind holds the port
            if self._stopping.wait(wait):
                return
            try:
                self._spawn()
            except FlowerError as exc:
                log.error("%s", exc)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the SuperLink answers ``GET /health``; raises :class:`FlowerError` after ``timeout`` s."""
        url = f"{'https' if self.flower.tls_dir else 'http'}://{self.flower.address}/health"
        tls = tls_files(self.flower)
        context = ssl.create_default_context(cafile=str(tls["ca.crt"])) if tls else None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=2, context=context) as answer:
                    if answer.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        raise FlowerError(f"the Flower SuperLink did not answer {url} within {timeout:g} s; see {self.log_path}")

    def kill(self) -> None:
        """Kill the running SuperLink outright, as a crash would (the watcher restarts it)."""
        process = self.process
        if process is not None:
            signal_tree(process.pid, signal.SIGKILL)

    def stop(self) -> None:
        """Stop the SuperLink and everything it started; no restart follows."""
        self._stopping.set()
        process = self.process
        if process is not None and process.poll() is None:
            stop_tree(process, STOP_SECONDS)
        if self._watcher is not None:
            self._watcher.join(STOP_SECONDS)
        log.info("Flower SuperLink stopped")

