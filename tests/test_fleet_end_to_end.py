"""The whole fleet on one machine: a real ``poet-edge server run`` and a real ``poet-edge agent run`` talking HTTP.

The agent enrols with an operator's enrolment token, gets its schedule planned and signed by the server,
verifies it against the pinned key, trains on it, and its heartbeats become the fleet's figures; revoked,
it is refused and says so.  Only the device's sysfs tree is fake (the outside world the monitors read).
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from agent.daemon.config import load_config
from schedules.schedule import Schedule
from schedules.cli import main
from schedules.exit_codes import ExitCode
from tests.server.test_cli import get, server_process, wait_until_serving  # noqa: F401  (server_process: fixture)

pytest.importorskip("torch")  # the agent's training worker


def metric(url: str, name: str) -> float:
    """One sample of the server's /metrics, by its full name with labels (0 when absent)."""
    _, _, body = get(url + "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def test_an_agent_enrols_trains_on_the_servers_schedule_and_reports_until_revoked(server_process, tmp_path,  # noqa: F811
                                                                                 capsys) -> None:
    from tests.agent.daemon_helpers import FakeDevice, read_status, start_agent, stop, wait_for, write_config, write_csv

    _, url, data, key_id, log = server_process
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
        # The server solved it once; the schedule the agent trains on is the one it stores, signed with its key.
        assert metric(url, 'poet_server_solve_requests{status="done"}') == 1
        device_token = load_config(config).device_token_path.read_text().strip()
        request = urllib.request.Request(f"{url}/api/v1/schedules/{status['schedule_id']}",
                                         headers={"Authorization": f"Bearer {device_token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            stored = Schedule.from_json(response.read())
        assert stored.schedule_id == status["schedule_id"] and stored.signature["key_id"] == key_id
        wait_for(lambda: metric(url, "poet_server_fleet_steps") >= 5, 30, "steps in the fleet's figures", agent)
        assert metric(url, "poet_server_devices") == 1
        assert metric(url, 'poet_server_devices_by_state{state="training"}') == 1

        assert main(["server", "revoke", "pi-7", "--data-dir", str(data)]) == ExitCode.OK
        refused = wait_for(lambda: "revoked" in (read_status(agent_dir).get("last_error") or "")
                           and read_status(agent_dir), 30, "the agent to learn it was revoked", agent)
        assert "enrol" in refused["last_error"]  # it says what to do
        steps_seen = metric(url, "poet_server_fleet_steps")
        time.sleep(1.0)
        assert metric(url, "poet_server_fleet_steps") == steps_seen  # nothing more is accepted from it
        assert metric(url, "poet_server_devices") == 0
        assert stop(agent) == 0
    finally:
        if agent.poll() is None:
            stop(agent, 9)
    assert "Traceback" not in log.read_text()
