"""Hostile input gets a 4xx with one JSON line of detail: oversized bodies, wrong types, path tricks, SQL, junk."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from server.api import create_app
from server.config import ServerSettings
from server.db.models import Device, Heartbeat
from tests.server.conftest import enrol, enrolment_token, heartbeat, schedule_request


def test_a_body_over_the_limit_is_413_by_length_and_when_streamed(tmp_path) -> None:
    client = TestClient(create_app(ServerSettings(data_dir=tmp_path / "s", max_body_bytes=4096)))
    device = enrol(client)
    big = json.dumps(heartbeat(reason="x" * 5000)).encode()
    response = client.post("/api/v1/heartbeats", content=big, headers={**device.headers,
                                                                       "Content-Type": "application/json"})
    assert response.status_code == 413 and "4,096 bytes" in response.json()["detail"]

    def chunks():  # no Content-Length: the limit is counted as the body streams in
        for _ in range(8):
            yield b" " * 1024

    streamed = client.post("/api/v1/heartbeats", content=chunks(), headers={**device.headers,
                                                                             "Content-Type": "application/json"})
    assert streamed.status_code == 413
    fits = client.post("/api/v1/heartbeats", json=heartbeat(), headers=device.headers)
    assert fits.status_code == 204


def test_the_default_limit_refuses_a_graph_of_9_megabytes(client, device) -> None:
    body = schedule_request()
    body["graph"]["source"] = "x" * (9 * 1024 * 1024)
    response = client.post("/api/v1/schedule-requests", json=body, headers=device.headers)
    assert response.status_code == 413


def test_wrong_types_and_junk_bodies_are_4xx_never_5xx(client, device) -> None:
    bodies = [b"", b"not json", b"[1, 2", b"null", b"42", b'"a string"', b"{}", b"[" * 50_000 + b"]" * 50_000,
              json.dumps({"graph": [], "device": "rpi4", "memory_budget": "lots"}).encode(),
              json.dumps({**schedule_request(), "extra": 1}).encode(),
              json.dumps({**schedule_request(), "runtime_budget": -1}).encode(),
              json.dumps({**schedule_request(), "memory_budget": 2**70}).encode()]
    for path in ("/api/v1/heartbeats", "/api/v1/schedule-requests", "/api/v1/enrol"):
        for body in bodies:
            response = client.post(path, content=body, headers={**device.headers,
                                                                 "Content-Type": "application/json"})
            assert 400 <= response.status_code < 500, (path, body[:40], response.status_code)
            assert isinstance(response.json()["detail"], str) and "Traceback" not in response.text


def test_path_tricks_and_ids_that_are_not_hex_are_404(client, device) -> None:
    for path in ("/api/v1/schedules/../../etc/passwd", "/api/v1/schedules/..%2F..%2Fetc%2Fpasswd",
                 "/api/v1/schedules/%2e%2e", "/api/v1/schedules/abcdef0123456789%00", "/api/v1/schedules/ABCDEF0123456789",
                 "/api/v1/schedules/' OR 1=1 --", "/api/v1/schedules/" + "a" * 5000,
                 "/api/v1/schedule-requests/../enrol", "/api/v1/schedule-requests/0123456789abcdef" * 2,
                 "/api/v1/schedule-requests/zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz", "/etc/passwd", "/api/v2/schedules"):
        response = client.get(path, headers=device.headers)
        assert response.status_code in (404, 405), (path, response.status_code)
        assert "root:" not in response.text


def test_sql_metacharacters_in_names_are_refused_and_in_text_stored_verbatim(client, device) -> None:
    for name in ("pi'; DROP TABLE devices; --", 'pi" OR "1"="1', "pi/../../x", "pi 1", "", "x" * 65, "pi\x00"):
        response = client.post("/api/v1/enrol", json={"enrolment_token": enrolment_token(client.app),
                                                      "device_name": name})
        assert response.status_code == 422, name
    hostile = "'); DELETE FROM heartbeats; DROP TABLE devices; --"
    assert client.post("/api/v1/heartbeats", json=heartbeat(reason=hostile, last_error=hostile),
                       headers=device.headers).status_code == 204
    with client.app.state.server.db.read() as session:
        assert session.scalar(select(func.count()).select_from(Device)) == 1
        payload = session.scalars(select(Heartbeat.payload)).one()
    assert payload["reason"] == hostile and payload["last_error"] == hostile
    token = {"enrolment_token": "' OR '1'='1", "device_name": "pi-9"}
    assert client.post("/api/v1/enrol", json=token).status_code == 401


def test_names_that_are_path_steps_are_refused_and_dots_inside_a_name_are_fine(client) -> None:
    for name, status in ((".", 422), ("..", 422), (".hidden", 422), ("pi.kitchen-2", 201)):
        response = client.post("/api/v1/enrol", json={"enrolment_token": enrolment_token(client.app),
                                                      "device_name": name})
        assert response.status_code == status, (name, response.text)


def test_an_unexpected_error_is_a_plain_500_and_logged_not_shown(app, caplog) -> None:
    def explode() -> None:
        raise RuntimeError("secret internals at /srv/poet/server.py line 42")

    app.add_api_route("/test-only/explode", explode)
    client = TestClient(app, raise_server_exceptions=False)
    response = client.get("/test-only/explode")
    assert response.status_code == 500
    assert response.json() == {"detail": "internal server error; the server log has the details"}
    assert "secret" in caplog.text and "secret" not in response.text


def test_openapi_describes_every_device_route_and_its_errors(client) -> None:
    spec = client.get("/openapi.json").json()
    assert set(spec["paths"]) == {"/api/v1/server-key", "/api/v1/enrol", "/api/v1/heartbeats",
                                  "/api/v1/schedule-requests", "/api/v1/schedule-requests/{request_id}",
                                  "/api/v1/schedules/{schedule_id}"}
    enrol_responses = spec["paths"]["/api/v1/enrol"]["post"]["responses"]
    assert {"201", "401", "409", "413", "422", "429"} <= set(enrol_responses)
    assert enrol_responses["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert client.get("/docs").status_code == 404  # no docs page: it would load scripts from the internet
