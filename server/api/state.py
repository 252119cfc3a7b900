"""``ServerState``: what one server process holds open, made once by :func:`server.api.create_app`."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from server.config import ServerSettings
from server.datadir import open_database
from server.db.engine import Database
from server.fleet_history import FleetSampler
from server.keys import ServerKey, load_or_create
from server.metrics import ServerMetrics
from server.ratelimit import RateLimiter
from server.solves import SolveService


@dataclass
class ServerState:
    """Settings, database, signing key, solve service, rate limiters and metrics of one server process."""

    settings: ServerSettings
    db: Database
    key: ServerKey
    solves: SolveService
    metrics: ServerMetrics
    enrol_attempts: RateLimiter
    auth_failures: RateLimiter
    sampler: FleetSampler

    @classmethod
    def open(cls, settings: ServerSettings) -> "ServerState":
        """Create the data directory, migrate the database, load (or make) the key; nothing is started yet."""
        db = open_database(settings)
        key = load_or_create(settings.keys_dir)
        metrics = ServerMetrics(db, settings.online_seconds)
        return cls(settings=settings, db=db, key=key, solves=SolveService(settings, db, key, metrics.observe_solve),
                   metrics=metrics, enrol_attempts=RateLimiter(settings.enrol_per_minute),
                   auth_failures=RateLimiter(settings.auth_failures_per_minute),
                   sampler=FleetSampler(db, settings.online_seconds))

    def start(self) -> None:
        """Start solving (queued requests first) and sampling the fleet for its charts."""
        self.solves.start()
        self.sampler.start()

    def stop(self) -> None:
        """Stop solving and sampling, and close the database connections."""
        self.sampler.stop()
        self.solves.stop()
        self.db.dispose()


def server_state(request: Request) -> ServerState:
    """The state of the app serving ``request``."""
    return request.app.state.server


def client_address(request: Request) -> str:
    """The client's address, as rate limits count it."""
    return request.client.host if request.client is not None else "unknown"
