"""Schedule requests: solved in worker processes, signed, stored once, downloaded with ETag; limits honoured."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures.process import _ExecutorManagerThread

import psutil
import pytest
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from fastapi.testclient import TestClient
from sqlalchemy import select

from common.canonical import canonical_json
from schedules.budgets import budget_class
from schedules.graph import TrainingGraph
from schedules.schedule import Schedule
from schedules.signing import verify_document
from server.api import create_app
from server.config import ServerSettings
from server.datadir import open_database
from server.db.models import AuditEntry, DeviceSchedule
from server import solve_requests
from server.solve_requests import parse_solve_input
from tests.schedules.graphs import linear_graph
from tests.server.conftest import enrol, metric, schedule_request, wait_for_solve


def ask(client: TestClient, headers: dict[str, str], body: dict) -> dict:
    response = client.post("/api/v1/schedule-requests", json=body, headers=headers)
    assert response.status_code == 202, response.text
    return response.json()


def test_upload_solve_download_and_verify_as_an_agent_does(solving_client) -> None:
    device = enrol(solving_client)
    graph = linear_graph(8)
    accepted = ask(solving_client, device.headers, schedule_request(graph, memory_budget=10**9))
    assert accepted["status"] in ("queued", "solving", "done") and len(accepted["request_id"]) == 32
    status = wait_for_solve(solving_client, accepted["request_id"], device.headers)
    assert status["status"] == "done" and status["error"] is None and status["solve_seconds"] > 0
    download = solving_client.get(f"/api/v1/schedules/{status['schedule_id']}", headers=device.headers)
    assert download.status_code == 200 and download.headers["content-type"] == "application/json"
    public_key = load_pem_public_key(solving_client.get("/api/v1/server-key").json()["public_key"].encode())
    schedule = Schedule.from_json(download.content, public_key=public_key)  # the signature verifies
    schedule.check_graph(graph)  # and it was planned for this graph
    assert schedule.schedule_id == status["schedule_id"] and schedule.memory_budget == budget_class(10**9)
    tampered = json.loads(download.content)
    tampered["predicted_peak_bytes"] += 1
    with pytest.raises(Exception, match="does not verify"):
        verify_document(tampered, public_key)


def test_etag_and_if_none_match(solving_client) -> None:
    device = enrol(solving_client)
    status = wait_for_solve(solving_client, ask(solving_client, device.headers, schedule_request())["request_id"],
                            device.headers)
    url = f"/api/v1/schedules/{status['schedule_id']}"
    first = solving_client.get(url, headers=device.headers)
    etag = first.headers["ETag"]
    assert etag == f'"{status["schedule_id"]}"'
    for sent in (etag, f"W/{etag}", f'"0000000000000000", {etag}', "*"):
        again = solving_client.get(url, headers={**device.headers, "If-None-Match": sent})
        assert again.status_code == 304 and again.content == b"" and again.headers["ETag"] == etag, sent
    changed = solving_client.get(url, headers={**device.headers, "If-None-Match": '"0000000000000000"'})
    assert changed.status_code == 200 and changed.content == first.content


def test_the_schedule_a_device_uses_is_dated_by_its_first_download_not_each_check(solving_client) -> None:
    device = enrol(solving_client)
    first, second = (wait_for_solve(solving_client, ask(solving_client, device.headers, body)["request_id"],
                                    device.headers)["schedule_id"]
                     for body in (schedule_request(memory_budget=10**9),
                                  schedule_request(memory_budget=10**9, runtime_budget=2.0)))

    def used() -> tuple[str, float]:
        with solving_client.app.state.server.db.read() as session:
            return session.execute(select(DeviceSchedule.schedule_id, DeviceSchedule.downloaded_at)).one()

    assert solving_client.get(f"/api/v1/schedules/{first}", headers=device.headers).status_code == 200
    downloaded = used()
    time.sleep(0.05)
    check = {**device.headers, "If-None-Match": f'"{first}"'}
    assert solving_client.get(f"/api/v1/schedules/{first}", headers=check).status_code == 304
    assert used() == downloaded and downloaded[0] == first
    assert solving_client.get(f"/api/v1/schedules/{second}", headers=device.headers).status_code == 200
    switched = used()
    assert switched[0] == second and switched[1] > downloaded[1]


def test_budgets_a_few_bytes_apart_share_one_solve_planned_for_their_class(solving_client) -> None:
    """One device asking budget after budget a byte apart costs one solve, and every device gets a schedule
    that fits its own budget."""
    devices = [enrol(solving_client, f"pi-{i}") for i in range(3)]
    budgets = [10**9 + 1, 10**9 + 4096, 10**9 + 7]
    ids = {ask(solving_client, d.headers, schedule_request(memory_budget=b))["request_id"]
           for d, b in zip(devices, budgets)}
    assert len(ids) == 1
    status = wait_for_solve(solving_client, ids.pop(), devices[0].headers)
    document = solving_client.get(f"/api/v1/schedules/{status['schedule_id']}", headers=devices[0].headers)
    planned = json.loads(document.content)["memory_budget"]
    assert planned == budget_class(10**9) and all(10**9 * 63 / 64 <= planned <= b for b in budgets)


def test_identical_requests_share_one_solve_and_other_budgets_do_not(solving_client) -> None:
    first, second = enrol(solving_client, "pi-1"), enrol(solving_client, "pi-2")
    body = schedule_request(memory_budget=10**9)
    ids = {ask(solving_client, d.headers, body)["request_id"] for d in (first, second, first)}
    reordered = dict(reversed(list(body.items())))  # same content, other key order
    ids.add(ask(solving_client, second.headers, reordered)["request_id"])
    assert len(ids) == 1
    status = wait_for_solve(solving_client, ids.pop(), first.headers)
    again = ask(solving_client, second.headers, body)
    assert again["status"] == "done" and again["schedule_id"] == status["schedule_id"]
    other = ask(solving_client, first.headers, schedule_request(memory_budget=10**9, runtime_budget=2.0))
    assert wait_for_solve(solving_client, other["request_id"], first.headers)["status"] == "done"
    text = solving_client.get("/metrics").text
    assert metric(text, "poet_server_solve_seconds_count", status="done") == 2  # two solves for five requests
    assert metric(text, "poet_server_solve_requests", status="done") == 2


def test_an_infeasible_budget_fails_with_the_planners_message(solving_client) -> None:
    device = enrol(solving_client)
    accepted = ask(solving_client, device.headers, schedule_request(memory_budget=1))
    status = wait_for_solve(solving_client, accepted["request_id"], device.headers)
    assert status["status"] == "failed" and status["schedule_id"] is None
    assert status["error"].startswith("infeasible") and "budget" in status["error"]
    again = ask(solving_client, device.headers, schedule_request(memory_budget=1))  # the same request, answered
    assert (again["status"], again["error"]) == ("failed", status["error"])  # at once with why, not asked twice


def test_a_solve_past_its_limit_is_stopped_and_reported_timed_out(tmp_path, poet_graphs) -> None:
    # plan() on resnet50 (335 nodes) takes seconds whatever its time limit: building the MILP is not interruptible
    settings = ServerSettings(data_dir=tmp_path / "s", solve_time_limit=0.5, solve_timeout_margin=1.0)
    graph = TrainingGraph.load(poet_graphs / "resnet50_a72.json")
    with TestClient(create_app(settings)) as client:
        device = enrol(client)
        accepted = ask(client, device.headers, schedule_request(graph, memory_budget=60_000_000, runtime_budget=1.2))
        started = time.monotonic()
        status = wait_for_solve(client, accepted["request_id"], device.headers, timeout=60)
        assert status["status"] == "timed_out" and status["schedule_id"] is None
        assert "time limit of 0.5 s" in status["error"] and "stopped" in status["error"]
        assert 1.5 <= status["solve_seconds"] < 10 and time.monotonic() - started < 30
        # the killed worker was replaced: the next request is solved
        after = ask(client, device.headers, schedule_request())
        assert wait_for_solve(client, after["request_id"], device.headers)["status"] == "done"
        text = client.get("/metrics").text
        assert metric(text, "poet_server_solve_seconds_count", status="timed_out") == 1


def test_a_device_cancels_only_its_own_waiting_request_and_asking_again_queues_it(client) -> None:
    asker, other = enrol(client, "pi-1"), enrol(client, "pi-2")
    accepted = ask(client, asker.headers, schedule_request(memory_budget=10**9))  # no lifespan: it stays queued
    url = f"/api/v1/schedule-requests/{accepted['request_id']}"
    refused = client.delete(url, headers=other.headers)
    assert refused.status_code == 409 and "another device" in refused.json()["detail"]
    cancelled = client.delete(url, headers=asker.headers)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    status = client.get(url, headers=other.headers).json()
    assert status["status"] == "cancelled" and status["error"] == "cancelled by device pi-1"
    again = client.delete(url, headers=asker.headers)
    assert again.status_code == 409 and "cancelled already" in again.json()["detail"]
    assert client.delete("/api/v1/schedule-requests/" + "0" * 32, headers=asker.headers).status_code == 404
    assert client.delete(url).status_code == 401
    requeued = ask(client, other.headers, schedule_request(memory_budget=10**9))  # the same request, wanted again
    assert (requeued["request_id"], requeued["status"]) == (accepted["request_id"], "queued")
    assert client.delete(url, headers=other.headers).status_code == 200  # now it is pi-2's
    with client.app.state.server.db.read() as session:
        entries = session.execute(select(AuditEntry.actor, AuditEntry.target).where(AuditEntry.action == "solve.cancel")
                                  .order_by(AuditEntry.id)).all()
    assert entries == [("device:pi-1", f"request {accepted['request_id']}"),
                       ("device:pi-2", f"request {accepted['request_id']}")]


def planner_processes() -> list[int]:
    """This process's planner workers (spawned children; not the resource tracker)."""
    return [p.pid for p in psutil.Process().children(recursive=True) if "spawn_main" in " ".join(p.cmdline())]


def stopped(pid: int) -> bool:
    """Whether process ``pid`` has ended (gone, or a zombie not yet reaped): it may go between two looks."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_cancelling_a_running_solve_stops_its_planner_and_the_next_request_is_solved(tmp_path, poet_graphs) -> None:
    # plan() on resnet50 (335 nodes) takes seconds: long enough to be cancelled while it runs
    settings = ServerSettings(data_dir=tmp_path / "s", solve_time_limit=60)
    graph = TrainingGraph.load(poet_graphs / "resnet50_a72.json")
    with TestClient(create_app(settings)) as client:
        device = enrol(client)
        accepted = ask(client, device.headers, schedule_request(graph, memory_budget=60_000_000, runtime_budget=1.2))
        url = f"/api/v1/schedule-requests/{accepted['request_id']}"
        deadline = time.monotonic() + 30
        while client.get(url, headers=device.headers).json()["status"] != "solving":
            assert time.monotonic() < deadline, "the solve never started"
            time.sleep(0.05)
        (worker,) = planner_processes()
        assert client.delete(url, headers=device.headers).json()["status"] == "cancelled"
        deadline = time.monotonic() + 10
        while not stopped(worker):
            assert time.monotonic() < deadline, "the planner process still runs"
            time.sleep(0.05)
        after = ask(client, device.headers, schedule_request())
        assert wait_for_solve(client, after["request_id"], device.headers)["status"] == "done"
        assert client.get(url, headers=device.headers).json()["status"] == "cancelled"  # not overwritten
        text = client.get("/metrics").text
        assert metric(text, "poet_server_solve_seconds_count", status="cancelled") == 1
        assert metric(text, "poet_server_solve_requests", status="cancelled") == 1
        # stopping joins every pool's manager thread, the cancelled worker's too: one left running at interpreter
        # exit races concurrent.futures' exit hook for its pipe (an EBADF traceback when the server is stopped)
        client.app.state.server.solves.stop()
        assert not [t for t in threading.enumerate() if isinstance(t, _ExecutorManagerThread) and t.is_alive()]


def test_requests_queued_or_cut_short_when_the_server_stopped_are_solved_after_it_starts(settings) -> None:
    db = open_database(settings)  # the server is not running
    items = [parse_solve_input(**{k: v for k, v in schedule_request(memory_budget=budget).items()}, max_nodes=100)
             for budget in (10**9, 10**8)]
    waiting, _ = solve_requests.enqueue(db, items[0], time_limit=30, max_queued=10, now=time.time())
    cut_short, _ = solve_requests.enqueue(db, items[1], time_limit=30, max_queued=10, now=time.time())
    assert solve_requests.claim(db, cut_short.id, 30, time.time()) is not None  # solving when the server died
    assert solve_requests.find(db, cut_short.id).status == "solving"
    with TestClient(create_app(settings)) as client:
        device = enrol(client)
        for request_id in (waiting.id, cut_short.id):
            assert wait_for_solve(client, request_id, device.headers)["status"] == "done"


def test_bad_graphs_and_profiles_are_422_with_the_loaders_message(client, device) -> None:
    body = schedule_request()
    body["graph"]["edges"].append([0, 999])
    response = client.post("/api/v1/schedule-requests", json=body, headers=device.headers)
    assert response.status_code == 422 and response.json()["detail"].startswith("graph: ")
    body = schedule_request()
    body["device"]["pagein_bandwidth_bps"] = -5
    response = client.post("/api/v1/schedule-requests", json=body, headers=device.headers)
    assert response.status_code == 422 and "pagein_bandwidth_bps" in response.json()["detail"]
    body = schedule_request()
    body["graph"] = {"nodes": "everything"}
    assert client.post("/api/v1/schedule-requests", json=body, headers=device.headers).status_code == 422
    for budget in (0, -1, "1MB", 1.5, None):
        body = {**schedule_request(), "memory_budget": budget}
        response = client.post("/api/v1/schedule-requests", json=body, headers=device.headers)
        assert response.status_code == 422 and "memory_budget" in response.json()["detail"], budget
    assert solve_requests.count_by_status(client.app.state.server.db)["queued"] == 0


def test_a_graph_over_the_node_limit_is_refused_before_it_is_queued(tmp_path) -> None:
    client = TestClient(create_app(ServerSettings(data_dir=tmp_path / "s", max_graph_nodes=10)))
    device = enrol(client)
    response = client.post("/api/v1/schedule-requests", json=schedule_request(linear_graph(8)),
                           headers=device.headers)
    assert response.status_code == 422 and "at most 10" in response.json()["detail"]


def test_a_full_queue_answers_503(tmp_path) -> None:
    client = TestClient(create_app(ServerSettings(data_dir=tmp_path / "s", max_queued_solves=1)))  # no solving
    device = enrol(client)
    assert client.post("/api/v1/schedule-requests", json=schedule_request(memory_budget=10**9),
                       headers=device.headers).status_code == 202
    full = client.post("/api/v1/schedule-requests", json=schedule_request(memory_budget=10**8),
                       headers=device.headers)
    assert full.status_code == 503 and "waiting" in full.json()["detail"]
    assert int(full.headers["Retry-After"]) >= 1  # when to ask again, as every 503 says


def test_one_device_asking_budget_after_budget_cannot_hold_back_the_others(tmp_path) -> None:
    client = TestClient(create_app(ServerSettings(data_dir=tmp_path / "s", max_queued_solves_per_device=3)))
    greedy, patient = enrol(client, "pi-1"), enrol(client, "pi-2")
    budgets = [int(10**9 * (1 + i / 20)) for i in range(5)]  # 5 % apart: each its own class
    codes = [client.post("/api/v1/schedule-requests", json=schedule_request(memory_budget=budget),
                         headers=greedy.headers).status_code for budget in budgets[:4]]
    assert codes == [202, 202, 202, 429]
    refused = client.post("/api/v1/schedule-requests", json=schedule_request(memory_budget=budgets[4]),
                          headers=greedy.headers)
    assert "3 schedule requests waiting" in refused.json()["detail"]
    assert int(refused.headers["Retry-After"]) >= 1  # every 429 says when to come back (docs/api.md)
    assert client.post("/api/v1/schedule-requests", json=schedule_request(memory_budget=10**9),
                       headers=greedy.headers).status_code == 202  # one it asked for already is answered
    assert client.post("/api/v1/schedule-requests", json=schedule_request(memory_budget=5 * 10**8),
                       headers=patient.headers).status_code == 202


def test_dedupe_key_is_the_graph_structure_profile_and_budgets() -> None:
    body = schedule_request(linear_graph(6), memory_budget=5000)
    base = parse_solve_input(**body, max_nodes=100)
    retimed = TrainingGraph.from_dict(body["graph"])
    retimed = retimed.with_nodes(node.__class__(**{**node.__dict__, "compute_ms": node.compute_ms * 2})
                                 for node in retimed.nodes)
    same_structure = parse_solve_input(**{**body, "graph": retimed.to_dict()}, max_nodes=100)
    assert base.dedupe_key == same_structure.dedupe_key  # timings are not part of the graph's identity
    other_device = parse_solve_input(**schedule_request(linear_graph(6), memory_budget=5000, device="rpi5"),
                                     max_nodes=100)
    same_class = parse_solve_input(**{**body, "memory_budget": 5001}, max_nodes=100)
    assert same_class.dedupe_key == base.dedupe_key and same_class.memory_budget == base.memory_budget <= 5000
    other_budget = parse_solve_input(**{**body, "memory_budget": 5200}, max_nodes=100)
    assert len({base.dedupe_key, other_device.dedupe_key, other_budget.dedupe_key}) == 3
    assert canonical_json(base.device.to_dict()) == canonical_json(same_structure.device.to_dict())
