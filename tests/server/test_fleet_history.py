"""The fleet sampled over time, and the fleet charts drawn from it."""

from __future__ import annotations

import re
import time

from sqlalchemy import func, select, update

from server.db.models import Device, FleetSample
from server.fleet_history import KEEP_SECONDS, FleetSampler, Sample, per_hour, samples_since
from tests.server.conftest import Dashboard, enrol, heartbeat


def beat(client, device, **fields) -> None:
    assert client.post("/api/v1/heartbeats", json=heartbeat(**fields), headers=device.headers).status_code == 204


def test_a_sample_counts_states_and_adds_the_steps_and_energy_since_the_last(dashboard: Dashboard) -> None:
    client, db = dashboard.client, dashboard.client.app.state.server.db
    devices = {name: enrol(client, name) for name in ("pi-1", "pi-2", "pi-3", "pi-4")}
    beat(client, devices["pi-1"], state="training", steps_done=100, energy_j=50.0)
    beat(client, devices["pi-2"], state="training", steps_done=300, energy_j=90.0)
    beat(client, devices["pi-3"], state="waiting", steps_done=0, energy_j=0.0)
    with db.write() as session:  # pi-4 enrolled, never heard from: offline
        session.execute(update(Device).where(Device.name == "pi-3").values(last_seen=time.time() - 3600))
    sampler = FleetSampler(db, online_seconds=60.0)
    first = sampler.sample()
    assert first.steps is None and first.energy_j is None  # nothing to compare with yet
    assert (first.counts["online"], first.counts["offline"], first.counts["revoked"]) == (2, 2, 0)
    assert first.counts["training"] == 2 and first.counts["waiting"] == 0  # pi-3 is offline, not waiting

    beat(client, devices["pi-1"], state="training", steps_done=130, energy_j=65.0)
    beat(client, devices["pi-2"], state="waiting", steps_done=20, energy_j=4.0)  # its agent restarted
    beat(client, devices["pi-4"], state="training", steps_done=7, energy_j=1.0)  # heard from at last
    assert client.post("/devices/pi-3/revoke", data={"csrf_token": dashboard.csrf}).status_code == 200
    second = sampler.sample(first.at + 60)
    assert second.steps == 30 + 20 + 7 and second.energy_j == 15.0 + 4.0 + 1.0
    assert (second.counts["online"], second.counts["offline"], second.counts["revoked"]) == (3, 0, 1)
    assert (second.counts["training"], second.counts["waiting"]) == (2, 1)
    assert [s.steps for s in samples_since(db, 0)] == [None, 57]


def test_each_minute_is_stored_once_and_a_week_is_kept(client) -> None:
    db = client.app.state.server.db
    now = time.time()
    one, other = FleetSampler(db, 60.0), FleetSampler(db, 60.0)  # two server processes on one database
    one.sample(now - now % 60)
    other.sample(now - now % 60 + 30)  # the same minute: already stored
    with db.read() as session:
        assert session.scalar(select(func.count()).select_from(FleetSample)) == 1
    one.sample(now - now % 60 + KEEP_SECONDS + 60)
    with db.read() as session:
        assert session.scalar(select(func.count()).select_from(FleetSample)) == 1  # the old one dropped


def test_steps_and_energy_are_added_up_per_clock_hour() -> None:
    hour = 1_800_000_000 // 3600 * 3600
    samples = [Sample(hour + 60, {}, None, None), Sample(hour + 120, {}, 10, 1.5), Sample(hour + 3540, {}, 5, 0.5),
               Sample(hour + 3660, {}, 7, None)]
    assert per_hour(samples) == [(hour, 15, 2.0), (hour + 3600, 7, 0.0)]


def test_the_fleet_charts_page_draws_states_steps_and_energy(dashboard: Dashboard) -> None:
    client, db = dashboard.client, dashboard.client.app.state.server.db
    assert 'id="chart-states"' in client.get("/fleet/charts").text  # no samples yet: the charts say so
    assert "no data yet" in client.get("/fleet/charts").text
    device = enrol(client, "pi-1")
    sampler = FleetSampler(db, online_seconds=1e9)
    start = time.time() - 7200
    for minute in range(0, 120, 10):
        beat(client, device, state="training" if minute < 60 else "waiting", steps_done=minute, energy_j=minute / 2)
        sampler.sample(start + minute * 60)
    page = client.get("/fleet/charts").text
    for chart in ("chart-states", "chart-steps", "chart-fleet-energy"):
        assert f'id="{chart}"' in page
    assert re.search(r'<polyline class="series s3" data-series="training" points="[^"]+"', page)
    assert 'data-series="steps"' in page and 'data-series="energy"' in page
    assert "12 samples" in page
    assert "<strong>24 hours</strong>" in client.get("/fleet/charts", params={"hours": "6'; DROP"}).text
    assert "<strong>6 hours</strong>" in client.get("/fleet/charts", params={"hours": "6"}).text
