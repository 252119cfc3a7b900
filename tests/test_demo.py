"""``poet-edge demo`` in its short mode: the whole fleet on this machine, and what it leaves behind.

Every part is the real program (server, SuperLink, agents, SuperNodes, ``federate``); only the devices'
sysfs trees are fake.  The dashboard is then opened in Debian's chromium as an operator would.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import psutil
import pytest

from demo.fleet_demo import DEVICES, UNPLUGGED, FleetDemo
from schedules.schedule import Schedule
from schedules.signing import load_public_key
from tests.server.test_dashboard_browser import CHROMEDRIVER, CHROMIUM, browser, fleet_names, wait_for  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _processes_under(root: Path) -> list[int]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if str(root) in " ".join(process.info["cmdline"] or ()):
                found.append(process.pid)
        except psutil.Error:
            pass
    return found


@pytest.mark.skipif(not (CHROMIUM.exists() and CHROMEDRIVER.exists()), reason="needs Debian's chromium")
def test_the_demo_trains_unplugs_resumes_federates_and_leaves_models_and_no_process(tmp_path, browser) -> None:
    from selenium.webdriver.common.by import By

    root, story = tmp_path / "demo", io.StringIO()
    demo = FleetDemo(root, short=True, out=story)
    try:
        outcome = demo.tell()
        # the dashboard shows the three devices to the operator the demo printed
        user, password = (root / "operator.txt").read_text().split()
        browser.get(demo.url + "/")
        wait_for(browser, lambda d: d.find_elements(By.ID, "login-form"), message="no login form")
        browser.find_element(By.ID, "username").send_keys(user)
        browser.find_element(By.ID, "password").send_keys(password)
        browser.find_element(By.ID, "login-submit").click()
        wait_for(browser, lambda d: sorted(fleet_names(d)) == sorted(d.name for d in DEVICES), 30,
                 message="the dashboard does not list the three devices")
        assert browser.save_screenshot(str(tmp_path / "dashboard.png"))
    finally:
        demo.close()
    text = story.getvalue()
    assert f"user: operator  password: {password}" in text
    key = load_public_key(root / "server.pub")
    for spec in DEVICES:
        # planned by the server for the device's budget, signed by it, verified here again
        assert outcome.schedule_from[spec.name].startswith("fleet server http://127.0.0.1")
        cached = list((root / spec.name / "state" / "prepared").glob("*/schedule-*.json"))
        schedule = Schedule.load(cached[0], public_key=key)
        assert schedule.schedule_id == outcome.schedules[spec.name]
        window = outcome.window[spec.name]
        assert window["steps_done"] >= 30 and 0 < window["peak_bytes"] <= window["bound_bytes"]
    # the smallest device trains under a third of a plain step's memory, and its steps measured there
    smallest, plain = outcome.window[DEVICES[0].name], outcome.plain_bytes[DEVICES[0].name]
    assert smallest["memory_budget_bytes"] < plain / 3 and smallest["peak_bytes"] < plain / 3
    unplug = outcome.unplug
    assert unplug["device"] == UNPLUGGED and unplug["steps_at_stop"] >= unplug["steps_seen"]
    assert unplug["steps_after_resume"] > unplug["steps_at_stop"]  # went on from the checkpointed steps
    assert outcome.window[UNPLUGGED]["steps_done"] >= unplug["steps_at_stop"] + 30  # a whole window after it
    assert len(outcome.rounds) == 3 and outcome.versions == 3  # the vendor's, imported, and one per round
    # every device and the federation started from the vendor's pretrained model, as the operator imported it
    assert outcome.vendor["accuracy"] > 0.8 and "imported from" in text and "v1\timported from" in text
    from agent.config import load_config
    from agent.weight_files import fingerprint

    vendor_sha = fingerprint(Path(outcome.vendor["file"]))
    for spec in DEVICES:
        config = load_config(root / spec.name / "agent.toml")
        assert config.workload.weights == Path(outcome.vendor["file"])
        kept = json.loads((root / spec.name / "state" / "personal" / "model.json").read_text())
        assert kept["weights_sha256"] == vendor_sha
    from server.config import ServerSettings
    from server.federated.rounds import open_store
    from server.model_versions import list_versions

    chain = list_versions(open_store(ServerSettings(data_dir=root / "server").database_url))
    assert [(v.version, v.run_id, v.parent) for v in chain[::-1]][:2] == [(1, "import", None), (2, chain[1].run_id, 1)]
    for row in outcome.rounds:
        assert 0 <= row["global-accuracy"] <= 1 and 0 <= row["personal-accuracy"] <= 1
        assert 0 <= row["local-accuracy"] <= 1
        kept = ("global", "personal", "local")[int(row["kept"])]  # the best on half its held-out data
        assert row["kept-accuracy"] == row[f"{kept}-accuracy"]
    assert sorted(outcome.personal_models) == sorted(d.name for d in DEVICES)
    provenance = json.loads(Path(outcome.personal_models[DEVICES[0].name]).read_text())
    assert provenance["global_version"] >= 1
    assert all(p.stat().st_size > 10_000 for p in outcome.pictures)
    assert not _processes_under(root)  # server, SuperLink, agents, SuperNodes, runners: all gone
