"""Fleet operations an operator needs: revocable enrolment tokens, removable operators, a viewer role, and an
audit log (database, dashboard page, journal) of every enrolment, revocation, sign-in, refusal and action."""

from __future__ import annotations

import html
import logging
import re
import time

import pytest
from fastapi.testclient import TestClient

from common.cli import main
from server import audit
from server.dashboard.operators import add_operator as add_operator_account
from server.devices import create_enrolment_token
from server.ratelimit import RateLimiter
from tests.server.conftest import (OPERATOR, PASSWORD, Dashboard, add_operator, csrf_token_in, enrol, log_in,
                                   schedule_request)


def entries(client: TestClient) -> list[tuple[str, str, str]]:
    """The audit log, oldest first: (actor, action, target)."""
    return [(e.actor, e.action, e.target) for e in reversed(audit.recent(client.app.state.server.db))]


def server_command(client: TestClient, *args: str) -> int:
    """A ``poet-edge server`` command on the same data directory as the app."""
    return main(["server", *args, "--data-dir", str(client.app.state.server.settings.data_dir)])


def test_an_unused_enrolment_token_can_be_listed_and_revoked_and_then_enrols_nothing(client, capsys) -> None:
    assert server_command(client, "enrol-token") == 0
    token = capsys.readouterr().out.strip()
    assert server_command(client, "tokens", "list") == 0
    (listed,) = capsys.readouterr().out.splitlines()
    token_id, *_, status, used_by = listed.split("\t")
    assert (status, used_by) == ("valid", "-")
    assert server_command(client, "tokens", "revoke", token_id) == 0
    assert "revoked enrolment token" in capsys.readouterr().out
    refused = client.post("/api/v1/enrol", json={"enrolment_token": token, "device_name": "pi-9"})
    assert refused.status_code == 401
    assert server_command(client, "tokens", "list") == 0
    assert capsys.readouterr().out.split("\t")[-2] == "revoked"
    actions = [action for _, action, _ in entries(client)]
    assert actions == ["token.create", "token.revoke", "device.enrol-refused"]
    assert entries(client)[0][0].startswith("cli:")


def test_a_used_token_is_not_revoked_but_its_device_is_named(client, capsys) -> None:
    db = client.app.state.server.db
    token, token_id = create_enrolment_token(db, 3600, time.time())
    assert client.post("/api/v1/enrol", json={"enrolment_token": token, "device_name": "pi-3"}).status_code == 201
    assert server_command(client, "tokens", "revoke", str(token_id)) == 2
    assert "used by 'pi-3' already: revoke the device instead" in capsys.readouterr().err


def test_a_removed_operator_is_signed_out_at_once(client, capsys) -> None:
    add_operator(client.app)
    assert log_in(client).status_code == 303 and client.get("/").status_code == 200
    assert server_command(client, "operator", "remove", OPERATOR) == 0
    assert client.get("/", follow_redirects=False).status_code == 303  # back to the login page
    assert log_in(client).status_code == 401
    assert ("cli", "operator.remove", OPERATOR) in [(a.split(":")[0], b, c) for a, b, c in entries(client)]


def test_a_viewer_reads_every_page_and_changes_nothing(client) -> None:
    add_operator_account(client.app.state.server.db, "watcher", PASSWORD, time.time(), role="viewer")
    assert log_in(client, "watcher").status_code == 303
    for page in ("/", "/schedules", "/rounds", "/tokens", "/audit"):
        assert client.get(page).status_code == 200, page
    tokens = client.get("/tokens").text
    assert 'id="token-form"' not in tokens and 'id="viewer-note"' in tokens
    csrf = csrf_token_in(client.get("/").text)  # the sign-out form's: a viewer's session has one too
    made = client.post("/tokens", data={"csrf_token": csrf, "lifetime": "1h"}, follow_redirects=False)
    assert made.status_code == 403
    assert client.post("/devices/pi-1/revoke", data={"csrf_token": csrf}, follow_redirects=False).status_code == 403
    assert [e[:2] for e in entries(client)][-2:] == [("operator:watcher", "forbidden")] * 2


def test_an_admin_cancels_a_waiting_schedule_request_from_the_schedules_page_and_a_viewer_cannot(client) -> None:
    device = enrol(client, "greedy-pi")
    asked = client.post("/api/v1/schedule-requests", json=schedule_request(memory_budget=10**9),
                        headers=device.headers).json()  # no lifespan: it stays queued
    cancel = f"/schedule-requests/{asked['request_id']}/cancel"
    add_operator_account(client.app.state.server.db, "watcher", PASSWORD, time.time(), role="viewer")
    viewer = TestClient(client.app)
    assert log_in(viewer, "watcher").status_code == 303
    page = viewer.get("/schedules").text
    assert "greedy-pi" in page and "cancel-request" not in page  # who asked is shown; no button for a viewer
    assert viewer.post(cancel, data={"csrf_token": csrf_token_in(page)}, follow_redirects=False).status_code == 403
    add_operator(client.app)
    assert log_in(client).status_code == 303
    page = client.get("/schedules").text
    assert "cancel-request" in page
    assert client.post(cancel, data={"csrf_token": "forged"}, follow_redirects=False).status_code == 403
    done = client.post(cancel, data={"csrf_token": csrf_token_in(page)}, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/schedules"
    status = client.get(f"/api/v1/schedule-requests/{asked['request_id']}", headers=device.headers).json()
    assert status["status"] == "cancelled" and status["error"] == f"cancelled by operator {OPERATOR}"
    again = client.post(cancel, data={"csrf_token": csrf_token_in(page)}, follow_redirects=False)
    assert again.status_code == 409 and "cancelled already" in again.text
    assert client.post("/schedule-requests/nothing/cancel", data={"csrf_token": csrf_token_in(page)},
                       follow_redirects=False).status_code == 404
    assert (f"operator:{OPERATOR}", "solve.cancel", f"request {asked['request_id']}") in entries(client)
    assert "cancel-request" not in client.get("/schedules").text  # nothing left to cancel


def test_the_audit_page_and_the_journal_show_sign_ins_enrolments_revocations_and_refusals(
        dashboard: Dashboard, caplog: pytest.LogCaptureFixture) -> None:
    client = dashboard.client
    with caplog.at_level(logging.INFO, logger="poet-server"):
        made = client.post("/tokens", data={"csrf_token": dashboard.csrf, "lifetime": "1h"})
        token = re.search(r'<code id="new-token">([^<]+)</code>', made.text).group(1)
        assert client.post("/api/v1/enrol", json={"enrolment_token": token, "device_name": "pi-5"}).status_code == 201
        assert client.post("/devices/pi-5/revoke", data={"csrf_token": dashboard.csrf},
                           follow_redirects=False).status_code == 303
        client.app.state.dashboard.login_failures = RateLimiter(2)
        outsider = TestClient(client.app)
        codes = [log_in(outsider, password="not the password").status_code for _ in range(4)]
        assert codes == [401, 401, 429, 429]
    actions = [(actor, action) for actor, action, _ in entries(client)]
    assert actions == [("operator:admin", "login"), ("operator:admin", "token.create"), ("device:pi-5", "device.enrol"),
                       ("operator:admin", "device.revoke"), ("anonymous", "login-failed"),
                       ("anonymous", "login-failed"), ("anonymous", "rate-limited")]  # one line per run of 429s
    journal = [r.getMessage() for r in caplog.records if r.getMessage().startswith("audit: ")]
    assert len(journal) == len(actions) - 1  # the sign-in before the capture began is in the log only
    page = client.get("/audit").text
    rows = re.findall(r'<tr class="audit-row" data-action="([^"]+)"', page)
    assert rows == [action for _, action in reversed(actions)]
    assert "testclient" in page  # the address each came from


def test_the_audit_page_pages_and_filters_by_actor_action_and_time(dashboard: Dashboard) -> None:
    from server.audit import PAGE_SIZE

    client = dashboard.client
    database = client.app.state.server.db
    day = time.mktime(time.strptime("2026-03-02 12:00", "%Y-%m-%d %H:%M"))
    for i in range(PAGE_SIZE + 30):  # a guesser's flood, the day before, then one operator action
        audit.record(database, "login-failed", actor="anonymous", target=f"name-{i}", address="192.0.2.9",
                     now=day - 86400 + i)
    audit.record(database, "device.revoke", actor="operator:alice", target="pi-7", now=day)

    def rows(path: str) -> list[tuple[str, str]]:
        page = client.get(path)
        assert page.status_code == 200, page.text
        return re.findall(r'<tr class="audit-row" data-action="([^"]+)" data-id="\d+"><td>[^<]*</td><td>([^<]*)</td>',
                          page.text)

    first = client.get("/audit").text
    assert len(rows("/audit")) == PAGE_SIZE  # a page, not the whole log
    older = re.search(r'id="audit-older" href="([^"]+)"', first).group(1).replace("&amp;", "&")
    assert len(rows(older)) > 0 and set(rows(older)).isdisjoint({("device.revoke", "operator:alice")})
    # the operator's action is found under the flood, by actor, by action, or by its day
    assert rows("/audit?actor=alice") == [("device.revoke", "operator:alice")]
    assert rows("/audit?action=device.revoke") == [("device.revoke", "operator:alice")]
    assert rows("/audit?until=2026-02-28") == []  # before anything happened
    on_the_day = rows("/audit?since=2026-03-02&until=2026-03-02&actor=operator")
    assert on_the_day == [("device.revoke", "operator:alice")]
    flood = client.get("/audit?action=login-failed&since=2026-03-01&until=2026-03-01").text
    assert 'id="audit-older"' in flood and "action=login-failed" in flood  # paging keeps the filter
    # a filter that does not read is left out, and the page says so
    odd = html.unescape(client.get("/audit?action=dance&since=yesterday").text)
    assert "no action is called 'dance'" in odd and "since 'yesterday' is not a time" in odd
    assert client.get("/audit?actor=%25").status_code == 200 and rows("/audit?actor=%25") == []  # % is a character
