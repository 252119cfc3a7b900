"""The dashboard in a real browser: Debian's chromium driven by Selenium against ``poet-edge server run``.

An operator made with the CLI signs in through the login form; devices enrol
and send heartbeats over HTTP as agents do; their rows appear in the open
fleet page without a reload; the state filter, a device's page and its revoke
button are used as an operator would.  A screenshot is checked for content.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest

from common.cli import main
from common.exit_codes import ExitCode
from tests.server.conftest import heartbeat
from tests.server.processes import wait_until_serving

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
PASSWORD = "a browser's password"
WIDTH, HEIGHT = 1280, 900

pytestmark = pytest.mark.skipif(not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
                                reason="needs Debian's chromium and chromium-driver (/usr/bin/chromium, "
                                       "/usr/bin/chromedriver); .ci/run installs them")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                     "--no-first-run", "--disable-background-networking", "--disable-component-update",
                     "--disable-sync", f"--user-data-dir={tmp_path / 'chromium'}", f"--window-size={WIDTH},{HEIGHT}",
                     "--force-device-scale-factor=1"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver, condition, timeout: float = 15.0, message: str = ""):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition, message)


def fleet_names(driver) -> list[str]:
    """The fleet table's devices in order, read in one script call (the table may be redrawn between calls)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#fleet-body tr'), tr => tr.dataset.device);")


def enrol(http: httpx.Client, token: str, name: str) -> dict[str, str]:
    response = http.post("/api/v1/enrol", json={"enrolment_token": token, "device_name": name})
    assert response.status_code == 201, response.text
    return {"Authorization": f"Bearer {response.json()['device_token']}"}


def test_an_operator_watches_devices_arrive_filters_opens_one_and_revokes_it(server_process, browser, tmp_path,
                                                                               monkeypatch, capsys) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    url, data = server_process.url, server_process.data
    wait_until_serving(url)
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
    assert main(["server", "operator", "add", "admin", "--data-dir", str(data)]) == ExitCode.OK  # beside the server
    tokens = []
    for _ in range(2):
        assert main(["server", "enrol-token", "--data-dir", str(data)]) == ExitCode.OK
        tokens.append(capsys.readouterr().out.strip().splitlines()[-1])

    sign_in(browser, url)
    assert fleet_names(browser) == []
    browser.execute_script("window.poetNotReloaded = true;")

    with httpx.Client(base_url=url, timeout=30) as http:
        trainer, waiter = enrol(http, tokens[0], "pi-trainer"), enrol(http, tokens[1], "pi-waiter")
        start = time.time() - 50
        beats = [heartbeat(sent_at=start + 10 * i, state="training", steps_done=10 * i, loss=1.0 / (i + 1),
                           holdout_accuracy=0.6 + i / 20, energy_j=4.0 * i, peak_bytes=300_000_000 + i * 10**6,
                           memory_budget_bytes=400_000_000, charging=True, battery_percent=90.0,
                           temperature_c=55.0) for i in range(5)]
        assert http.post("/api/v1/heartbeats", json=beats, headers=trainer).status_code == 204
        assert http.post("/api/v1/heartbeats", json=heartbeat(state="waiting", reason="on battery"),
                         headers=waiter).status_code == 204

        wait_for(browser, lambda d: sorted(fleet_names(d)) == ["pi-trainer", "pi-waiter"],
                 message="the heartbeats' devices did not appear")
        assert browser.execute_script("return window.poetNotReloaded === true;")  # refreshed live, not reloaded
        trainer_row = browser.find_element(By.CSS_SELECTOR, '#fleet-body tr[data-device="pi-trainer"]')
        assert "online" in trainer_row.find_element(By.CLASS_NAME, "c-online").text
        assert trainer_row.find_element(By.CLASS_NAME, "c-memory").text == "304 MB / 400 MB"

        Select(browser.find_element(By.ID, "state-filter")).select_by_value("waiting")
        wait_for(browser, lambda d: fleet_names(d) == ["pi-waiter"], message="the filter did not apply")
        assert browser.current_url.endswith("?state=waiting")
        Select(browser.find_element(By.ID, "state-filter")).select_by_value("")
        wait_for(browser, lambda d: len(fleet_names(d)) == 2)
        check_screenshot(browser, tmp_path / "fleet.png")

        browser.find_element(By.LINK_TEXT, "pi-trainer").click()
        wait_for(browser, lambda d: d.find_elements(By.ID, "charts"), message="the device page did not open")
        assert len(browser.find_elements(By.CSS_SELECTOR, "#charts svg.chart")) == 4
        assert browser.find_elements(By.CSS_SELECTOR, "#chart-memory line.rule.budget")
        assert browser.find_elements(By.CSS_SELECTOR, '#chart-memory polyline[data-series="peak"]')
        assert browser.save_screenshot(str(tmp_path / "device.png"))  # kept beside the fleet's, for a person

        browser.find_element(By.ID, "revoke").click()
        wait_for(browser, lambda d: _accept_alert(d), message="no confirmation was asked")
        wait_for(browser, lambda d: d.find_elements(By.ID, "revoked-note"), message="the device was not revoked")
        assert http.post("/api/v1/heartbeats", json=heartbeat(), headers=trainer).status_code == 401
        assert http.post("/api/v1/heartbeats", json=heartbeat(), headers=waiter).status_code == 204


def _accept_alert(driver) -> bool:
    from selenium.common.exceptions import NoAlertPresentException

    try:
        driver.switch_to.alert.accept()
        return True
    except NoAlertPresentException:
        return False


def check_screenshot(driver, path: Path, element: str = "fleet") -> None:
    """The screenshot is a PNG of the viewport, not blank, with dark text where ``element`` (the fleet table) is."""
    from PIL import Image
    from selenium.webdriver.common.by import By

    assert driver.save_screenshot(str(path))
    image = Image.open(path)
    assert image.format == "PNG"
    width, height, ratio = driver.execute_script(
        "return [window.innerWidth, window.innerHeight, window.devicePixelRatio];")
    assert image.size == (round(width * ratio), round(height * ratio))
    pixels = image.convert("RGB")
    assert len(pixels.getcolors(maxcolors=1 << 20) or []) > 50  # far from a blank page
    box = driver.find_element(By.ID, element).rect
    table = pixels.crop(tuple(round(v * ratio) for v in (box["x"], box["y"], box["x"] + box["width"],
                                                         min(box["y"] + box["height"], height))))
    dark = int((np.asarray(table).max(axis=2) < 90).sum())
    assert dark > 300, f"only {dark} dark pixels where #{element} is"


# -- a fleet of 10,000 ----------------------------------------------------------------------------------
FLEET = 10_000
STATES = ("training", "waiting", "backing off", "preparing", "stopped")
REVOKED = {i * 397 + 1 for i in range(25)}
OFFLINE = {i for i in range(0, FLEET, 10)} - REVOKED  # heard from an hour ago


def seed_fleet(data: Path, count: int) -> dict[str, str]:
    """``count`` enrolled devices with a heartbeat each (every tenth an hour ago, so offline; 25 revoked), and
    fleet samples over the last hour.  Devices are inserted in one statement (10,000 enrolments one by one
    would take a minute); heartbeats go through the server's own recording.  Device name -> its token."""
    from sqlalchemy import insert

    from server.config import ServerSettings
    from server.datadir import open_database
    from server.db.models import Device
    from server.devices import authenticate, record_heartbeats, revoke
    from server.fleet_history import FleetSampler
    from server.tokens import new_token, token_hash

    db = open_database(ServerSettings(data_dir=data))
    now = time.time()
    tokens = {f"dev-{i:05d}": new_token() for i in range(count)}
    try:
        with db.write() as session:
            session.execute(insert(Device), [{"name": name, "token_hash": token_hash(token), "enrolled_at": now - 7200}
                                             for name, token in tokens.items()])
        sampler = FleetSampler(db, online_seconds=60.0)
        sampler.sample(now - 3600)
        for i, (name, token) in enumerate(tokens.items()):
            beat = heartbeat(state=STATES[i % len(STATES)], steps_done=(i * 7919) % 10007, energy_j=float(i % 977),
                             sent_at=now)
            record_heartbeats(db, authenticate(db, token).id, [beat], now - 3600 if i % 10 == 0 else now, keep=10)
        for i in REVOKED:
            revoke(db, f"dev-{i:05d}", now)
        for minute in (50, 40, 30, 20, 10):
            sampler.sample(now - minute * 60)
    finally:
        db.dispose()
    return tokens


def sign_in(browser, url: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(url + "/")
    wait_for(browser, lambda d: d.find_elements(By.ID, "login-form"), message="no login form")
    browser.find_element(By.ID, "username").send_keys("admin")
    browser.find_element(By.ID, "password").send_keys(PASSWORD)
    browser.find_element(By.ID, "login-submit").click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "fleet"), message="the fleet page did not open")


def column(browser, key: str) -> list[str]:
    """The shown text of one column, read in one script call (the table may be redrawn between two calls)."""
    return browser.execute_script(
        "return Array.from(document.querySelectorAll('#fleet-body td.c-' + arguments[0]), td => td.innerText);", key)


@pytest.mark.slow
def test_an_operator_pages_searches_and_sorts_a_fleet_of_ten_thousand(server_process, browser, tmp_path,
                                                                       monkeypatch) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    url, data = server_process.url, server_process.data
    wait_until_serving(url)
    tokens = seed_fleet(data, FLEET)
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
    assert main(["server", "operator", "add", "admin", "--data-dir", str(data)]) == ExitCode.OK
    sign_in(browser, url)
    position = browser.find_element(By.ID, "page-position")
    assert fleet_names(browser) == [f"dev-{i:05d}" for i in range(50)]
    assert position.text == "1–50 of 10,000, page 1 of 200"
    assert browser.find_element(By.ID, "count-devices").text == "10,000"
    assert browser.find_element(By.ID, "count-revoked").text == "25"
    assert browser.find_element(By.ID, "count-offline").text == f"{len(OFFLINE):,}"
    check_screenshot(browser, tmp_path / "fleet-10000.png")

    browser.find_element(By.CSS_SELECTOR, 'th[data-key="steps"] a').click()  # most steps first
    wait_for(browser, lambda d: "sort=steps" in d.current_url and column(d, "steps")[0] == "10,006",
             message="sorting by steps did not apply")
    steps = [int(text.replace(",", "")) for text in column(browser, "steps")]
    assert steps == sorted(steps, reverse=True) and len(steps) == 50
    browser.find_element(By.ID, "page-next").click()
    wait_for(browser, lambda d: d.find_element(By.ID, "page-position").text.startswith("51–100 of 10,000"))
    assert max(int(t.replace(",", "")) for t in column(browser, "steps")) <= steps[-1]

    search = browser.find_element(By.ID, "search")
    search.send_keys("dev-0999")
    wait_for(browser, lambda d: sorted(fleet_names(d)) == [f"dev-0999{i}" for i in range(10)],
             message="the search did not apply")
    Select(browser.find_element(By.ID, "status-filter")).select_by_value("offline")
    wait_for(browser, lambda d: fleet_names(d) == ["dev-09990"], message="the status filter did not apply")
    assert "status=offline" in browser.current_url and "q=dev-0999" in browser.current_url
    search.clear()
    Select(browser.find_element(By.ID, "status-filter")).select_by_value("")
    Select(browser.find_element(By.ID, "state-filter")).select_by_value("training")
    training = {i for i in range(0, FLEET, len(STATES))} - OFFLINE - REVOKED  # online, reporting training
    wait_for(browser, lambda d: d.find_element(By.ID, "fleet-count").text == f"{len(training):,} devices",
             message="the state filter did not apply")
    assert set(column(browser, "state")) == {"training"}

    # A live update rewrites only the row that changed: the operator's selection in another row stays.
    browser.get(url + "/")
    wait_for(browser, lambda d: len(fleet_names(d)) == 50)
    browser.execute_script("""
        var cell = document.querySelector('#fleet-body tr[data-device="dev-00004"] td.c-reason');
        cell.parentNode.poetKept = true;
        var range = document.createRange(); range.selectNodeContents(cell);
        window.getSelection().removeAllRanges(); window.getSelection().addRange(range);""")
    selected = browser.execute_script("return window.getSelection().toString();")
    with httpx.Client(base_url=url, timeout=30) as http:
        response = http.post("/api/v1/heartbeats", json=heartbeat(state="training", steps_done=123_456),
                             headers={"Authorization": f"Bearer {tokens['dev-00003']}"})
        assert response.status_code == 204
    wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, '#fleet-body tr[data-device="dev-00003"] td.c-steps')
             .text == "123,456", message="the heartbeat did not reach the open page")
    assert browser.execute_script("return window.getSelection().toString();") == selected != ""
    assert browser.execute_script(
        'return document.querySelector(\'#fleet-body tr[data-device="dev-00004"]\').poetKept === true;')

    browser.get(url + "/fleet/charts")
    wait_for(browser, lambda d: d.find_elements(By.ID, "fleet-charts"), message="the fleet charts did not open")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#fleet-charts svg.chart")) == 3
    assert browser.find_elements(By.CSS_SELECTOR, '#chart-states polyline[data-series="training"]')
    assert browser.find_elements(By.CSS_SELECTOR, '#chart-steps polyline[data-series="steps"]')
    check_screenshot(browser, tmp_path / "fleet-charts.png", "fleet-charts")
