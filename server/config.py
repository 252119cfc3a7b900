"""``ServerSettings``: everything the fleet server is configured with, checked once, every problem listed.

The command line (``poet-edge server run``) builds one; tests build their own
with a temporary data directory and small limits.  Nothing here touches the
disk: :func:`server.api.create_app` creates the data directory, the database
and the key.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from pathlib import Path

from server.errors import ServerConfigError

DEFAULT_DATA_DIR = Path("poet-server")
MEBIBYTE = 1024 * 1024
TLS_FILES = ("ca.crt", "server.pem", "server.key")  # what a Flower TLS directory holds (deploy/README.md)


@dataclass(frozen=True)
class FlowerSettings:
    """The Flower SuperLink the server supervises (:mod:`server.federated.superlink`).

    Attributes
    ----------
    host, port:
        Where the SuperLink serves its Fleet, Control and Runtime APIs (one HTTP port since Flower 1.40).
    tls_dir:
        Folder holding ``ca.crt``, ``server.pem`` and ``server.key``; ``None`` runs the SuperLink without TLS
        (a trusted lab network only).
    supernode_auth:
        Only SuperNodes whose public key was registered (``poet-edge server supernode register``) may connect.
        Needs ``tls_dir``: Flower refuses node authentication without TLS.
    simulation:
        Run Flower's simulation engine (``--simulation``): no SuperNode connects; each run brings its own
        virtual SuperNodes on Ray (``flwr run --federation-config num-supernodes=N``; ``poet-edge simulate``).
    """

    host: str = "127.0.0.1"
    port: int = 9092
    tls_dir: Path | None = None
    supernode_auth: bool = True
    simulation: bool = False

    def __post_init__(self) -> None:
        if self.tls_dir is not None:
            object.__setattr__(self, "tls_dir", Path(self.tls_dir))

    @property
    def address(self) -> str:
        """``HOST:PORT`` as SuperNodes and the ``flwr`` CLI dial it (a wildcard host becomes loopback)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    @property
    def node_auth(self) -> bool:
        """Whether ``--enable-supernode-auth`` is passed (only with TLS)."""
        return self.supernode_auth and self.tls_dir is not None


@dataclass(frozen=True)
class ServerSettings:
    """How one server process runs.

    Attributes
    ----------
    data_dir:
        Folder of the SQLite database (by default) and the server's signing key (``keys/``).
    database:
        SQLAlchemy URL; ``None`` means ``sqlite:///DATA_DIR/server.db``.
    host, port:
        Where the API listens.
    solve_workers:
        Planner processes solving at once (each solve uses one core).
    solve_time_limit:
        Seconds :func:`schedules.plan` may search; its best plan by then is the answer.
    solve_timeout_margin:
        Seconds past ``solve_time_limit`` after which a solve that has not returned is stopped (its
        worker process killed and replaced) and reported ``timed_out``.
    max_body_bytes:
        Largest request body accepted (413 beyond).
    max_graph_nodes:
        Largest training graph planned (the MILP grows with the square of the nodes; 422 beyond).
    max_queued_solves:
        Schedule requests allowed to wait at once (503 beyond).
    max_queued_solves_per_device:
        Schedule requests one device may have waiting at once (429 beyond), so that one device asking for
        budget after budget cannot hold back every other device's schedule.
    heartbeat_history:
        Heartbeats kept per device; older ones are deleted as new ones arrive.
    online_seconds:
        A device is online when its last heartbeat arrived within this many seconds (three times the
        agent's expected 20 s interval).
    enrol_per_minute, auth_failures_per_minute:
        Enrolment attempts, and failed device authentications, allowed per client address per minute
        (429 with ``Retry-After`` beyond).
    trusted_proxies:
        Addresses or networks (``127.0.0.1``, ``10.0.0.0/8``) of reverse proxies whose ``X-Forwarded-For``
        names the client.  Empty (the default): the header is ignored and the address a request comes from
        is the client's, so no client can pick the address its attempts are counted under.
    """

    data_dir: Path = DEFAULT_DATA_DIR
    database: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    solve_workers: int = 1
    solve_time_limit: float = 60.0
    solve_timeout_margin: float = 10.0
    max_body_bytes: int = 8 * MEBIBYTE
    max_graph_nodes: int = 1000
    max_queued_solves: int = 1000
    max_queued_solves_per_device: int = 3
    heartbeat_history: int = 1000
    online_seconds: float = 60.0
    enrol_per_minute: int = 10
    auth_failures_per_minute: int = 30
    trusted_proxies: tuple[str, ...] = ()
    flower: FlowerSettings | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        problems = _problems(self)
        if problems:
            raise ServerConfigError("server settings: " + "; ".join(problems))

    @property
    def database_url(self) -> str:
        """The SQLAlchemy URL: ``database`` or the SQLite file in the data directory."""
        return self.database or f"sqlite:///{self.data_dir.resolve() / 'server.db'}"

    @property
    def flower_dir(self) -> Path:
        """The SuperLink's files: its state database, ``FLWR_HOME``, its log, the SuperNode names."""
        return self.data_dir / "flower"

    @property
    def keys_dir(self) -> Path:
        """Where the server's Ed25519 key pair lives."""
        return self.data_dir / "keys"


def _problems(s: ServerSettings) -> list[str]:
    problems: list[str] = []
    if not 0 <= s.port <= 65535:
        problems.append(f"port {s.port} is not in 0..65535")
    if not s.host:
        problems.append("host is empty")
    for name in ("solve_workers", "max_body_bytes", "max_graph_nodes", "max_queued_solves", "max_queued_solves_per_device",
                 "heartbeat_history",
                 "enrol_per_minute", "auth_failures_per_minute"):
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"{name} must be a whole number >= 1, got {value!r}")
    for name in ("solve_time_limit", "online_seconds"):
        value = getattr(s, name)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            problems.append(f"{name} must be a finite number of seconds > 0, got {value!r}")
    margin = s.solve_timeout_margin
    if not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin < 0:
        problems.append(f"solve_timeout_margin must be a finite number of seconds >= 0, got {margin!r}")
    for proxy in s.trusted_proxies:
        try:
            ipaddress.ip_network(proxy)
        except ValueError:
            problems.append(f"trusted proxy {proxy!r} is not an IP address or network (10.0.0.5, 10.0.0.0/8, host bits zero)")
    if s.database is not None and "://" not in s.database:
        problems.append(f"database {s.database!r} is not a database URL (sqlite:///PATH or "
                        "postgresql+psycopg://USER@HOST/NAME)")
    if s.flower is not None:
        problems += _flower_problems(s.flower, s.port)
    return problems


def _flower_problems(f: FlowerSettings, api_port: int) -> list[str]:
    problems = []
    if not 1 <= f.port <= 65535:
        problems.append(f"flower port {f.port} is not in 1..65535")
    elif f.port == api_port:
        problems.append(f"flower port {f.port} is the device API's port; pick another --flower-port")
    if not f.host:
        problems.append("flower host is empty")
    if f.supernode_auth and f.tls_dir is None:
        problems.append("SuperNode authentication needs TLS: give --flower-tls-dir (or --no-flower-auth on a "
                        "trusted lab network)")
    return problems
