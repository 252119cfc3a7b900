"""A real Flower deployment on 127.0.0.1: the server's supervised SuperLink with TLS and SuperNode authentication,
and three device agents (``poet-edge agent run``) whose SuperNodes follow their device's eligibility (a fake sysfs
tree plugged and unplugged) and whose warm runners fork the ClientApps.

Each device trains the digits model on its own rotated share of the digits (a ``.npz`` data file) under its own
memory budget; the rounds are the product's apps, submitted with ``poet-edge server federate``, and land in the
server's rounds table.  The tests share one deployment and run in file order.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from agent.federated.supernode import ensure_key, flower_binary
from engine.training import DEFAULT_TOLERANCE_BYTES
from demo.flower_fleet import Fleet, run_id_of, wait_for
from common.programs import flower_environment, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DEVICES = ("pi-0", "pi-1", "pi-2")
# Whole-step budgets: with torch 2.14's CUDA build on x86_64 no schedule of the digits model in an agent fits
# below about 6.7 MB (most of it what the model's first run leaves resident and the pager's I/O buffers); pi-2
# has room for all of it.
BUDGETS = {"pi-0": "7.2MB", "pi-1": "7.6MB", "pi-2": "12MB"}
LOCAL_STEPS = 1000  # seconds of training: long enough to unplug a device in the middle


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    fleet = Fleet(tmp_path_factory.mktemp("flower"), BUDGETS)
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.close()


def test_registered_keys_get_node_ids_and_the_devices_come_online(fleet: Fleet) -> None:
    for name in DEVICES:
        done = fleet.register(name)
        assert done.returncode == 0, done.stderr
        assert f"registered {name}: node id" in done.stdout
    for name in DEVICES:
        fleet.start_agent(name)
    online = wait_for(lambda: (nodes := fleet.online()).keys() >= set(DEVICES) and nodes, 90, "three SuperNodes")
    names = json.loads((fleet.settings.flower_dir / "supernodes.json").read_text())
    assert {name: names[name]["node_id"] for name in DEVICES} == {name: online[name] for name in DEVICES}
    assert all(fleet.status(name)["supernode"].startswith("running") for name in DEVICES)
    # a federated device trains only when a round asks: no local training window of its own
    assert all("federated" in fleet.status(name)["reason"] and not fleet.status(name)["steps_done"]
               for name in DEVICES)


def test_an_unregistered_key_is_refused(fleet: Fleet, tmp_path: Path) -> None:
    import psutil

    key, output = tmp_path / "stranger.key", tmp_path / "stranger.log"
    ensure_key(key)
    with open(output, "wb") as log:  # a file, not a pipe: the SuperExec it leaves would hold a pipe open
        stranger = subprocess.Popen(
            [str(flower_binary("flower-supernode")), "--superlink", fleet.settings.flower.address,
             "--root-certificates", str(fleet.settings.flower.tls_dir / "ca.crt"),
             "--auth-supernode-private-key", str(key), "--port", str(free_port())],
            env=flower_environment(tmp_path / "home", flower_binary("flower-supernode").parent),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    below: set[Any] = set()
    try:
        deadline = time.monotonic() + 60
        while stranger.poll() is None and time.monotonic() < deadline:
            below.update(psutil.Process(stranger.pid).children(recursive=True))
            time.sleep(0.1)
        assert stranger.poll() not in (None, 0)
        assert "Exit Code: 305" in output.read_text()  # Flower's "could not activate the SuperNode"
    finally:
        if stranger.poll() is None:
            stranger.kill()
        for process in below:  # the SuperExec it started in a session of its own
            try:
                process.kill()
            except psutil.Error:
                pass
        stranger.wait()


def test_the_supernode_follows_eligibility(fleet: Fleet) -> None:
    fleet.devices["pi-1"].unplug()
    wait_for(lambda: fleet.status("pi-1").get("supernode", "").startswith("stopped"), 30, "pi-1's SuperNode stops")
    wait_for(lambda: "pi-1" not in fleet.online(), 90, "pi-1 offline at the SuperLink")
    assert not _flower_processes_of(fleet.agents["pi-1"].pid)  # the whole group went, SuperExec included
    fleet.devices["pi-1"].plug()
    wait_for(lambda: "pi-1" in fleet.online(), 90, "pi-1 online again")


def test_a_superlink_crash_is_restarted_and_the_supernodes_reconnect_with_their_ids(fleet: Fleet) -> None:
    before = wait_for(lambda: (nodes := fleet.online()).keys() >= set(DEVICES) and nodes, 90, "three online")
    starts = fleet.superlink.starts
    fleet.superlink.kill()
    wait_for(lambda: fleet.superlink.starts > starts, 30, "the supervisor restarts the SuperLink")
    fleet.superlink.wait_ready(60)
    after = wait_for(lambda: (nodes := fleet.online()).keys() >= set(DEVICES) and nodes, 120, "three online again")
    assert {name: after[name] for name in DEVICES} == {name: before[name] for name in DEVICES}


def test_federated_rounds_complete_with_a_device_unplugged_mid_round(fleet: Fleet) -> None:
    fleet.wait_online()
    output = fleet.root / "federate.log"
    federate = fleet.federate(output, "--rounds", "2", "--min-nodes", "2", "--local-steps", str(LOCAL_STEPS),
                              "--finetune-steps", "20", "--round-timeout", "240")
    try:
        # round 1's training: the first train message pi-2's SuperNode receives (it trains for seconds)
        supernode_log = fleet.flower_file("pi-2", "supernode.log")
        offset = supernode_log.stat().st_size
        wait_for(lambda: "Receiving: train message" in supernode_log.read_text(errors="replace")[offset:], 240,
                 "pi-2 receiving round 1's training")
        wait_for(lambda: fleet.clientapps("pi-2"), 30, "pi-2's ClientApp training")
        # the agents say so: a federated device is training while a ClientApp of its runs
        wait_for(lambda: fleet.status("pi-2").get("state") == "training", 30, "pi-2's status: training")
        time.sleep(1.0)
        fleet.devices["pi-2"].unplug()
        assert federate.wait(600) == 0, output.read_text()
    finally:
        if federate.poll() is None:
            federate.kill()
    wait_for(lambda: all(fleet.status(name).get("state") == "waiting" for name in ("pi-0", "pi-1")), 30,
             "the devices waiting again after the run")
    everything = fleet.rows(run_id_of(output))
    errors = [r for r in everything if "error" in r.metrics]
    rows = [r for r in everything if "error" not in r.metrics]
    devices = {(r.round, r.phase): sorted(x.device_name for x in rows if (x.round, x.phase) == (r.round, r.phase))
               for r in rows}
    # pi-2 left mid-round: it answered round 1's training with an error, named after its registered node id
    assert [(r.round, r.phase, r.device_name) for r in errors] == [(1, "train", "pi-2")]
    assert devices[(1, "train")] == ["pi-0", "pi-1"]
    assert devices[(2, "train")] == ["pi-0", "pi-1"]  # and it was not sampled any more
    assert devices[(3, "personalize")] == ["pi-0", "pi-1"]
    assert devices[(3, "keep")] == ["pi-0", "pi-1"]  # ... and kept the fleet's choice
    kept = {r.device_name: r.metrics for r in rows if r.phase == "keep"}
    assert len({m["kept"] for m in kept.values()}) == 1 and all(m["kept-by-fleet"] == 1 for m in kept.values())
    train = [r for r in rows if r.phase == "train"]
    # each device trained its own data under its own schedule, within its budget; the same keys from all
    for phase in ("train", "evaluate", "personalize"):
        assert len({frozenset(r.metrics) for r in rows if r.phase == phase}) == 1
    for row in train:
        budget = {"pi-0": 7_200_000, "pi-1": 7_600_000}[row.device_name]
        assert row.metrics["budget-bytes"] == budget
        assert 0 < row.metrics["peak-bytes"] <= budget + DEFAULT_TOLERANCE_BYTES  # as the memory check judges
        assert row.metrics["steps"] == LOCAL_STEPS and row.schedule_id
        assert row.metrics["startup-seconds"] >= 0  # measured (benchmarks/flower_overhead.py has the figure)
    printed = output.read_text()
    assert "round 3 personalize" in printed and "round 1 train       pi-2" in printed
    assert "round 3 keep" in printed and "(the fleet's choice; its own: " in printed
    for name in DEVICES:  # every ClientApp was forked by the device's warm runner, none started cold
        runner_log = fleet.flower_file(name, "clientapps.log").read_text(errors="replace")
        assert "Start `flwr-clientapp` process" in runner_log
        supernode_log = fleet.flower_file(name, "supernode.log").read_text(errors="replace")
        assert "Start `flwr-clientapp` process" not in supernode_log
    fleet.devices["pi-2"].plug()  # back for the tests after this one


def test_a_run_survives_a_superlink_killed_mid_round_from_its_last_stored_global_model(fleet: Fleet) -> None:
    from server.model_versions import list_versions
    from server.federated.rounds import open_store

    fleet.wait_online()
    database = open_store(fleet.settings.database_url)
    output = fleet.root / "federate-restart.log"
    federate = fleet.federate(output, "--rounds", "3", "--min-nodes", "2", "--local-steps", "300",
                              "--personalization", "none", "--round-timeout", "240")
    try:
        first = wait_for(lambda: "federated run " in output.read_text() and run_id_of(output), 120, "the run")
        wait_for(lambda: list_versions(database, run_id=str(first)), 300, "round 1's global model stored")
        fleet.superlink.kill()  # in round 2
        assert federate.wait(900) == 0, output.read_text()
    finally:
        if federate.poll() is None:
            federate.kill()
    printed = output.read_text()
    runs = [int(part.split()[0]) for part in printed.split("federated run ")[1:]]
    assert len(runs) == 2 and runs[0] == first, printed
    done = max(v.round for v in list_versions(database, run_id=str(first)))
    assert f"submitting again from round {done + 1}" in printed
    chain = sorted((v for run in runs for v in list_versions(database, run_id=str(run))), key=lambda v: v.version)
    assert [v.round for v in chain] == [1, 2, 3]
    # the second run went on from the first's last stored model: one unbroken chain of versions
    assert [v.parent for v in chain[1:]] == [v.version for v in chain[:-1]]
    assert {r.round for r in fleet.rows(first) if r.phase == "train"} >= set(range(1, done + 1))  # rows stay
    assert {r.round for r in fleet.rows(runs[1]) if r.phase == "train"} == set(range(done + 1, 4))


def _flower_processes_of(agent_pid: int) -> list[str]:
    import psutil

    return [" ".join(p.cmdline()[:2]) for p in psutil.Process(agent_pid).children(recursive=True)
            if any("flower" in part or "flwr" in part for part in p.cmdline()[:2])]
