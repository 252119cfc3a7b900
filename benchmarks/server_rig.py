"""The fleet server as :mod:`benchmarks.server_load` runs it: real processes, devices enrolled, one schedule.

Setup works on the database in this process, before the servers start, so
none of it is measured: devices are enrolled with the functions the enrolment
route calls (the route's per-address rate limit would make 1,000 enrolments
from loopback take hours), and the schedule every device fetches is requested
once through the API and solved by the server's planner; the operators who
watch the fleet table are added and signed in the same way.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

from schedules.budgets import store_all_peak
from demo.walkthrough import synthetic_graph
from schedules.device import DeviceProfile
from server.config import ServerSettings
from server.datadir import open_database
from server.dashboard.operators import add_operator
from server.dashboard.sessions import start_session
from server.devices import create_enrolment_token, enrol
from server.tokens import new_token

from benchmarks.load_client import SimulatedDevice

LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+);")
START_TIMEOUT_SECONDS = 60.0
SOLVE_TIMEOUT_SECONDS = 120.0


@dataclass
class ServerProcess:
    """One ``poet-edge server run`` process and the port it listens on."""

    process: subprocess.Popen
    port: int
    log: Path

    def processes(self) -> list[psutil.Process]:
        """The server and its children (the planner processes)."""
        main = psutil.Process(self.process.pid)
        return [main, *main.children(recursive=True)]

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s; the planner processes go with it."""
        children = self.processes()[1:] if self.process.poll() is None else []
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
        _, alive = psutil.wait_procs(children, timeout=10)
        for child in alive:
            child.kill()


def start_server(data_dir: Path, database: str | None, log: Path) -> ServerProcess:
    """``poet-edge server run --port 0`` on loopback, waiting until it answers."""
    command = [sys.executable, "-m", "common.cli", "server", "run", "--data-dir", str(data_dir),
               "--host", "127.0.0.1", "--port", "0", "--solve-time-limit", "20"]
    if database is not None:
        command += ["--database", database]
    with log.open("a") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
    line = process.stdout.readline()
    match = LISTENING.search(line)
    if match is None:
        process.kill()
        process.wait()
        raise RuntimeError(f"the server did not start: {line!r}; its log: {log}")
    server = ServerProcess(process, int(match.group(1)), log)
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        try:
            _call(server.port, "GET", "/api/v1/server-key")
            return server
        except OSError:
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"the server on port {server.port} does not answer; its log: {log}") from None
            time.sleep(0.2)


def enrol_devices(data_dir: Path, database: str | None, names: list[str]) -> list[str]:
    """Enrol ``names`` (in this process, against the database); their device tokens."""
    db = open_database(ServerSettings(data_dir=data_dir, database=database))
    try:
        tokens = []
        for name in names:
            now = time.time()
            tokens.append(enrol(db, create_enrolment_token(db, 3600.0, now)[0], name, now).device_token)
        return tokens
    finally:
        db.dispose()


def operator_sessions(data_dir: Path, database: str | None, count: int) -> list[str]:
    """Add ``count`` dashboard operators and sign each in (in this process, against the database); the session
    cookies, as a browser holds them after the login form."""
    db = open_database(ServerSettings(data_dir=data_dir, database=database))
    try:
        cookies = []
        for _ in range(count):
            now = time.time()
            operator = add_operator(db, f"bench-{new_token()[:12].lower()}", new_token(), now, role="viewer")
            cookies.append(start_session(db, operator.id, now))
        return cookies
    finally:
        db.dispose()


def solve_schedule(port: int, token: str) -> str:
    """Ask for one schedule through the API (an 8-layer chain on a Raspberry Pi 4) and wait for it; its id."""
    graph = synthetic_graph(8)
    body = {"graph": graph.to_dict(), "device": DeviceProfile.builtin("rpi4").to_dict(),
            "memory_budget": store_all_peak(graph), "runtime_budget": None}
    answer = _call(port, "POST", "/api/v1/schedule-requests", body, token)
    deadline = time.monotonic() + SOLVE_TIMEOUT_SECONDS
    while answer["status"] in ("queued", "solving"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the schedule was not solved within {SOLVE_TIMEOUT_SECONDS:g} s")
        time.sleep(0.2)
        answer = _call(port, "GET", f"/api/v1/schedule-requests/{answer['request_id']}", token=token)
    if answer["status"] != "done":
        raise RuntimeError(f"the schedule's solve ended {answer['status']}: {answer.get('error')}")
    return answer["schedule_id"]


def rss_bytes(servers: list[ServerProcess]) -> int:
    """Resident memory of every server process and its children, summed."""
    return sum(_each(servers, lambda p: p.memory_info().rss))


def cpu_seconds(servers: list[ServerProcess]) -> float:
    """CPU time (user + system) of every server process and its children, summed."""
    return sum(_each(servers, lambda p: sum(p.cpu_times()[:2])))


def tree_cpu_seconds(pid: int | None) -> float | None:
    """CPU time of process ``pid`` and its children (a database server), or ``None`` without one."""
    if pid is None:
        return None
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
            if process is root:  # and its children that have exited (a database server's short-lived backends)
                total += times.children_user + times.children_system
        except psutil.NoSuchProcess:
            pass
    return total


def _each(servers: list[ServerProcess], read) -> list[float]:
    values = []
    for server in servers:
        for process in server.processes():
            try:
                values.append(read(process))
            except psutil.NoSuchProcess:
                pass
    return values


def device_list(tokens: list[str], names: list[str], servers: int) -> list[SimulatedDevice]:
    """Devices split evenly over ``servers`` servers."""
    return [SimulatedDevice(name, token, i % servers) for i, (name, token) in enumerate(zip(names, tokens))]


def _call(port: int, method: str, path: str, body: dict | None = None, token: str | None = None) -> dict:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, headers=headers,
                                     data=None if body is None else json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())
