"""Enrolment and device tokens: single-use enrolment tokens with expiry, hashed storage, revocation, rate limits."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient
from sqlalchemy import select

from server.config import ServerSettings
from server.api import create_app
from server.db.models import Device, EnrolmentToken
from server.devices import ENROLMENT_REFUSED, create_enrolment_token, revoke
from server.tokens import token_hash
from tests.server.conftest import enrol, enrolment_token, heartbeat


def post_enrol(client: TestClient, token: str, name: str = "pi-1"):
    return client.post("/api/v1/enrol", json={"enrolment_token": token, "device_name": name})


def test_a_valid_token_enrols_once_and_the_device_token_then_authenticates(client) -> None:
    token = enrolment_token(client.app)
    response = post_enrol(client, token)
    assert response.status_code == 201
    body = response.json()
    key = client.get("/api/v1/server-key").json()
    assert body["device_name"] == "pi-1" and body["server_public_key"] == key["public_key"]
    assert body["key_id"] == key["key_id"] and body["device_token"] != token
    headers = {"Authorization": f"Bearer {body['device_token']}"}
    assert client.post("/api/v1/heartbeats", json=heartbeat(), headers=headers).status_code == 204


def test_tokens_are_stored_only_as_hashes(client) -> None:
    token = enrolment_token(client.app)
    device_token = post_enrol(client, token).json()["device_token"]
    with client.app.state.server.db.read() as session:
        stored_enrolment = session.scalars(select(EnrolmentToken.token_hash)).all()
        stored_device = session.scalars(select(Device.token_hash)).all()
    assert stored_enrolment == [token_hash(token)] and stored_device == [token_hash(device_token)]
    assert token not in stored_enrolment and device_token not in stored_device


def test_wrong_replayed_and_expired_tokens_get_the_same_401(client) -> None:
    db = client.app.state.server.db
    used = enrolment_token(client.app)
    assert post_enrol(client, used, "first").status_code == 201
    expired, _ = create_enrolment_token(db, 60, time.time() - 120)  # made two minutes ago, valid for one
    answers = [post_enrol(client, token, "second") for token in ("not-a-token", used, expired)]
    assert [a.status_code for a in answers] == [401, 401, 401]
    assert {a.json()["detail"] for a in answers} == {ENROLMENT_REFUSED}  # no oracle: one message for all three
    with db.read() as session:
        assert session.scalars(select(Device.name)).all() == ["first"]
        assert session.scalar(select(EnrolmentToken.used_by).where(EnrolmentToken.token_hash == token_hash(used))) \
            == "first"


def test_a_taken_name_is_409_and_does_not_spend_the_token(client) -> None:
    enrol(client, "pi-1")
    token = enrolment_token(client.app)
    assert post_enrol(client, token, "pi-1").status_code == 409
    assert post_enrol(client, token, "pi-2").status_code == 201  # the same token still works once


def test_a_revoked_device_is_refused_and_may_enrol_again_with_a_new_token(client) -> None:
    device = enrol(client, "pi-1")
    assert revoke(client.app.state.server.db, "pi-1", time.time()) is True
    refused = client.post("/api/v1/heartbeats", json=heartbeat(), headers=device.headers)
    assert refused.status_code == 401 and "revoked" in refused.json()["detail"]
    assert refused.headers["WWW-Authenticate"] == "Bearer"
    again = enrol(client, "pi-1")
    assert client.post("/api/v1/heartbeats", json=heartbeat(), headers=again.headers).status_code == 204
    assert client.post("/api/v1/heartbeats", json=heartbeat(), headers=device.headers).status_code == 401


def test_missing_malformed_and_unknown_device_tokens_are_401(client, device) -> None:
    for headers in ({}, {"Authorization": "Basic cGk6cGk="}, {"Authorization": "Bearer"},
                    {"Authorization": "Bearer " + "x" * 300}, {"Authorization": f"Bearer {device.token}x"}):
        response = client.post("/api/v1/heartbeats", json=heartbeat(), headers=headers)
        assert response.status_code == 401, headers


def device_routes(client: TestClient) -> dict[tuple[str, str], str]:
    """Every operation the OpenAPI document secures with a device token: (method, path) -> a concrete path."""
    routes = {}
    for path, operations in client.get("/openapi.json").json()["paths"].items():
        for method, operation in operations.items():
            if any("device token" in requirement for requirement in operation.get("security", [])):
                concrete = path.replace("{request_id}", "0" * 32).replace("{schedule_id}", "0" * 16)
                routes[method.upper(), path] = concrete
    return routes


def test_every_device_endpoint_answers_an_unknown_token_401_whatever_its_body_or_headers(client, device) -> None:
    """The token is checked in the handler, so a request failing validation is authenticated by the validation
    error's handler first: a guesser learns nothing from a body and is counted all the same."""
    routes = device_routes(client)
    assert set(routes) == {("POST", "/api/v1/heartbeats"), ("POST", "/api/v1/schedule-requests"),
                           ("GET", "/api/v1/schedule-requests/{request_id}"),
                           ("DELETE", "/api/v1/schedule-requests/{request_id}"),
                           ("GET", "/api/v1/schedules/{schedule_id}")}
    invalid = {"json": {"state": "dancing"}, "headers": {"If-None-Match": "x" * 5000}}
    for (method, _), path in routes.items():
        for bad in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {device.token}x"}):
            response = client.request(method, path, json=invalid["json"], headers={**invalid["headers"], **bad})
            assert response.status_code == 401 and response.headers["WWW-Authenticate"] == "Bearer", (path, bad)
        valid_token = client.request(method, path, json=invalid["json"], headers={**invalid["headers"], **device.headers})
        assert valid_token.status_code == (422 if method == "POST" or "schedules/" in path else 404), path


def test_enrolment_is_rate_limited_per_address(tmp_path) -> None:
    app = create_app(ServerSettings(data_dir=tmp_path / "s", enrol_per_minute=3))
    client = TestClient(app)
    answers = [post_enrol(client, "guess-%d" % i).status_code for i in range(3)]
    limited = post_enrol(client, enrolment_token(app))  # even a good token waits its turn
    assert answers == [401, 401, 401]
    assert limited.status_code == 429 and 1 <= int(limited.headers["Retry-After"]) <= 60


def test_failed_authentication_is_rate_limited_and_a_good_token_behind_the_same_address_is_not(tmp_path) -> None:
    """Devices behind one NAT share an address: a guesser there is slowed down, the devices are not."""
    app = create_app(ServerSettings(data_dir=tmp_path / "s", auth_failures_per_minute=5))
    client = TestClient(app)
    device = enrol(client)
    assert client.post("/api/v1/heartbeats", json=heartbeat(), headers=device.headers).status_code == 204
    bad = {"Authorization": "Bearer wrong"}
    codes = [client.post("/api/v1/heartbeats", json=heartbeat(), headers=bad).status_code for _ in range(6)]
    assert codes == [401] * 5 + [429]
    assert int(client.post("/api/v1/heartbeats", json=heartbeat(), headers=bad).headers["Retry-After"]) >= 1
    assert client.post("/api/v1/heartbeats", json=heartbeat(), headers=device.headers).status_code == 204
