"""The server on a real PostgreSQL server, and several server processes over one database.

PostgreSQL is Debian's package, started in a temporary directory once for
this module (:class:`benchmarks.postgres.TemporaryPostgres`); each test gets
its own empty database in it.  The tests skip only where PostgreSQL is not
installed (``.ci/run`` installs it).  The multi-process tests run on SQLite
too: two processes over one SQLite file must not fail or corrupt it.
"""

from __future__ import annotations

import itertools
import json
import re
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from fastapi.testclient import TestClient
from sqlalchemy import inspect, select

from benchmarks.postgres import TemporaryPostgres, postgres_bin
from common.cli import main
from common.exit_codes import ExitCode
from schedules.schedule import Schedule
from server.api import create_app
from server.config import ServerSettings
from server.datadir import open_database
from server.db.engine import Database
from server.db.migrate import alembic_config, current_revision, upgrade
from server import solve_requests
from server.db.models import Base, Device, SolveRequest
from server.solve_requests import parse_solve_input
from tests.schedules.graphs import linear_graph
from tests.server.conftest import enrol, heartbeat, metric, schedule_request, wait_for_solve
from tests.server.processes import REPO, WITHOUT_DEVICE_LIBRARIES

_databases = itertools.count()  # names of the per-test databases


@pytest.fixture(scope="module")
def postgres() -> Iterator[TemporaryPostgres]:
    """One PostgreSQL cluster for the module, stopped (and its directory removed) at the end."""
    if postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed (/usr/lib/postgresql/*/bin/initdb; Debian: apt-get install "
                    "postgresql, as .ci/run does)")
    with TemporaryPostgres(durable=False) as cluster:
        yield cluster


@pytest.fixture
def pg_url(postgres: TemporaryPostgres) -> str:
    """The URL of a new, empty database in the module's cluster."""
    return postgres.create_database(f"test_{next(_databases)}")


@pytest.fixture
def pg_settings(tmp_path: Path, pg_url: str) -> ServerSettings:
    return ServerSettings(data_dir=tmp_path / "server", database=pg_url, solve_time_limit=30.0)


def head_revision(db: Database) -> str:
    return str(ScriptDirectory.from_config(alembic_config(db)).get_current_head())


# -- one process, in-process app ----------------------------------------------------------------
def test_migrations_on_an_empty_postgres_database_build_exactly_the_models_schema(pg_settings) -> None:
    db = open_database(pg_settings)
    assert current_revision(db) == head_revision(db)
    assert set(inspect(db.engine).get_table_names()) == {*Base.metadata.tables, "alembic_version"}
    with db.engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection, opts={"compare_type": True}),
                                       Base.metadata)
    assert differences == []
    assert upgrade(db) == head_revision(db)  # the next start changes nothing
    db.dispose()


# Imports first, then every process starts migrating at the same moment (argv[2], Unix time).
MIGRATE = "import sys, time; from server.db.engine import Database; from server.db.migrate import upgrade; " \
          "db = Database(sys.argv[1]); time.sleep(max(0, float(sys.argv[2]) - time.time())); print(upgrade(db))"


def test_processes_migrating_one_empty_database_at_once_take_turns(pg_url) -> None:
    start = str(time.time() + 5)
    migrations = [subprocess.Popen([sys.executable, "-c", MIGRATE, pg_url, start], cwd=REPO, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [process.communicate(timeout=120) for process in migrations]
    assert [process.returncode for process in migrations] == [0] * 4, results  # without the lock, some fail
    db = Database(pg_url)
    assert {out.strip() for out, _ in results} == {head_revision(db)} == {current_revision(db)}
    db.dispose()


def test_enrol_heartbeat_solve_download_and_verify_on_postgres(pg_settings) -> None:
    with TestClient(create_app(pg_settings)) as client:
        device = enrol(client)
        beats = [heartbeat(steps_done=n, reason="it's \"quoted\"; DROP TABLE devices;--") for n in (1, 2)]
        assert client.post("/api/v1/heartbeats", json=beats, headers=device.headers).status_code == 204
        graph = linear_graph(6)
        accepted = client.post("/api/v1/schedule-requests", json=schedule_request(graph), headers=device.headers)
        assert accepted.status_code == 202, accepted.text
        status = wait_for_solve(client, accepted.json()["request_id"], device.headers)
        assert status["status"] == "done", status
        download = client.get(f"/api/v1/schedules/{status['schedule_id']}", headers=device.headers)
        assert download.status_code == 200
        public_key = load_pem_public_key(client.get("/api/v1/server-key").json()["public_key"].encode())
        Schedule.from_json(download.content, public_key=public_key).check_graph(graph)
        unchanged = client.get(f"/api/v1/schedules/{status['schedule_id']}",
                               headers={**device.headers, "If-None-Match": download.headers["ETag"]})
        assert unchanged.status_code == 304
        db = client.app.state.server.db
        with db.read() as session:
            stored = session.scalars(select(Device)).one()
        assert stored.steps_done == 2 and stored.last_heartbeat["reason"].endswith("DROP TABLE devices;--")


def test_text_postgres_cannot_store_is_refused_with_a_4xx_not_a_500(pg_settings) -> None:
    client = TestClient(create_app(pg_settings), raise_server_exceptions=False)
    device = enrol(client)
    for fields in ({"reason": "a\x00b"}, {"software_version": "\x00"}, {"eligibility": [
            {"name": "power\x00", "eligible": True}]}):
        response = client.post("/api/v1/heartbeats", json=heartbeat(**fields), headers=device.headers)
        assert response.status_code == 422, (fields, response.text)
    long_text = heartbeat(reason="é" * 2000, last_error="'; DROP TABLE devices;--" * 80)
    assert client.post("/api/v1/heartbeats", json=long_text, headers=device.headers).status_code == 204
    for part, key in (("graph", "model"), ("device", "name")):
        body = schedule_request()
        body[part][key] = "x\x00" * 150
        response = client.post("/api/v1/schedule-requests", json=body, headers=device.headers)
        assert response.status_code == 422 and "NUL" in response.json()["detail"], response.text
    client.app.state.server.db.dispose()


def test_on_postgres_only_abandoned_solves_are_queued_again(pg_settings) -> None:
    db = open_database(pg_settings)
    items = [parse_solve_input(**schedule_request(memory_budget=budget), max_nodes=100) for budget in (10**9, 10**8)]
    rows = [solve_requests.enqueue(db, item, time_limit=30, max_queued=10, now=time.time())[0] for item in items]
    abandoned, running = (row.id for row in rows)
    assert solve_requests.claim(db, abandoned, 30, time.time() - 1000) is not None  # its server was killed
    assert solve_requests.claim(db, running, 30, time.time()) is not None  # another live process solves it
    assert solve_requests.requeue_abandoned(db, time.time(), grace=40) == 1
    assert solve_requests.find(db, abandoned).status == "queued"
    assert solve_requests.find(db, running).status == "solving"
    db.dispose()


# -- real server processes ------------------------------------------------------------------------
@dataclass
class ServerProcess:
    """One ``poet-edge server run`` process: its base URL, printed key id and log."""

    process: subprocess.Popen
    url: str
    key_id: str
    log: Path

    def stop(self) -> None:
        """SIGTERM, and it exits 0 with no traceback in its log."""
        self.process.terminate()
        assert self.process.wait(timeout=60) == 0
        assert "Traceback" not in self.log.read_text()


def start_servers(data_dir: Path, database: str | None, logs: list[Path]) -> list[ServerProcess]:
    """Start one server per log at once (so they also race to migrate and to make the key); wait until each
    prints its address."""
    processes = []
    for log in logs:
        command = [sys.executable, "-c", WITHOUT_DEVICE_LIBRARIES, "server", "run", "--data-dir", str(data_dir),
                   "--port", "0", "--solve-time-limit", "20", *(["--database", database] if database else [])]
        with log.open("w") as stderr:
            processes.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                              cwd=REPO))
    servers = []
    for process, log in zip(processes, logs):
        line = process.stdout.readline()
        match = re.search(r"listening on (http://127\.0\.0\.1:\d+); server key ([0-9a-f]{16})", line)
        if match is None:
            for other in processes:
                other.kill()
            pytest.fail(f"a server did not start: {line!r}; log: {log.read_text()}")
        servers.append(ServerProcess(process, match.group(1), match.group(2), log))
    return servers


@pytest.fixture
def running(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    """Collects the test's server processes; kills any still running at the end."""
    servers: list[ServerProcess] = []
    yield servers
    for server in servers:
        if server.process.poll() is None:
            server.process.kill()
        server.process.wait(timeout=30)


def call(method: str, url: str, body: Any = None, token: str | None = None) -> tuple[int, bytes]:
    """One HTTP request; (status, body), error statuses included."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def solves_done(server: ServerProcess) -> float:
    """How many solves this process finished with a schedule (its own counter)."""
    _, text = call("GET", server.url + "/metrics")
    return metric(text.decode(), "poet_server_solve_seconds_count", status="done") or 0.0


def wait_done(server: ServerProcess, request_id: str, token: str) -> dict[str, Any]:
    """Poll until the request leaves queued/solving."""
    deadline = time.monotonic() + 120
    while True:
        code, body = call("GET", f"{server.url}/api/v1/schedule-requests/{request_id}", token=token)
        assert code == 200, body
        status = json.loads(body)
        if status["status"] not in ("queued", "solving"):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.2)


@pytest.fixture(params=["postgresql", "sqlite"])
def database(request: pytest.FixtureRequest) -> str | None:
    """The shared database's URL (``None``: the SQLite file in the shared data directory)."""
    return request.getfixturevalue("pg_url") if request.param == "postgresql" else None


def test_two_server_processes_over_one_database(tmp_path, database, running, capsys) -> None:
    data = tmp_path / "server"  # shared: both sign with the key in data/keys
    running += start_servers(data, database, [tmp_path / "a.log", tmp_path / "b.log"])
    a, b = running
    assert a.key_id == b.key_id  # the first made the key, the other loaded it

    storage = ["--data-dir", str(data), *(["--database", database] if database else [])]
    assert main(["server", "enrol-token", *storage]) == ExitCode.OK
    token = capsys.readouterr().out.strip()
    code, body = call("POST", a.url + "/api/v1/enrol", {"enrolment_token": token, "device_name": "pi-1"})
    assert code == 201, body
    device_token = json.loads(body)["device_token"]
    code, _ = call("POST", b.url + "/api/v1/enrol", {"enrolment_token": token, "device_name": "pi-2"})
    assert code == 401  # the token was spent on the other process

    # heartbeats to both processes at once, from several threads
    def beat(n: int) -> int:
        return call("POST", (a, b)[n % 2].url + "/api/v1/heartbeats", heartbeat(steps_done=n), device_token)[0]

    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(beat, range(80))) == {204}

    # the same schedule request sent to both processes at the same moment: one row, one solve
    body = schedule_request(linear_graph(7))
    barrier = threading.Barrier(8)

    def ask(n: int) -> tuple[int, bytes]:
        barrier.wait()
        return call("POST", (a, b)[n % 2].url + "/api/v1/schedule-requests", body, device_token)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(8)))
    assert {code for code, _ in answers} == {202}, answers
    request_ids = {json.loads(text)["request_id"] for _, text in answers}
    assert len(request_ids) == 1
    request_id = request_ids.pop()
    status = wait_done(b, request_id, device_token)
    assert status["status"] == "done", status
    assert solves_done(a) + solves_done(b) == 1
    code, document = call("GET", f"{a.url}/api/v1/schedules/{status['schedule_id']}", token=device_token)
    assert code == 200
    assert call("GET", f"{b.url}/api/v1/schedules/{status['schedule_id']}", token=device_token) == (200, document)

    # a restart (one process now) keeps the key, the device, its heartbeats and the schedule
    for server in running:
        server.stop()
    running += start_servers(data, database, [tmp_path / "c.log"])
    c = running[-1]
    assert c.key_id == a.key_id
    assert call("POST", c.url + "/api/v1/heartbeats", heartbeat(steps_done=1000), device_token)[0] == 204
    assert json.loads(call("GET", f"{c.url}/api/v1/schedule-requests/{request_id}", token=device_token)[1]) == status
    assert call("GET", f"{c.url}/api/v1/schedules/{status['schedule_id']}", token=device_token) == (200, document)
    c.stop()
    check_stored(data, database)


def check_stored(data: Path, database: str | None) -> None:
    """Every heartbeat counted, one solve request; SQLite's file intact."""
    db = Database(database or f"sqlite:///{data.resolve() / 'server.db'}")
    with db.read() as session:
        device = session.scalars(select(Device)).one()
        assert device.steps_done == 1000
        assert len(session.scalars(select(SolveRequest)).all()) == 1
    db.dispose()
    if database is None:
        with sqlite3.connect(data / "server.db") as raw:
            assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
