"""The agent's side of the fleet: enrolment, schedules from the server, heartbeats, against a real HTTP server.

The fleet server is the outside world here: :class:`FakeFleet` serves the
device API v1 on 127.0.0.1 with canned answers and records every request;
it signs schedules with a key pair made by the test.  Graphs are synthetic
and the device profile built in, so nothing here needs torch.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import pytest

from agent.config import load_config
from agent.fleet import (FallbackSource, FleetClient, HeartbeatQueue, HeartbeatReporter, ServerScheduleSource)
from agent.schedule_sources import LocalSolveSource, Request, ScheduleCache, get_schedule
from agent.daemon.supervisor import Daemon
from agent.errors import ConfigError, FleetAuthError, FleetError, FleetUnavailableError
from agent.monitors import Eligibility, Verdict
from schedules.device import DeviceProfile
from schedules.errors import InfeasibleBudgetError, ScheduleMismatchError, SignatureError, SolverError
from schedules.plan import plan
from schedules.schedule import Schedule
from schedules.signing import generate_keypair, key_id, load_private_key, load_public_key, sign
from schedules.budgets import budget_class, store_all_peak
from schedules.step_memory import TrainingSpec
from tests.schedules.graphs import linear_graph, with_parameters

GRAPH = with_parameters(linear_graph(4))
DEVICE = DeviceProfile.builtin("rpi4")
SPEC = TrainingSpec.for_optimizer("sgd", momentum=0.9)
BUDGET = store_all_peak(GRAPH, SPEC)  # room for every value and all the state at once: solves at once


# -- the fake fleet server -------------------------------------------------------------------------------------
@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    status: int = 0


@dataclass
class FakeFleet:
    """The device API v1 with canned behaviour; ``requests`` holds every request and the status answered."""

    enrolment_tokens: set[str] = field(default_factory=lambda: {"enrol-1"})
    devices: dict[str, str] = field(default_factory=dict)  # device token -> name
    revoked: set[str] = field(default_factory=set)
    down: bool = False  # every call answers 503
    solve: list[dict[str, Any]] = field(default_factory=lambda: [{"status": "done"}])  # POST, then each GET
    schedules: dict[str, bytes] = field(default_factory=dict)
    signing_key: Any = None  # set: the fleet plans what is uploaded (as the real server does) and signs it
    requests: list[Recorded] = field(default_factory=list)
    heartbeats: list[list[dict[str, Any]]] = field(default_factory=list)

    def serve(self, port: int = 0) -> tuple[ThreadingHTTPServer, str]:
        fleet = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self._answer()

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                record = Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                                  json.loads(raw) if raw else None)
                status, headers, body = fleet.answer(record)
                record.status = status
                fleet.requests.append(record)
                self.send_response(status)
                for key, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server, f"http://127.0.0.1:{server.server_address[1]}"

    def answer(self, r: Recorded) -> tuple[int, dict[str, str], bytes]:
        if self.down:
            return _json(503, {"detail": "down for maintenance"})
        if r.path == "/api/v1/enrol":
            return self._enrol(r.body)
        token = r.headers.get("authorization", "").removeprefix("Bearer ")
        if token not in self.devices or token in self.revoked:
            return _json(401, {"detail": "unknown or revoked device token"})
        if r.path == "/api/v1/heartbeats":
            self.heartbeats.append(r.body)
            return 204, {}, b""
        if r.path == "/api/v1/schedule-requests":
            if self.signing_key is not None:
                self._plan(r.body)
            return _json(202, {"request_id": "req-1", **self._next_solve()})
        if r.path.startswith("/api/v1/schedule-requests/"):
            return _json(200, self._next_solve())
        schedule_id = r.path.rsplit("/", 1)[-1]
        if r.headers.get("if-none-match") == f'"{schedule_id}"':
            return 304, {"ETag": f'"{schedule_id}"'}, b""
        return 200, {"ETag": f'"{schedule_id}"', "Content-Type": "application/json"}, self.schedules[schedule_id]

    def _enrol(self, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        if body["enrolment_token"] not in self.enrolment_tokens:
            return _json(401, {"detail": "unknown, used or expired enrolment token"})
        if body["device_name"] in self.devices.values():
            return _json(409, {"detail": "name taken"})
        self.enrolment_tokens.remove(body["enrolment_token"])
        token = f"device-token-{len(self.devices) + 1}"
        self.devices[token] = body["device_name"]
        return _json(201, {"device_name": body["device_name"], "device_token": token, "server_public_key": ""})

    def _next_solve(self) -> dict[str, Any]:
        answer = self.solve.pop(0) if len(self.solve) > 1 else self.solve[0]
        return {"schedule_id": None, "error": None, "solve_seconds": None, **answer}

    def _plan(self, body: dict[str, Any]) -> None:
        from schedules.graph import TrainingGraph

        result = plan(TrainingGraph.from_dict(body["graph"]), DeviceProfile.from_dict(body["device"]),
                      memory_budget=body["memory_budget"], runtime_budget=body["runtime_budget"], time_limit=30,
                      training=TrainingSpec.from_dict(body["training"]))
        self.publish(sign(result.schedule, self.signing_key))

    def publish(self, schedule: Schedule) -> str:
        """Serve ``schedule`` and have every solve end with it; returns its id."""
        self.schedules[schedule.schedule_id] = schedule.to_json()
        self.solve = [{"status": "done", "schedule_id": schedule.schedule_id}]
        return schedule.schedule_id

    def calls(self, path: str) -> list[Recorded]:
        return [r for r in self.requests if r.path.startswith(path)]


def _json(status: int, body: Any) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps(body).encode()


@pytest.fixture(scope="module")
def planned() -> dict[str, Schedule]:
    """Unsigned schedules for the test's graph and for another graph (planned once for the module)."""
    other = linear_graph(3)
    return {"this": plan(GRAPH, DEVICE, memory_budget=BUDGET, training=SPEC).schedule,
            "other graph": plan(other, DEVICE, memory_budget=BUDGET).schedule}


@pytest.fixture()
def keys(tmp_path: Path) -> dict[str, Any]:
    """The server's key pair (its public key pinned on the device) and a stranger's private key."""
    server_private, server_public = generate_keypair(tmp_path / "keys", "server")
    stranger_private, _ = generate_keypair(tmp_path / "keys", "stranger")
    return {"private": load_private_key(server_private), "public_path": server_public,
            "public": load_public_key(server_public), "stranger": load_private_key(stranger_private)}


@pytest.fixture()
def fleet():
    fake = FakeFleet()
    server, url = fake.serve()
    fake.url = url
    yield fake
    server.shutdown()
    server.server_close()


def client_for(url: str, tmp_path: Path, keys: dict[str, Any], token: str = "enrol-1", name: str = "pi-1",
               timeout: float = 5.0) -> FleetClient:
    return FleetClient(url, device_name=name, token_path=tmp_path / "fleet" / "device-token",
                       public_key=keys["public"], enrolment_token=token, timeout=timeout)


def source_for(client: FleetClient, tmp_path: Path, keys: dict[str, Any], sleeps: list[float] | None = None,
               wait_seconds: float = 60.0) -> ServerScheduleSource:
    clock = [0.0]

    def sleep(seconds: float) -> None:  # the server's time passes without the test waiting for it
        (sleeps if sleeps is not None else []).append(seconds)
        clock[0] += seconds

    return ServerScheduleSource(client, keys["public"], tmp_path / "fleet" / "schedules", wait_seconds=wait_seconds,
                                sleep=sleep, clock=lambda: clock[0])


def closed_port() -> tuple[socket.socket, int]:
    """A port on loopback that refuses connections (bound, not listening) until the socket is closed."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    return held, held.getsockname()[1]


def wait_for(condition: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}")


REQUEST = Request(GRAPH, DEVICE, BUDGET, SPEC)


# -- enrolment -------------------------------------------------------------------------------------------------
def test_a_device_enrols_once_and_then_reuses_its_token_kept_0600(fleet, tmp_path, keys) -> None:
    first = client_for(fleet.url, tmp_path, keys)
    token = first.token()
    path = tmp_path / "fleet" / "device-token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip() == token and fleet.devices == {token: "pi-1"}

    again = client_for(fleet.url, tmp_path, keys)  # the next start of the agent: the token is read, not bought
    again.call("POST", "/heartbeats", body=[{"state": "waiting"}])
    assert len(fleet.calls("/api/v1/enrol")) == 1
    assert fleet.calls("/api/v1/heartbeats")[0].headers["authorization"] == f"Bearer {token}"

    elsewhere = client_for(fleet.url, tmp_path / "other-device", keys, name="pi-2")  # the used token again
    with pytest.raises(FleetAuthError, match="poet-edge server enrol-token"):
        elsewhere.token()
    assert not (tmp_path / "other-device" / "fleet" / "device-token").exists()


def test_a_taken_device_name_is_refused_with_what_to_do(fleet, tmp_path, keys) -> None:
    fleet.enrolment_tokens.add("enrol-2")
    client_for(fleet.url, tmp_path / "a", keys).token()
    with pytest.raises(FleetAuthError, match="choose another device.name"):
        client_for(fleet.url, tmp_path / "b", keys, token="enrol-2").token()


# -- schedules -------------------------------------------------------------------------------------------------
def test_a_schedule_is_solved_verified_cached_and_then_revalidated_with_its_etag(fleet, tmp_path, keys,
                                                                                planned) -> None:
    schedule_id = fleet.publish(sign(planned["this"], keys["private"]))
    fleet.solve = [{"status": "queued"}, {"status": "solving"}, {"status": "solving"},
                   {"status": "done", "schedule_id": schedule_id}]
    sleeps: list[float] = []
    source = source_for(client_for(fleet.url, tmp_path, keys), tmp_path, keys, sleeps)
    cache = ScheduleCache(tmp_path / "cache", keys["public_path"])

    schedule, origin = get_schedule(source, cache, REQUEST)
    assert schedule.schedule_id == schedule_id and origin == f"fleet server {fleet.url}"
    assert sleeps == [0.5, 1.0, 2.0]  # polling backs off
    (upload,) = fleet.calls("/api/v1/schedule-requests")[:1]
    assert upload.body == json.loads(json.dumps({"graph": GRAPH.to_dict(), "device": DEVICE.to_dict(),
                                                 "memory_budget": BUDGET, "runtime_budget": None,
                                                 "training": SPEC.to_dict()}))
    kept = json.loads(cache.path(REQUEST).read_bytes())
    assert kept["signature"]["key_id"] == key_id(keys["public"])  # kept as the server signed it

    asked = len(fleet.requests)
    assert get_schedule(source, cache, REQUEST)[1].startswith("cache")  # the cache answers: no request
    assert len(fleet.requests) == asked

    again = source.fetch(REQUEST)  # asked again (another budget, a cache refused): the ETag saves the download
    download = fleet.calls(f"/api/v1/schedules/{schedule_id}")[-1]
    assert download.headers["if-none-match"] == f'"{schedule_id}"' and download.status == 304
    assert again.schedule_id == schedule_id and again.signature == schedule.signature

    copy = tmp_path / "fleet" / "schedules" / f"{schedule_id}.json"
    copy.write_bytes(copy.read_bytes().replace(b'"memory_budget":', b'"memory_budget":1'))  # tampered on disk
    assert source.fetch(REQUEST).schedule_id == schedule_id  # refused, downloaded whole again
    assert [r.status for r in fleet.calls(f"/api/v1/schedules/{schedule_id}")][-2:] == [304, 200]


def test_a_schedule_signed_by_another_key_is_refused_and_not_replaced_by_a_local_solve(fleet, tmp_path, keys,
                                                                                       planned) -> None:
    schedule_id = fleet.publish(sign(planned["this"], keys["stranger"]))
    source = FallbackSource([source_for(client_for(fleet.url, tmp_path, keys), tmp_path, keys),
                             LocalSolveSource(10)])
    with pytest.raises(SignatureError, match="not by the trusted key"):
        source.fetch(REQUEST)
    assert not (tmp_path / "fleet" / "schedules" / f"{schedule_id}.json").exists()


def test_a_schedule_planned_for_another_graph_is_refused(fleet, tmp_path, keys, planned) -> None:
    fleet.publish(sign(planned["other graph"], keys["private"]))
    with pytest.raises(FleetError, match="does not fit this request.*planned for graph"):
        source_for(client_for(fleet.url, tmp_path, keys), tmp_path, keys).fetch(REQUEST)


def test_a_schedule_planned_for_the_budgets_class_fits_and_one_for_more_or_far_less_does_not() -> None:
    """A fleet server plans for the budget's class (rounded down, at most 1.6 % less): that schedule is taken."""
    asked = 2 * BUDGET + 12345
    for_class = plan(GRAPH, DEVICE, memory_budget=budget_class(asked), training=SPEC).schedule
    assert budget_class(asked) < asked
    Request(GRAPH, DEVICE, asked, SPEC).check(for_class)
    Request(GRAPH, DEVICE, budget_class(asked), SPEC).check(for_class)
    for budget in (budget_class(asked) - 1, 2 * asked):  # less than planned for; far more (a slower plan)
        with pytest.raises(ScheduleMismatchError, match="not this device's training.memory_budget"):
            Request(GRAPH, DEVICE, budget, SPEC).check(for_class)


@pytest.mark.parametrize("answer, error, words", [
    ({"status": "failed", "error": "infeasible: no schedule fits"}, InfeasibleBudgetError, "raise training"),
    ({"status": "failed", "error": "HiGHS crashed"}, SolverError, "HiGHS crashed"),
    ({"status": "timed_out", "error": "time limit", "solve_seconds": 600.0}, SolverError, "after 600 s"),
], ids=["infeasible", "failed", "timed_out"])
def test_a_solve_the_server_gave_up_on_is_the_matching_error_not_a_fallback(fleet, tmp_path, keys, answer, error,
                                                                             words) -> None:
    fleet.solve = [{"status": "queued"}, answer]
    said: list[str] = []
    source = FallbackSource([source_for(client_for(fleet.url, tmp_path, keys), tmp_path, keys),
                             LocalSolveSource(10)], say=said.append)
    with pytest.raises(error, match=words):
        source.fetch(REQUEST)
    assert said == []


def test_the_wait_for_a_solve_is_bounded(fleet, tmp_path, keys) -> None:
    fleet.solve = [{"status": "queued"}]
    sleeps: list[float] = []
    source = source_for(client_for(fleet.url, tmp_path, keys), tmp_path, keys, sleeps, wait_seconds=20.0)
    with pytest.raises(FleetUnavailableError, match="within 20 s"):
        source.fetch(REQUEST)
    assert sum(sleeps) <= 20.0 and max(sleeps) == 5.0


def test_an_unreachable_server_falls_back_to_a_local_solve_and_says_so(tmp_path, keys) -> None:
    held, port = closed_port()
    said: list[str] = []
    with held:
        client = client_for(f"http://127.0.0.1:{port}", tmp_path, keys, timeout=2.0)
        source = FallbackSource([source_for(client, tmp_path, keys), LocalSolveSource(30)], say=said.append)
        schedule, origin = get_schedule(source, ScheduleCache(tmp_path / "cache", keys["public_path"]), REQUEST)
    schedule.check_graph(GRAPH)
    assert len(said) == 1 and "unreachable" in said[0] and "falling back to local solve (30 s limit)" in said[0]
    assert origin == f"local solve (30 s limit), fleet server http://127.0.0.1:{port} unreachable"
    assert not (tmp_path / "fleet" / "device-token").exists()


def test_a_server_answering_503_is_unreachable_too(fleet, tmp_path, keys) -> None:
    client_for(fleet.url, tmp_path, keys).token()
    fleet.down = True
    said: list[str] = []
    source = FallbackSource([source_for(client_for(fleet.url, tmp_path, keys), tmp_path, keys),
                             LocalSolveSource(30)], say=said.append)
    source.fetch(REQUEST).check_graph(GRAPH)
    assert "503" in said[0] and source.description.startswith("local solve")


def test_the_config_puts_the_server_first_and_trusts_its_pinned_key(tmp_path, keys) -> None:
    pytest.importorskip("torch")  # prepare builds models: it imports torch
    from agent.prepare import schedule_source, trusted_key

    config = load_config(write_config(tmp_path, server={"url": "https://fleet.example:8080",
                                                        "enrolment_token": "enrol-1",
                                                        "public_key": str(keys["public_path"])}))
    source = schedule_source(config)
    assert isinstance(source, FallbackSource)
    assert [type(s) for s in source.sources] == [ServerScheduleSource, LocalSolveSource]
    assert trusted_key(config) == keys["public_path"]


# -- heartbeats ------------------------------------------------------------------------------------------------
def status(steps: int, state: str = "training", **more: Any) -> dict[str, Any]:
    return {"state": state, "reason": "test", "steps_done": steps, "last_error": None, **more}


def test_heartbeats_wait_on_disk_bounded_and_arrive_in_order_in_one_list(tmp_path, keys, caplog) -> None:
    held, port = closed_port()
    clock = [0.0]  # the reporter's clock: its retries wait until the test moves it
    queue = HeartbeatQueue(tmp_path / "fleet" / "heartbeats.jsonl", limit=5)
    reporter = HeartbeatReporter(client_for(f"http://127.0.0.1:{port}", tmp_path, keys, timeout=2.0), queue,
                                 interval=0.05, clock=lambda: clock[0])
    fake = FakeFleet()
    try:
        reporter.report(status(0))
        wait_for(lambda: "heartbeats wait on disk" in caplog.text, 10, "the first delivery to fail")
        for steps in range(1, 8):
            reporter.report(status(steps, loss=float("nan") if steps == 7 else 0.5))
        assert [h["steps_done"] for _, h in queue.pending()] == [3, 4, 5, 6, 7]  # the oldest dropped
        assert len((tmp_path / "fleet" / "heartbeats.jsonl").read_text().splitlines()) <= 6
        held.close()
        server, _ = fake.serve(port)  # the server is back
        try:
            clock[0] = 1000.0  # past the retry time
            wait_for(lambda: len(queue) == 0, 15, "the queue to empty")
        finally:
            server.shutdown()
            server.server_close()
    finally:
        held.close()
        reporter.close(timeout=5)
    assert [[h["steps_done"] for h in sent] for sent in fake.heartbeats] == [[3, 4, 5, 6, 7]]
    assert fake.heartbeats[0][-1]["loss"] is None  # NaN goes as null: strict JSON
    assert all(h["software_version"] and h["sent_at"] > 0 for h in fake.heartbeats[0])
    assert len(fake.calls("/api/v1/enrol")) == 1


def test_a_torn_last_line_in_the_queue_is_skipped(tmp_path) -> None:
    path = tmp_path / "heartbeats.jsonl"
    lines = [json.dumps({"seq": n, "heartbeat": status(n)}) for n in (1, 2)]
    path.write_text("\n".join(lines) + "\n" + lines[1][:17])  # killed in the middle of the third line
    queue = HeartbeatQueue(path, limit=10)
    assert [seq for seq, _ in queue.pending()] == [1, 2]
    queue.append(status(3))
    assert [(seq, h["steps_done"]) for seq, h in queue.pending()] == [(1, 1), (2, 2), (3, 3)]
    assert all(json.loads(line) for line in path.read_text().splitlines())
    queue.remove_through(2)
    assert [seq for seq, _ in HeartbeatQueue(path, limit=10).pending()] == [3]


def test_a_revoked_device_stops_sending_and_the_status_says_so(fleet, tmp_path, keys) -> None:
    client = client_for(fleet.url, tmp_path, keys)
    fleet.revoked.add(client.token())
    reporter = HeartbeatReporter(client, HeartbeatQueue(tmp_path / "fleet" / "heartbeats.jsonl", 100), 0.01)
    reporter.report(status(1))
    wait_for(lambda: reporter.problem, 5, "the reporter to see the revocation")
    assert "revoked by the fleet server" in reporter.problem
    reporter._thread.join(5)
    reporter.report(status(2, state="waiting"))
    time.sleep(0.1)
    assert [r.status for r in fleet.calls("/api/v1/heartbeats")] == [401]  # tried once, then never again

    daemon = Daemon(load_config(write_config(tmp_path)), eligibility=Eligibility([Unplugged()]), reporter=reporter,
                    clock=lambda: 0.0)
    daemon._tick(0.0)
    assert "revoked by the fleet server" in daemon.status["last_error"]


# -- the supervisor's rhythm -----------------------------------------------------------------------------------
class Unplugged:
    """A power monitor that always reads 'on battery'."""

    name = "power"

    def check(self, now: float) -> Verdict:
        return Verdict("power", False, "on battery 43%")


class Recording:
    """The fleet seen from the agent: every status the reporter is given."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []

    def report(self, status: dict[str, Any]) -> None:
        self.reports.append(status)


def test_the_supervisor_reports_every_heartbeat_interval_not_only_on_state_changes(tmp_path) -> None:
    config = load_config(write_config(tmp_path, server={"heartbeat_seconds": 30}))
    reporter = Recording()
    daemon = Daemon(config, eligibility=Eligibility([Unplugged()]), reporter=reporter, clock=lambda: 0.0)
    for now in (0.0, 10.0, 20.0, 31.0, 45.0, 62.0):
        daemon._tick(now)
    assert len(reporter.reports) == 3  # at 0, 31 and 62 s: the state never changed
    short = Daemon(load_config(write_config(tmp_path, server={"heartbeat_seconds": 1})),
                   eligibility=Eligibility([Unplugged()]), reporter=Recording(), clock=lambda: 0.0)
    short._tick(100.0)
    assert short._timeout(100.2) == pytest.approx(0.8)  # the loop wakes for the next heartbeat


# -- configuration ---------------------------------------------------------------------------------------------
def write_config(directory: Path, server: dict[str, Any] | None = None) -> Path:
    """A minimal valid agent config (nothing in it is run), with a ``[server]`` table."""
    text = (f'[device]\nname = "pi-1"\nstate_dir = "{directory / "state"}"\n[workload]\nmodel = "tests.engine.models:mlp"\n'
            f'[data]\npath = "{directory / "data.csv"}"\n[training]\nmemory_budget = "1MB"\n'
            '[eligibility]\npoll_seconds = 5\n')
    if server:
        text += "[server]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in server.items())
    path = directory / "agent.toml"
    path.write_text(text)
    return path


def test_server_settings_are_checked_with_every_problem_at_once(tmp_path) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(write_config(tmp_path, server={"url": "ftp://fleet", "queue_limit": 0, "heartbeat_seconds": -1,
                                                   "ca_file": "missing.pem", "colour": "blue"}))
    message = str(error.value)
    for expected in ("server.url = 'ftp://fleet'", "server.url needs server.public_key", "queue_limit must be "
                     "positive", "heartbeat_seconds must be positive", "server.ca_file", "no such file",
                     "server.colour: unknown key", "server.enrolment_token is required"):
        assert expected in message
    config = load_config(write_config(tmp_path))
    assert config.server.url == "" and config.server.heartbeat_seconds == 30 and config.server.queue_limit == 1000
    os.makedirs(config.fleet_dir)
    config.device_token_path.write_text("device-token-1\n")  # enrolled: no enrolment token needed any more
    pem = tmp_path / "server.pub"
    pem.write_text("not checked here")
    assert load_config(write_config(tmp_path, server={"url": "https://fleet.example:8080",
                                                      "public_key": str(pem)})).server.public_key == pem


# -- the whole agent -------------------------------------------------------------------------------------------
def test_a_running_agent_trains_on_the_servers_schedule_and_reports_until_it_stops(fleet, tmp_path, keys) -> None:
    pytest.importorskip("torch")  # the training worker
    from tests.agent.daemon_helpers import FakeDevice, read_status, start_agent, stop, write_config, write_csv

    fleet.signing_key = keys["private"]
    config = write_config(tmp_path, FakeDevice(tmp_path / "root"), write_csv(tmp_path / "data.csv"),
                          training_steps_per_window=5, server_url=fleet.url, server_enrolment_token="enrol-1",
                          server_public_key=str(keys["public_path"]), server_heartbeat_seconds=0.2)
    agent = start_agent(config)
    try:
        wait_for(lambda: read_status(tmp_path).get("steps_done", 0) >= 5, 240, "five steps")
        assert read_status(tmp_path)["schedule_from"] == f"fleet server {fleet.url}"
        assert stop(agent) == 0
    finally:
        if agent.poll() is None:
            stop(agent, signal.SIGKILL)
    sent = [h for batch in fleet.heartbeats for h in batch]
    states = [h["state"] for h in sent]
    assert {"waiting", "preparing", "training"} <= set(states) and states[-1] == "stopped"
    assert max(h["steps_done"] for h in sent) >= 5 and all(h["device"] == "test-device" for h in sent)
    assert len(fleet.calls("/api/v1/enrol")) == 1  # the daemon and its worker share one enrolment
