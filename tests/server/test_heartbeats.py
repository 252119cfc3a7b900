"""Heartbeats: stored singly or as a flushed queue, the device's latest state kept, history bounded, bad ones 422."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from server.api import create_app
from server.config import ServerSettings
from server.db.models import Device, Heartbeat
from tests.server.conftest import enrol, heartbeat, metric

REPO = Path(__file__).resolve().parents[2]


def stored(client: TestClient) -> list[dict]:
    with client.app.state.server.db.read() as session:
        return [row.payload for row in session.scalars(select(Heartbeat).order_by(Heartbeat.id))]


def device_row(client: TestClient, name: str = "pi-1") -> Device:
    with client.app.state.server.db.read() as session:
        return session.scalars(select(Device).where(Device.name == name)).one()


def test_one_heartbeat_is_stored_and_becomes_the_devices_state(client, device) -> None:
    beat = heartbeat(state="backing off", reason="battery at 12%", steps_done=40, energy_j=7.5,
                     software_version="0.2.0", temperature_c=51.5, charging=False, battery_percent=12.0)
    assert client.post("/api/v1/heartbeats", json=beat, headers=device.headers).status_code == 204
    (payload,) = stored(client)
    assert payload["reason"] == "battery at 12%" and payload["temperature_c"] == 51.5
    row = device_row(client)
    assert (row.state, row.steps_done, row.energy_j, row.software_version) == ("backing off", 40, 7.5, "0.2.0")
    assert row.last_seen is not None and abs(row.last_seen - time.time()) < 60


def test_a_queue_flushed_at_once_is_stored_whole_and_its_newest_becomes_the_state(client, device) -> None:
    now = time.time()
    queue = [heartbeat(sent_at=now - 300 + i, steps_done=i) for i in range(50)]
    assert client.post("/api/v1/heartbeats", json=queue[::-1], headers=device.headers).status_code == 204
    assert sorted(p["steps_done"] for p in stored(client)) == list(range(50))
    assert device_row(client).steps_done == 49  # the newest by the device's clock within one request


def test_a_device_clock_far_ahead_never_freezes_its_state_and_its_skew_is_kept(client, device) -> None:
    """A device without a real-time clock may date a heartbeat next year, then correct its clock: the state
    follows what the server receives, in the order it receives it."""
    year = 365 * 86400
    ahead = heartbeat(sent_at=time.time() + year, steps_done=10, state="training")
    assert client.post("/api/v1/heartbeats", json=ahead, headers=device.headers).status_code == 204
    assert device_row(client).clock_skew_seconds == pytest.approx(year, abs=60)
    corrected = heartbeat(sent_at=time.time(), steps_done=11, state="waiting")  # network time came
    assert client.post("/api/v1/heartbeats", json=corrected, headers=device.headers).status_code == 204
    row = device_row(client)
    assert (row.steps_done, row.state) == (11, "waiting") and abs(row.clock_skew_seconds) < 60


def test_the_history_per_device_is_bounded_and_keeps_the_newest(tmp_path) -> None:
    client = TestClient(create_app(ServerSettings(data_dir=tmp_path / "s", heartbeat_history=10)))
    first, second = enrol(client, "a"), enrol(client, "b")
    for batch in range(3):
        beats = [heartbeat(steps_done=batch * 8 + i) for i in range(8)]
        assert client.post("/api/v1/heartbeats", json=beats, headers=first.headers).status_code == 204
    assert client.post("/api/v1/heartbeats", json=heartbeat(), headers=second.headers).status_code == 204
    with client.app.state.server.db.read() as session:
        counts = dict(session.execute(select(Device.name, func.count(Heartbeat.id)).join(Heartbeat)
                                      .group_by(Device.name)).all())
        kept = session.scalars(select(Heartbeat.payload).join(Device).where(Device.name == "a")).all()
    assert counts == {"a": 10, "b": 1}
    assert [p["steps_done"] for p in kept] == list(range(14, 24))


def test_unknown_fields_are_dropped_not_stored(client, device) -> None:
    beat = heartbeat(flux_capacitor="1.21 GW")
    assert client.post("/api/v1/heartbeats", json=beat, headers=device.headers).status_code == 204
    assert "flux_capacitor" not in stored(client)[0]


def test_invalid_heartbeats_are_422_with_where_and_why_and_nothing_is_stored(client, device) -> None:
    cases = {
        "state": heartbeat(state="dancing"),
        "sent_at": heartbeat(sent_at="yesterday"),
        "steps_done": heartbeat(steps_done=-1),
        "reason": heartbeat(reason="x" * 5000),
        "holdout_accuracy": heartbeat(holdout_accuracy=1.5),
        "eligible": heartbeat(eligible="yes"),
        "kept_model": heartbeat(kept_model="the best one"),
        "kept_margin_local": heartbeat(kept_margin_local=2.0),  # a difference of two shares is at most 1
    }
    # values no device produces: a clock in nanoseconds, losses and energies at the edge of a double
    out_of_range = {"sent_at": heartbeat(sent_at=1795817216000000000), "since": heartbeat(since=1.79e12),
                    "loss": heartbeat(loss=1e308), "holdout_loss": heartbeat(holdout_loss=-1e308),
                    "energy_j": heartbeat(energy_j=1e308), "step_seconds": heartbeat(step_seconds=1e300)}
    cases.update(out_of_range)
    for field, beat in cases.items():
        response = client.post("/api/v1/heartbeats", json=beat, headers=device.headers)
        assert response.status_code == 422, field
        assert field in response.json()["detail"], response.json()
        assert any(field in problem["loc"] for problem in response.json()["problems"])
    missing = {k: v for k, v in heartbeat().items() if k != "sent_at"}
    assert client.post("/api/v1/heartbeats", json=missing, headers=device.headers).status_code == 422
    assert stored(client) == []


def test_non_finite_numbers_and_oversized_queues_are_refused(client, device) -> None:
    nan = '{"state": "training", "sent_at": 1.0, "loss": NaN}'
    response = client.post("/api/v1/heartbeats", content=nan, headers={**device.headers,
                                                                        "Content-Type": "application/json"})
    assert response.status_code == 422 and "loss" in response.json()["detail"]
    too_many = [heartbeat() for _ in range(501)]
    assert client.post("/api/v1/heartbeats", json=too_many, headers=device.headers).status_code == 422
    assert client.post("/api/v1/heartbeats", json=[], headers=device.headers).status_code == 422
    one_bad = [heartbeat(), heartbeat(state="dancing")]
    response = client.post("/api/v1/heartbeats", json=one_bad, headers=device.headers)
    assert response.status_code == 422 and response.json()["problems"][0]["loc"] == ["body", 1, "state"]
    assert stored(client) == []


def test_metrics_count_devices_online_and_by_state(client) -> None:
    pis = [enrol(client, f"pi-{i}") for i in range(3)]
    for pi, state in zip(pis[:2], ("training", "waiting")):
        assert client.post("/api/v1/heartbeats", json=heartbeat(state=state, steps_done=10, energy_j=2.5),
                           headers=pi.headers).status_code == 204
    text = client.get("/metrics").text
    assert metric(text, "poet_server_devices") == 3 and metric(text, "poet_server_devices_online") == 2
    assert metric(text, "poet_server_devices_by_state", state="training") == 1
    assert metric(text, "poet_server_devices_by_state", state="stopped") == 0
    assert metric(text, "poet_server_fleet_steps") == 20 and metric(text, "poet_server_fleet_energy_joules") == 5.0
    assert metric(text, "poet_server_heartbeats_received_total") == 2
    assert metric(text, "poet_server_http_request_duration_seconds_count", method="POST",
                  route="/api/v1/heartbeats", status="204") == 2
    assert "_created" not in text


def test_metrics_describe_this_process_and_its_release(client) -> None:
    from common.version import software_version

    text = client.get("/metrics").text
    assert metric(text, "process_resident_memory_bytes") > 10_000_000  # a real process, read from /proc
    assert metric(text, "process_cpu_seconds_total") > 0 and metric(text, "process_open_fds") > 0
    build = next(line for line in text.splitlines() if line.startswith("poet_server_build_info{"))
    assert f'version="{software_version()}"' in build and build.endswith(" 1.0")


def test_the_alert_rules_in_deploy_name_only_series_the_server_exports_and_fire_on_what_they_say(client) -> None:
    """Every series an alert rule reads is one this server's /metrics has (or Prometheus's own ``up``), and the
    error and over-budget gauges follow the devices' heartbeats."""
    import yaml

    rules = yaml.safe_load((REPO / "deploy" / "poet-server.rules.yml").read_text())["groups"][0]["rules"]
    assert {r["alert"] for r in rules} >= {"PoetDevicesOffline", "PoetDevicesWithErrors", "PoetDevicesOverBudget",
                                           "PoetSolveBacklog"}
    text = client.get("/metrics").text
    declared = set(re.findall(r"^# TYPE (\w+) ", text, re.M))  # a histogram is declared before it has samples
    for rule in rules:
        for name in re.findall(r"\b(poet_server_\w+)", rule["expr"]):
            family = re.sub(r"_(bucket|count|sum)$", "", name)
            assert family in declared, f"{rule['alert']} reads {name}, which /metrics does not have"
    ok, failing, over = enrol(client, "pi-1"), enrol(client, "pi-2"), enrol(client, "pi-3")
    for device, changes in ((ok, {}), (failing, {"last_error": "cannot write checkpoint"}),
                            (over, {"peak_bytes": 9_000_000, "bound_bytes": 8_000_000})):
        beat = heartbeat(**{"peak_bytes": 1_000_000, "bound_bytes": 8_000_000, **changes})
        assert client.post("/api/v1/heartbeats", json=beat, headers=device.headers).status_code == 204
    text = client.get("/metrics").text
    assert metric(text, "poet_server_devices_with_error") == 1
    assert metric(text, "poet_server_devices_over_budget") == 1


def test_the_kept_model_and_its_margins_are_stored_with_the_heartbeat(client, device) -> None:
    beat = heartbeat(kept_model="local", kept_accuracy=0.8, kept_margin_global=0.05, kept_margin_local=0.0)
    assert client.post("/api/v1/heartbeats", json=beat, headers=device.headers).status_code == 204
    kept = stored(client)[0]
    assert (kept["kept_model"], kept["kept_accuracy"], kept["kept_margin_global"]) == ("local", 0.8, 0.05)
