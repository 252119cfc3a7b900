"""The whole fleet on one machine: a real ``poet-edge server run`` and a real ``poet-edge agent run`` talking HTTP.

The agent enrols with an operator's enrolment token, gets its schedule planned and signed by the server,
verifies it against the pinned key, trains on it, and its heartbeats become the fleet's figures; revoked,
it is refused and says so.  Only the device's sysfs tree is fake (the outside world the monitors read).
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request

import pytest

from agent.config import load_config
from schedules.schedule import Schedule
from common.cli import main
from common.exit_codes import ExitCode
from tests.agent.daemon_helpers import FakeDevice, read_status, start_agent, stop, wait_for, write_config, write_csv
from tests.server.conftest import metric
from tests.server.processes import get, running_server, wait_until_serving

pytest.importorskip("torch")  # the agent's training worker


def scrape(url: str, name: str, **labels: str) -> float:
    """One sample of the server's /metrics (0 when absent)."""
    _, _, body = get(url + "/metrics")
    return metric(body.decode(), name, **labels) or 0.0


def test_an_agent_enrols_trains_on_the_servers_schedule_and_reports_until_revoked(tmp_path, capsys) -> None:
    with running_server(tmp_path, "--solve-time-limit", "20") as server:
        url, data = server.url, server.data
        wait_until_serving(url)
        assert main(["server", "enrol-token", "--data-dir", str(data)]) == ExitCode.OK
        enrolment_token = capsys.readouterr().out.strip()
        _, _, body = get(url + "/api/v1/server-key")
        pinned = tmp_path / "server.pub"
        pinned.write_text(json.loads(body)["public_key"])
        agent_dir = tmp_path / "agent"
        agent_dir.mkdir()
        config = write_config(agent_dir, FakeDevice(agent_dir / "root"), write_csv(agent_dir / "data.csv"),
                              device_name="pi-7", training_steps_per_window=100000, server_url=url,
                              server_enrolment_token=enrolment_token, server_public_key=str(pinned),
                              server_heartbeat_seconds=0.2)
        agent = start_agent(config)
        try:
            wait_for(lambda: read_status(agent_dir).get("steps_done", 0) >= 5, 240, "five steps", agent)
            status = read_status(agent_dir)
            assert status["schedule_from"] == f"fleet server {url}"
            # Solved once by the server; the agent trains on the document it stores, signed with its key.
            assert scrape(url, "poet_server_solve_requests", status="done") == 1
            device_token = load_config(config).device_token_path.read_text().strip()
            request = urllib.request.Request(f"{url}/api/v1/schedules/{status['schedule_id']}",
                                             headers={"Authorization": f"Bearer {device_token}"})
            with urllib.request.urlopen(request, timeout=30) as response:
                stored = Schedule.from_json(response.read())
            assert stored.schedule_id == status["schedule_id"] and stored.signature["key_id"] == server.key_id
            wait_for(lambda: scrape(url, "poet_server_fleet_steps") >= 5, 30, "steps in the fleet's figures", agent)
            assert scrape(url, "poet_server_devices") == 1
            assert scrape(url, "poet_server_devices_by_state", state="training") == 1

            assert main(["server", "revoke", "pi-7", "--data-dir", str(data)]) == ExitCode.OK
            refused = wait_for(lambda: "revoked" in (read_status(agent_dir).get("last_error") or "")
                               and read_status(agent_dir), 30, "the agent to learn it was revoked", agent)
            assert "enrol" in refused["last_error"]  # it says what to do
            steps_seen = scrape(url, "poet_server_fleet_steps")
            time.sleep(1.0)
            assert scrape(url, "poet_server_fleet_steps") == steps_seen  # nothing more is accepted from it
            assert scrape(url, "poet_server_devices") == 0
            assert stop(agent) == 0
        finally:
            if agent.poll() is None:
                stop(agent, signal.SIGKILL)
        assert "Traceback" not in server.log.read_text()
