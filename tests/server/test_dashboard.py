"""The operator dashboard through its HTTP interface: sign-in, sessions, CSRF, headers, and every page's content."""

from __future__ import annotations

import io
import re
import time

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from common.cli import main
from common.exit_codes import ExitCode
from server.dashboard.charts import Rule, Series, line_chart, nice_ticks
from server.dashboard.device_charts import energy_per_window
from server.dashboard.operators import verify_login
from server.dashboard.state import STATIC
from server.db.models import Device, EnrolmentToken, OperatorSession
from server.ratelimit import RateLimiter
from server.federated.rounds import RoundRow, record_rounds
from tests.server.conftest import (OPERATOR, PASSWORD, Dashboard, add_operator, csrf_token_in, enrol, heartbeat,
                                   log_in, schedule_request, wait_for_solve)

XSS = "<script>alert(1)</script>"


def db(client: TestClient):
    return client.app.state.server.db


def rows_of(html: str) -> dict[str, str]:
    """Device name -> the fleet row's HTML."""
    return {m.group(1): m.group(0) for m in re.finditer(r'<tr class="device-row[^"]*" data-device="([^"]+)".*?</tr>',
                                                         html, re.S)}


def beat_for(client: TestClient, name: str, **fields) -> None:
    device = enrol(client, name)
    response = client.post("/api/v1/heartbeats", json=heartbeat(**fields), headers=device.headers)
    assert response.status_code == 204, response.text


# -- sign-in and sessions -------------------------------------------------------------------
def test_without_a_session_pages_redirect_to_login_and_json_is_401(client) -> None:
    for path in ("/", "/tokens", "/schedules", "/devices/pi-1"):
        response = client.get(path, follow_redirects=False)
        assert response.status_code == 303 and response.headers["location"].startswith("/login"), path
    assert client.get("/devices/pi-1", follow_redirects=False).headers["location"] == "/login?next=/devices/pi-1"
    assert client.get("/dashboard/fleet.json").status_code == 401
    assert client.post("/tokens", data={"csrf_token": "x"}, follow_redirects=False).status_code == 303
    assert db(client).read().__enter__().scalar(select(EnrolmentToken.id)) is None


def test_wrong_password_is_refused_and_the_right_one_sets_a_strict_httponly_cookie(client) -> None:
    add_operator(client.app)
    wrong = log_in(client, password="not the password")
    assert wrong.status_code == 401 and "Wrong username or password" in wrong.text
    assert "poet_session" not in wrong.headers.get("set-cookie", "")
    assert log_in(client, username="nobody").status_code == 401
    right = log_in(client)
    assert right.status_code == 303 and right.headers["location"] == "/"
    cookie = next(c for c in right.headers.get_list("set-cookie") if c.startswith("poet_session="))
    flags = {part.strip().lower() for part in cookie.split(";")}
    assert {"httponly", "samesite=strict", "path=/"} <= flags and "secure" not in flags  # plain http
    assert client.get("/").status_code == 200
    with db(client).read() as session:
        stored = session.scalar(select(OperatorSession.token_hash))
    assert stored != cookie.split(";")[0].split("=", 1)[1] and len(stored) == 64  # only its hash is stored


def test_the_session_cookie_is_secure_over_https(app) -> None:
    client = TestClient(app, base_url="https://testserver")
    add_operator(app)
    cookie = next(c for c in log_in(client).headers.get_list("set-cookie") if c.startswith("poet_session="))
    assert "secure" in cookie.lower()


def test_failed_logins_are_rate_limited_per_address(client) -> None:
    add_operator(client.app)
    client.app.state.dashboard.login_failures = RateLimiter(3)
    assert [log_in(client, password="wrong password").status_code for _ in range(3)] == [401] * 3
    limited = log_in(client)  # even the right password waits
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    assert "Too many failed sign-ins" in limited.text


def test_a_guesser_at_one_account_does_not_lock_out_another_operator_at_the_same_address(client) -> None:
    add_operator(client.app)
    add_operator(client.app, "bob", "bob's own long passphrase")
    client.app.state.dashboard.login_failures = RateLimiter(3)
    assert [log_in(client, password="wrong password").status_code for _ in range(4)] == [401] * 3 + [429]
    assert log_in(client, "bob", "bob's own long passphrase").status_code == 303


def test_an_account_guessed_at_from_many_addresses_is_limited_too(client) -> None:
    add_operator(client.app)
    client.app.state.dashboard.account_failures = RateLimiter(5)
    codes = []
    for i in range(6):
        # a fresh address each time, as a botnet has; a TestClient's address is set per client
        other = TestClient(client.app, client=(f"203.0.113.{i}", 50000))
        codes.append(log_in(other, password="wrong password").status_code)
    assert codes == [401] * 5 + [429]


def test_the_login_form_needs_its_own_csrf_token(client) -> None:
    add_operator(client.app)
    client.get("/login")
    for token in ("", "forged"):
        response = client.post("/login", data={"username": OPERATOR, "password": PASSWORD, "csrf_token": token},
                               follow_redirects=False)
        assert response.status_code == 403
    assert client.get("/", follow_redirects=False).status_code == 303


def test_next_after_login_stays_on_this_server(client) -> None:
    add_operator(client.app)
    for target, expected in (("/devices/pi-1", "/devices/pi-1"), ("//evil.example/", "/"),
                             ("https://evil.example/", "/"), ("/\\evil.example", "/")):
        client.cookies.clear()
        token = csrf_token_in(client.get("/login", params={"next": target}).text)
        response = client.post("/login", data={"username": OPERATOR, "password": PASSWORD, "csrf_token": token,
                                               "next": target}, follow_redirects=False)
        assert response.headers["location"] == expected, target


def test_logout_deletes_the_session(dashboard: Dashboard) -> None:
    client = dashboard.client
    cookie = client.cookies["poet_session"]
    assert client.post("/logout", data={"csrf_token": "wrong"}, follow_redirects=False).status_code == 403
    response = client.post("/logout", data={"csrf_token": dashboard.csrf}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/login"
    with db(client).read() as session:
        assert session.scalar(select(OperatorSession.id)) is None
    client.cookies.set("poet_session", cookie)  # the old cookie, replayed
    assert client.get("/", follow_redirects=False).status_code == 303
    assert client.get("/dashboard/fleet.json").status_code == 401


def test_posts_without_or_with_a_wrong_csrf_token_are_403_and_change_nothing(dashboard: Dashboard) -> None:
    client = dashboard.client
    device = enrol(client, "pi-1")
    with db(client).read() as session:
        tokens_before = len(session.scalars(select(EnrolmentToken)).all())
    for sent in ({}, {"csrf_token": ""}, {"csrf_token": "wrong"}, {"csrf_token": dashboard.csrf[:-1]}):
        assert client.post("/tokens", data=sent).status_code == 403
        assert client.post("/devices/pi-1/revoke", data=sent).status_code == 403
    assert client.post("/devices/pi-1/revoke", data={"csrf_token": dashboard.csrf},
                       headers={"Origin": "http://evil.example"}).status_code == 403  # right token, other site
    with db(client).read() as session:
        assert len(session.scalars(select(EnrolmentToken)).all()) == tokens_before
    assert client.post("/api/v1/heartbeats", json=heartbeat(), headers=device.headers).status_code == 204


def test_operator_commands_add_change_and_list(tmp_path, monkeypatch, capsys, app) -> None:
    data = str(tmp_path / "server")  # the `app` fixture's data directory
    monkeypatch.setattr("sys.stdin", io.StringIO("a long password\n"))
    assert main(["server", "operator", "add", "ops", "--password-stdin", "--data-dir", data]) == ExitCode.OK
    assert verify_login(app.state.server.db, "ops", "a long password") is not None
    monkeypatch.setattr("sys.stdin", io.StringIO("another one\n"))
    assert main(["server", "operator", "add", "ops", "--data-dir", data]) == ExitCode.USAGE
    assert "exists already" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    assert main(["server", "operator", "add", "ops2", "--data-dir", data]) == ExitCode.USAGE
    assert "too short" in capsys.readouterr().err
    client = TestClient(app)
    assert log_in(client, "ops", "a long password").status_code == 303
    monkeypatch.setattr("sys.stdin", io.StringIO("a new password\n"))
    assert main(["server", "operator", "passwd", "ops", "--data-dir", data]) == ExitCode.OK
    assert client.get("/", follow_redirects=False).status_code == 303  # its sessions ended
    assert log_in(client, "ops", "a long password").status_code == 401
    assert log_in(client, "ops", "a new password").status_code == 303
    capsys.readouterr()
    assert main(["server", "operator", "list", "--data-dir", data]) == ExitCode.OK
    assert capsys.readouterr().out.startswith("ops\tadmin\tadded ")


# -- headers and static files ----------------------------------------------------------------
def test_pages_send_security_headers_and_the_api_is_left_alone(dashboard: Dashboard) -> None:
    client = dashboard.client
    for path in ("/", "/login", "/tokens", "/schedules", "/dashboard/fleet.json", "/static/dashboard.js"):
        headers = client.get(path).headers
        csp = headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
        assert "unsafe-inline" not in csp and headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "same-origin"
    assert client.get("/").headers["cache-control"] == "no-store"
    assert "content-security-policy" not in client.get("/api/v1/server-key").headers


def test_static_files_are_served_and_nothing_loads_from_elsewhere(dashboard: Dashboard) -> None:
    client = dashboard.client
    css, js = client.get("/static/dashboard.css"), client.get("/static/dashboard.js")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert client.get("/static/../db/models.py").status_code == 404
    assert not re.search(r"\.(innerHTML|outerHTML|insertAdjacentHTML)|document\.write", js.text)
    assert "textContent" in js.text
    for path in ("/", "/tokens", "/schedules", "/login"):
        html = client.get(path).text
        assert not re.search(r'(src|href)="(https?:)?//', html), path  # no CDN, no other site
        assert not re.search(r"<script(?![^>]*\bsrc=)", html) and " style=" not in html, path
    assert not any("http://" in f.read_text() or "https://" in f.read_text() for f in STATIC.iterdir())


# -- the fleet -------------------------------------------------------------------------------------
def test_the_fleet_table_and_its_json_show_devices_after_heartbeats(dashboard: Dashboard) -> None:
    client = dashboard.client
    beat_for(client, "pi-1", state="training", steps_done=120, loss=0.4821, holdout_accuracy=0.875, energy_j=4321.0,
             charging=True, battery_percent=87.0, temperature_c=61.25, memory_budget_bytes=512_000_000,
             peak_bytes=412_000_000)
    beat_for(client, "pi-2", state="waiting", reason="on battery", steps_done=0, loss=None, energy_j=None,
             last_error="disk full")
    rows = rows_of(client.get("/").text)
    assert set(rows) == {"pi-1", "pi-2"}
    assert all(text in rows["pi-1"] for text in ("online", "training", "charging, 87 %", "61.2 \u00b0C",
                                                  "412 MB / 512 MB", "120", "0.482", "87.5 %", "4.32 kJ"))
    assert "disk full" in rows["pi-2"] and "\u2014" in rows["pi-2"]  # absent figures are an em dash
    devices = {row["name"]: row for row in client.get("/dashboard/fleet.json").json()["rows"]}
    assert devices["pi-1"]["cells"]["memory"] == "412 MB / 512 MB" and devices["pi-1"]["status"] == "online"
    assert devices["pi-2"]["cells"]["loss"] == "\u2014" and devices["pi-2"]["state"] == "waiting"


def test_filter_by_state_on_the_page_and_in_the_json(dashboard: Dashboard) -> None:
    client = dashboard.client
    beat_for(client, "pi-1", state="training")
    beat_for(client, "pi-2", state="waiting")
    beat_for(client, "pi-3", state="backing off")
    assert set(rows_of(client.get("/", params={"state": "waiting"}).text)) == {"pi-2"}
    assert set(rows_of(client.get("/", params={"state": "backing off"}).text)) == {"pi-3"}
    assert set(rows_of(client.get("/", params={"state": "nonsense"}).text)) == {"pi-1", "pi-2", "pi-3"}
    page = client.get("/", params={"state": "training"}).text
    assert '<option value="training" selected>' in page
    names = [row["name"] for row in client.get("/dashboard/fleet.json", params={"state": "training"}).json()["rows"]]
    assert names == ["pi-1"]


def test_offline_and_revoked_devices_are_shown_as_such(dashboard: Dashboard) -> None:
    client = dashboard.client
    beat_for(client, "pi-old", state="training")
    beat_for(client, "pi-gone")
    beat_for(client, "pi-here", state="training")
    with db(client).write() as session:
        session.execute(update(Device).where(Device.name == "pi-old").values(last_seen=time.time() - 21 * 60))
    assert client.post("/devices/pi-gone/revoke", data={"csrf_token": dashboard.csrf}).status_code == 200
    answer = client.get("/dashboard/fleet.json").json()
    devices = {row["name"]: row for row in answer["rows"]}
    assert devices["pi-old"]["status"] == "offline" and devices["pi-old"]["cells"]["online"] == "offline, 21 min ago"
    assert devices["pi-old"]["cells"]["state"] == "training (last heard)"
    assert devices["pi-gone"]["status"] == "revoked" and devices["pi-gone"]["state"] == "revoked"
    assert answer["counts"]["training"] == 1 and answer["counts"]["waiting"] == 0  # online devices only
    assert {k: answer["counts"][k] for k in ("devices", "online", "offline", "revoked")} == {
        "devices": 3, "online": 1, "offline": 1, "revoked": 1}
    assert set(rows_of(client.get("/", params={"status": "revoked"}).text)) == {"pi-gone"}
    assert set(rows_of(client.get("/", params={"status": "offline"}).text)) == {"pi-old"}
    # A device not heard from for 21 minutes is not listed as training now.
    assert set(rows_of(client.get("/", params={"state": "training"}).text)) == {"pi-here"}


def fleet(client: TestClient, **params) -> dict:
    response = client.get("/dashboard/fleet.json", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_fleet_comes_in_pages_searched_and_sorted_in_the_database(dashboard: Dashboard) -> None:
    client = dashboard.client
    for i in range(7):
        beat_for(client, f"pi-{i}", state="training" if i % 2 else "waiting", steps_done=10 * ((i * 3) % 7),
                 energy_j=float(i))
    enrol(client, "jetson-1")  # never heard from
    first = fleet(client, per_page=3)
    assert first["names"] == ["jetson-1", "pi-0", "pi-1"] and (first["total"], first["pages"]) == (8, 3)
    assert first["links"]["prev"] is None and first["links"]["next"] == "/?page=2&per_page=3"
    last = fleet(client, per_page=3, page=3)
    assert last["names"] == ["pi-5", "pi-6"] and last["first"] == 7 and last["links"]["next"] is None
    assert fleet(client, per_page=3, page=99)["names"] == last["names"]  # past the end: the last page
    by_steps = fleet(client, sort="steps")  # most first; a device with no figure last
    steps = [row["cells"]["steps"] for row in by_steps["rows"]]
    assert steps == ["60", "50", "40", "30", "20", "10", "0", "\u2014"]
    assert fleet(client, sort="steps", order="asc")["names"][:2] == ["pi-0", "pi-5"]
    assert by_steps["links"]["sort"]["steps"] == "/?sort=steps&order=asc"  # a second click flips the order
    assert fleet(client, q="PI-")["total"] == 7 and fleet(client, q="jet")["names"] == ["jetson-1"]
    assert fleet(client, q="%")["total"] == 0 and fleet(client, q="_")["total"] == 0  # matched as text
    assert fleet(client, status="online", state="training", sort="energy")["names"] == ["pi-5", "pi-3", "pi-1"]
    page = client.get("/", params={"per_page": 3, "sort": "name", "order": "desc"}).text
    assert list(rows_of(page)) == ["pi-6", "pi-5", "pi-4"] and "1\u20133 of 8, page 1 of 3" in page
    assert 'href="/?order=desc&amp;page=2&amp;per_page=3"' in page  # the pager keeps the sort, no script needed


@pytest.mark.parametrize("params", [{"page": "-1"}, {"page": "9" * 5000}, {"per_page": "100000"}, {"sort": "x;--"},
                                    {"order": "sideways"}, {"status": "dead"}, {"q": "x" * 5000},
                                    {"q": "' OR 1=1 --"}])
def test_odd_fleet_parameters_fall_back_to_the_defaults(dashboard: Dashboard, params) -> None:
    client = dashboard.client
    beat_for(client, "pi-1")
    answer = fleet(client, **params)
    assert answer["per_page"] <= 200 and answer["page"] == 1
    assert client.get("/", params=params).status_code == 200
    assert client.get("/dashboard/fleet.json", params={"since": "soon"}).status_code == 422


def test_a_refresh_sends_only_the_rows_that_changed_and_every_rows_age(dashboard: Dashboard) -> None:
    client = dashboard.client
    devices = {name: enrol(client, name) for name in ("pi-1", "pi-2", "pi-3")}
    for device in devices.values():
        assert client.post("/api/v1/heartbeats", json=heartbeat(), headers=device.headers).status_code == 204
    with db(client).write() as session:  # heard from a minute ago, enrolled long before
        session.execute(update(Device).values(enrolled_at=time.time() - 3600, last_seen=time.time() - 10))
    whole = fleet(client)
    assert whole["complete"] and [row["name"] for row in whole["rows"]] == ["pi-1", "pi-2", "pi-3"]
    nothing = fleet(client, since=whole["cursor"])
    assert not nothing["complete"] and nothing["rows"] == [] and nothing["names"] == whole["names"]
    assert [status for status, _ in nothing["online"]] == ["online"] * 3
    response = client.post("/api/v1/heartbeats", json=heartbeat(steps_done=77), headers=devices["pi-2"].headers)
    assert response.status_code == 204
    changed = fleet(client, since=whole["cursor"])
    assert [row["name"] for row in changed["rows"]] == ["pi-2"] and changed["rows"][0]["cells"]["steps"] == "77"
    with db(client).write() as session:  # pi-3 goes quiet: past the online window since the last answer
        session.execute(update(Device).where(Device.name == "pi-3").values(last_seen=time.time() - 65))
    gone = fleet(client, since=time.time() - 10)
    assert "pi-3" in [row["name"] for row in gone["rows"]] and gone["online"][2][0] == "offline"
    assert len(gone["rows"]) < 3


def test_a_devices_own_strings_are_escaped_everywhere(dashboard: Dashboard) -> None:
    client = dashboard.client
    beat_for(client, "pi-1", reason=XSS, last_error=f'"><img src=x onerror=alert(1)>{XSS}',
             eligibility=[{"name": XSS, "eligible": False, "reason": XSS}])
    for path in ("/", "/devices/pi-1", "/tokens"):
        html = client.get(path).text
        assert XSS not in html and "<img src=x" not in html, path
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in client.get("/").text
    assert client.get("/dashboard/fleet.json").json()["rows"][0]["cells"]["reason"] == XSS  # data, as sent


# -- a device -----------------------------------------------------------------------------------------
def test_the_device_page_draws_memory_against_the_budget_loss_accuracy_and_energy(dashboard: Dashboard) -> None:
    client = dashboard.client
    device = enrol(client, "pi-1")
    start = time.time() - 100
    beats = [heartbeat(sent_at=start + 10 * i, steps_done=10 * i, loss=1.0 / (i + 1), holdout_accuracy=0.5 + i / 20,
                       energy_j=5.0 * i, peak_bytes=300_000_000 + i * 1_000_000, memory_budget_bytes=400_000_000,
                       bound_bytes=450_000_000) for i in range(6)]
    assert client.post("/api/v1/heartbeats", json=beats, headers=device.headers).status_code == 204
    page = client.get("/devices/pi-1")
    assert page.status_code == 200
    html = page.text
    assert html.count('<svg xmlns="http://www.w3.org/2000/svg" class="chart"') == 4
    memory = re.search(r'<svg[^>]*id="chart-memory".*?</svg>', html, re.S).group(0)
    assert 'class="rule budget" data-rule="budget"' in memory and "400 MB" in memory
    peak = re.search(r'<polyline class="series s1" data-series="peak" points="([^"]+)"', memory).group(1)
    assert len(peak.split()) == 6
    for chart, series in (("loss", "loss"), ("accuracy", "accuracy"), ("energy", "energy")):
        svg = re.search(rf'<svg[^>]*id="chart-{chart}".*?</svg>', html, re.S).group(0)
        points = re.search(rf'data-series="{series}" points="([^"]+)"', svg).group(1)
        assert len(points.split()) == (5 if chart == "energy" else 6), chart  # energy: differences
    assert 'id="revoke"' in html and f'value="{dashboard.csrf}"' in html
    assert client.get("/devices/pi-404").status_code == 404


def test_a_device_clock_a_year_ahead_is_shown_and_its_sent_times_read_as_times(dashboard: Dashboard) -> None:
    client = dashboard.client
    device = enrol(client, "pi-1")
    year = 365 * 86400
    sent = time.time() + year
    beats = [heartbeat(sent_at=sent - 20 + 10 * i, steps_done=i, loss=1.0 / (i + 1)) for i in range(3)]
    assert client.post("/api/v1/heartbeats", json=beats, headers=device.headers).status_code == 204
    html = client.get("/devices/pi-1").text
    clock = re.search(r'<dd id="device-clock">(.*?)</dd>', html, re.S).group(1)
    assert clock.startswith("365 d ahead of the server")
    assert time.strftime("%Y-%m-%d %H:%M", time.localtime(sent)) in html  # sent_at as a time, not 1.79e9
    assert f"{sent:.0f}" not in html
    loss = re.search(r'<svg[^>]*id="chart-loss".*?</svg>', html, re.S).group(0)
    assert len(re.search(r'data-series="loss" points="([^"]+)"', loss).group(1).split()) == 3


def test_values_stored_before_heartbeats_were_held_to_a_devices_range_never_break_a_page(dashboard) -> None:
    from server.devices import record_heartbeats
    from server.db.models import Device

    client = dashboard.client
    enrol(client, "pi-odd")
    with db(client).read() as session:
        device_id = session.query(Device).filter(Device.name == "pi-odd").one().id
    beats = [heartbeat(sent_at=1795817216000000000 + i, steps_done=i, loss=(-1) ** i * 1e308, energy_j=1e308 * i,
                       holdout_accuracy=0.5) for i in range(3)]
    record_heartbeats(db(client), device_id, beats, time.time(), keep=100)  # as an older server stored them
    for path in ("/devices/pi-odd", "/", "/dashboard/fleet.json", "/fleet/charts"):
        assert client.get(path).status_code == 200, path
    html = client.get("/devices/pi-odd").text
    assert "values out of range" in html and "(not a time)" in html


def test_a_device_without_heartbeats_says_there_is_no_data(dashboard: Dashboard) -> None:
    enrol(dashboard.client, "pi-1")
    html = dashboard.client.get("/devices/pi-1").text
    assert html.count("no data yet") == 4 and 'id="no-schedule"' in html


def test_charts_escape_text_and_pick_round_ticks() -> None:
    svg = str(line_chart(f"t {XSS}", [Series(XSS, [(0.0, 1.0), (60.0, 3.0)])], rules=[Rule("budget", 4.0)]))
    assert XSS not in svg and "&lt;script&gt;" in svg
    assert 'data-rule="budget"' in svg and svg.startswith("<svg") and svg.endswith("</svg>")
    assert nice_ticks(0, 4.0) == [0, 1, 2, 3, 4] and nice_ticks(0, 37) == [0, 10, 20, 30, 40]
    assert energy_per_window([(0, 1.0), (1, 4.0), (2, 0.5), (3, 2.5)]) == [(1, 3.0), (2, 0.5), (3, 2.0)]


# -- schedules ---------------------------------------------------------------------------------------
def test_the_schedules_page_lists_a_solved_schedule_with_its_devices(solving_client) -> None:
    add_operator(solving_client.app)
    assert log_in(solving_client).status_code == 303
    first, second = enrol(solving_client, "pi-1"), enrol(solving_client, "pi-2")
    request_id = solving_client.post("/api/v1/schedule-requests", json=schedule_request(),
                                     headers=first.headers).json()["request_id"]
    status = wait_for_solve(solving_client, request_id, first.headers)
    schedule_id = status["schedule_id"]
    for device in (first, second):
        assert solving_client.get(f"/api/v1/schedules/{schedule_id}", headers=device.headers).status_code == 200
    html = solving_client.get("/schedules").text
    row = re.search(rf'<tr class="schedule-row" data-schedule="{schedule_id}">.*?</tr>', html, re.S).group(0)
    assert re.search(r'<td class="c-devices">2</td>', row) and '<td class="c-solve">done</td>' in row
    assert "rpi4" in row and "998 MB" in row  # 10**9 B asked: planned for its class, 998,244,352 B
    device_page = solving_client.get("/devices/pi-1").text
    assert f'src="/schedules/{schedule_id}/timeline.svg"' in device_page
    timeline = solving_client.get(f"/schedules/{schedule_id}/timeline.svg")
    assert timeline.status_code == 200 and timeline.headers["content-type"] == "image/svg+xml"
    assert b"<svg" in timeline.content[:2000] and b"<script" not in timeline.content
    assert solving_client.get("/schedules/0000000000000000/timeline.svg").status_code == 404


def round_row(run_id: int, round_: int, phase: str, device: str, **metrics) -> RoundRow:
    values = {"num-examples": 48.0, "train-loss": 1.25, "eval-loss": 1.5, "accuracy": 0.625, "steps": 3.0,
              "peak-bytes": 594432.0, "budget-bytes": 605337.0, "energy-j": 0.4, "seconds": 0.1, **metrics}
    return RoundRow(run_id, round_, phase, 2**63 + round_, device, values, "0123456789abcdef")


def test_the_rounds_page_lists_a_row_per_device_per_round_of_the_chosen_run(dashboard: Dashboard) -> None:
    client = dashboard.client
    assert 'href="/rounds"' in client.get("/").text  # in the navigation
    assert 'id="no-rounds"' in client.get("/rounds").text
    record_rounds(db(client), [round_row(7, r, "train", d, accuracy=0.1 * r) for r in (1, 2) for d in ("pi-1", "pi-2")]
                  + [round_row(7, 3, "personalize", "pi-1", **{"global-accuracy": 0.5, "personal-accuracy": 0.75}),
                     round_row(7, 1, "evaluate", f"pi-{XSS}", **{"budget-bytes": -1.0, "train-loss": -1.0})])
    record_rounds(db(client), [round_row(8, 1, "train", "pi-9")])
    html = client.get("/rounds?run=7").text
    rows = re.findall(r'<tr class="round-row" data-round="(\d+)" data-phase="(\w+)" data-device="([^"]+)"', html)
    assert ("2", "train", "pi-1") in rows and ("1", "train", "pi-2") in rows and len(rows) == 6
    assert "50.0 % → 75.0 %" in html  # global, then personalized accuracy
    assert "594 kB / 605 kB" in html  # peak against budget
    assert XSS not in html and "&lt;script&gt;" in html
    assert str(2**63 + 1) in html  # node ids beyond a signed 64-bit integer survive
    assert "pi-9" not in html and "pi-9" in client.get("/rounds?run=8").text


def test_a_device_that_answered_with_an_error_shows_the_error_in_its_row(dashboard: Dashboard) -> None:
    client = dashboard.client
    record_rounds(db(client), [round_row(9, 1, "train", "pi-1"),
                               RoundRow(9, 1, "train", 42, "pi-2", {"error": f"node offline {XSS} (code 3)"})])
    html = client.get("/rounds?run=9").text
    row = html[html.index('data-device="pi-2"'):].split("</tr>")[0]
    assert 'class="c-error"' in row and "error: node offline" in row and XSS not in row
    assert 'class="c-error"' not in html[html.index('data-device="pi-1"'):].split("</tr>")[0]


def test_the_rounds_page_lists_global_model_versions_and_a_device_page_its_personalization(
        dashboard: Dashboard, tmp_path) -> None:
    import numpy as np

    from server.keys import load_or_create
    from server.model_versions import store_version

    client = dashboard.client
    assert 'id="no-versions"' in client.get("/rounds").text
    key = load_or_create(tmp_path / "keys").private_key
    first = store_version(db(client), tmp_path, key, {"w": np.zeros(3, dtype=np.float32)}, run_id=7, round=1,
                          parent=None, model=f"digits {XSS}", metrics={"evaluate.accuracy": 0.5})
    second = store_version(db(client), tmp_path, key, {"w": np.ones(3, dtype=np.float32)}, run_id=7, round=2,
                           parent=first.version, model=f"digits {XSS}", metrics={"evaluate.accuracy": 0.625})
    html = client.get("/rounds").text
    rows = re.findall(r'<tr class="version-row" data-version="(v\d+)">(.*?)</tr>', html, re.S)
    assert [v for v, _ in rows] == [f"v{second.version}", f"v{first.version}"]  # newest first
    assert f"<td>v{first.version}</td>" in rows[0][1] and "62.5 %" in rows[0][1]  # its parent, its accuracy
    assert XSS not in html and second.sha256[:16] in html
    beat_for(client, "pi-1")
    assert 'id="no-personalization"' in client.get("/devices/pi-1").text
    record_rounds(db(client), [round_row(7, 3, "personalize", "pi-1", **{"global-accuracy": 0.5,
                                                                         "personal-accuracy": 0.75,
                                                                         "global-version": float(second.version)})])
    page = client.get("/devices/pi-1").text
    assert re.search(rf'id="personalized-version">v{second.version} \(run 7,', page)
    assert "50.0 % → 75.0 %" in page
    # the fleet's choice, sent after personalization, is what the device kept
    record_rounds(db(client), [round_row(7, 3, "keep", "pi-1", **{"global-accuracy": 0.5, "personal-accuracy": 0.75,
                                                                  "kept": 0.0, "kept-accuracy": 0.5,
                                                                  "kept-by-fleet": 1.0, "own-kept": 1.0})])
    assert "kept global 50.0 % (the fleet&#39;s choice)" in client.get("/devices/pi-1").text


# -- enrolment tokens and revocation ----------------------------------------------------------
def test_a_token_made_on_the_page_is_shown_once_and_enrols_one_device(dashboard: Dashboard) -> None:
    client = dashboard.client
    made = client.post("/tokens", data={"csrf_token": dashboard.csrf, "lifetime": "1h"})
    assert made.status_code == 201
    token = re.search(r'<code id="new-token">([A-Za-z0-9_-]{43})</code>', made.text).group(1)
    listing = client.get("/tokens").text
    assert token not in listing and 'data-status="valid"' in listing
    body = {"enrolment_token": token, "device_name": "pi-9"}
    assert client.post("/api/v1/enrol", json=body).status_code == 201
    assert client.post("/api/v1/enrol", json={**body, "device_name": "pi-10"}).status_code == 401
    listing = client.get("/tokens").text
    assert 'data-status="used"' in listing and "pi-9" in listing
    with db(client).read() as session:
        row = session.scalar(select(EnrolmentToken))
    assert 3500 < row.expires_at - row.created_at <= 3600


def test_revoking_from_the_page_refuses_the_devices_token(dashboard: Dashboard) -> None:
    client = dashboard.client
    device = enrol(client, "pi-1")
    assert client.post("/api/v1/heartbeats", json=heartbeat(), headers=device.headers).status_code == 204
    response = client.post("/devices/pi-1/revoke", data={"csrf_token": dashboard.csrf, "next": "/tokens"},
                           follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/tokens"
    assert client.post("/api/v1/heartbeats", json=heartbeat(), headers=device.headers).status_code == 401
    page = client.get("/devices/pi-1").text
    assert 'id="revoked-note"' in page and 'id="revoke"' not in page
    assert client.post("/devices/pi-404/revoke", data={"csrf_token": dashboard.csrf}).status_code == 404


@pytest.mark.parametrize("field", ["username", "password"])
def test_oversized_login_fields_are_refused_not_hashed(client, field) -> None:
    add_operator(client.app)
    token = csrf_token_in(client.get("/login").text)
    data = {"username": OPERATOR, "password": PASSWORD, "csrf_token": token, field: "x" * 5000}
    assert client.post("/login", data=data, follow_redirects=False).status_code in (401, 422)


@pytest.mark.parametrize("value, shown", [(0.482, "0.482 J"), (123.4, "123 J"), (4740, "4.74 kJ"), (9999, "10 kJ"),
                                          (474_000, "474 kJ"), (1_250_000, "1.25 MJ"), (4.2e9, "4,200 MJ"),
                                          (None, "\u2014")])
def test_energy_reads_in_three_figures_without_an_exponent(value, shown) -> None:
    from server.dashboard import display

    assert display.joules(value) == shown


def test_a_device_that_plans_for_itself_says_which_schedule_it_runs(dashboard: Dashboard) -> None:
    client = dashboard.client
    device = enrol(client, "pi-1")
    beat = heartbeat(schedule_id="abc123", schedule_from="local solve (60 s limit)")
    assert client.post("/api/v1/heartbeats", json=beat, headers=device.headers).status_code == 204
    note = re.search(r'id="no-schedule">(.*?)</p>', client.get("/devices/pi-1").text, re.S).group(1)
    assert "abc123" in note and "local solve" in note and "has not downloaded" not in note


def test_one_address_guessing_at_many_names_is_limited_without_hashing_or_flooding_the_audit(client,
                                                                                           monkeypatch) -> None:
    import server.dashboard.login as login_module
    from server.db.models import AuditEntry

    add_operator(client.app)
    client.app.state.dashboard.address_failures = RateLimiter(20)
    hashed = []
    verify = login_module.verify_login
    monkeypatch.setattr(login_module, "verify_login", lambda *a: hashed.append(a[1]) or verify(*a))
    codes = [log_in(client, f"name-{i}", "wrong password").status_code for i in range(60)]
    assert codes == [401] * 20 + [429] * 40  # each name new, the address the same
    assert len(hashed) == 20  # no argon2 hash while limited
    with db(client).read() as session:
        rows = session.query(AuditEntry).filter(AuditEntry.action == "rate-limited").count()
    assert rows == 1  # one row for the run of refusals, not one per name
    other = TestClient(client.app, client=("198.51.100.7", 50000))
    assert log_in(other).status_code == 303  # the operator elsewhere is not held back
