"""Fixtures of the server tests: settings in a temporary data directory, apps, clients, enrolled devices,
a real server process, a client signed in to the dashboard.

``client`` serves requests without the app's lifespan (no planner processes
start: most tests never solve); ``solving_client`` runs the lifespan, so
schedule requests are planned by real worker processes.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from httpx import Response

from schedules.device import DeviceProfile
from schedules.graph import TrainingGraph
from server.api import create_app
from server.config import ServerSettings
from server.dashboard import operators
from server.devices import create_enrolment_token
from tests.schedules.graphs import linear_graph
from tests.server.processes import ServerProcess, running_server


@dataclass
class Enrolled:
    """A device enrolled through the API: its name, token and request headers."""

    name: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@pytest.fixture
def settings(tmp_path: Path) -> ServerSettings:
    return ServerSettings(data_dir=tmp_path / "server", solve_time_limit=30.0)


@pytest.fixture
def app(settings: ServerSettings) -> FastAPI:
    return create_app(settings)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    yield TestClient(app)  # no lifespan: requests are served, nothing is solved


@pytest.fixture
def solving_client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as client:
        yield client


def enrolment_token(app: FastAPI, lifetime: float = 3600.0) -> str:
    """A fresh enrolment token, made as ``poet-edge server enrol-token`` makes one."""
    return create_enrolment_token(app.state.server.db, lifetime, time.time())[0]


def enrol(client: TestClient, name: str = "pi-1") -> Enrolled:
    """Enrol a device called ``name`` through the API."""
    response = client.post("/api/v1/enrol", json={"enrolment_token": enrolment_token(client.app),
                                                  "device_name": name})
    assert response.status_code == 201, response.text
    return Enrolled(name, response.json()["device_token"])


@pytest.fixture
def device(client: TestClient) -> Enrolled:
    return enrol(client)


def heartbeat(**fields: Any) -> dict[str, Any]:
    """A heartbeat as the agent sends it: its status object plus software_version and sent_at."""
    beat = {"state": "training", "reason": "idle and charging", "steps_done": 12, "sent_at": time.time(),
            "software_version": "0.1.0", "loss": 0.5, "energy_j": 3.25, "eligibility": [
                {"name": "power", "eligible": True, "reason": "on mains"}]}
    beat.update(fields)
    return beat


def schedule_request(graph: TrainingGraph | None = None, memory_budget: int = 10**9,
                     runtime_budget: float | None = 1.5, device: str = "rpi4") -> dict[str, Any]:
    """A schedule request body for ``graph`` (a 6-layer chain by default) on a built-in device profile."""
    graph = graph if graph is not None else linear_graph(6)
    return {"graph": graph.to_dict(), "device": DeviceProfile.builtin(device).to_dict(),
            "memory_budget": memory_budget, "runtime_budget": runtime_budget}


def wait_for_solve(client: TestClient, request_id: str, headers: dict[str, str], timeout: float = 120.0
                   ) -> dict[str, Any]:
    """Poll the request until it leaves queued/solving; its last status."""
    deadline = time.monotonic() + timeout
    while True:
        response = client.get(f"/api/v1/schedule-requests/{request_id}", headers=headers)
        assert response.status_code == 200, response.text
        status = response.json()
        if status["status"] not in ("queued", "solving"):
            return status
        assert time.monotonic() < deadline, f"request {request_id} still {status['status']} after {timeout} s"
        time.sleep(0.1)


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in a Prometheus exposition, or ``None`` when absent."""
    wanted = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in text.splitlines():
        if not line.startswith("#") and line.rsplit(" ", 1)[0] == wanted:
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[ServerProcess]:
    """``poet-edge server run --port 0`` without torch; unpacks as (process, base URL, data dir, key id, log)."""
    with running_server(tmp_path, "--solve-time-limit", "20") as server:
        yield server


# -- the dashboard ------------------------------------------------------------------------
OPERATOR, PASSWORD = "admin", "correct horse battery"
_CSRF = re.compile(r'name="csrf_token" value="([^"]*)"')


def add_operator(app: FastAPI, username: str = OPERATOR, password: str = PASSWORD) -> None:
    """An operator account, made as ``poet-edge server operator add`` makes one."""
    operators.add_operator(app.state.server.db, username, password, time.time())


def csrf_token_in(html: str) -> str:
    """The first form's CSRF token in a page."""
    match = _CSRF.search(html)
    assert match, "the page has no form with a CSRF token"
    return match.group(1)


def log_in(client: TestClient, username: str = OPERATOR, password: str = PASSWORD) -> Response:
    """Submit the login form as a browser does (its CSRF token and cookie first); the response, not followed."""
    token = csrf_token_in(client.get("/login").text)
    return client.post("/login", data={"username": username, "password": password, "csrf_token": token},
                       follow_redirects=False)


@dataclass
class Dashboard:
    """A client signed in to the dashboard, and its session's CSRF token."""

    client: TestClient
    csrf: str


@pytest.fixture
def dashboard(client: TestClient) -> Dashboard:
    add_operator(client.app)
    assert log_in(client).status_code == 303
    return Dashboard(client, csrf_token_in(client.get("/tokens").text))
