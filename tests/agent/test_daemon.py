"""The agent daemon as an operator runs it: a real ``poet-edge agent run`` process on a fake sysfs tree."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import torch

from agent.daemon.checkpoint import CheckpointStore
from agent.config import load_config
from agent.errors import ConfigError
from agent.prepare import prepare, training_spec
from agent.daemon.trainer import Trainer
from agent.data import open_dataset
from schedules.budgets import smallest_feasible_budget, store_all_peak
from schedules.device import DeviceProfile
from schedules.graph import TrainingGraph
from schedules.plan import plan
from common.programs import free_port
from schedules.schedule import Schedule
from schedules.signing import generate_keypair, load_private_key, sign
from tests.agent.daemon_helpers import (FakeDevice, agent_command, copy_prepared, read_status, start_agent, stop,
                                        wait_for, write_config, write_csv, REPO)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state directory holding this workload's profile, made once (profiling is per device, not per test)."""
    root = tmp_path_factory.mktemp("template")
    device = FakeDevice(root / "root")
    config = load_config(write_config(root, device, write_csv(root / "data.csv")))
    prepare(config)
    return root / "state"


@pytest.fixture()
def rig(tmp_path: Path, template: Path):
    """A fake device, its data and a function writing its config (the profile copied from the template)."""
    device = FakeDevice(tmp_path / "root")
    data = write_csv(tmp_path / "data.csv")
    copy_prepared(template, tmp_path / "state")

    def config(**overrides) -> Path:
        return write_config(tmp_path, device, data, **overrides)

    return device, config, tmp_path


def checkpoint_state(state_dir: Path) -> tuple[int, dict]:
    """The newest checkpoint of the (single) workload under ``state_dir``."""
    (directory,) = (state_dir / "checkpoints").iterdir()
    loaded = CheckpointStore(directory).load_latest()
    return loaded.steps_done, loaded.state


def reference_training(config_path: Path, steps: int, tmp: Path) -> dict:
    """An uninterrupted run of ``steps`` steps, in this process, from the initial weights."""
    torch.set_num_threads(1)
    config = load_config(config_path)
    prepared = prepare(config)
    shape = tuple(prepared.workload.inputs.shape)
    data = open_dataset(config.data.path, shape, holdout=config.data.holdout, seed=config.workload.seed)
    trainer = Trainer(config, prepared, data, store=CheckpointStore(tmp / "reference"))
    try:
        for _ in range(steps):
            trainer.step()
        return {"model": trainer.model.state_dict(), "optimizer": trainer.training.fused.state_dict()}
    finally:
        trainer.close()


def assert_bit_identical(a: dict, b: dict) -> None:
    """``a`` read from a checkpoint (stored tensors), ``b`` in memory."""
    for name, tensor in a["model"].items():
        assert torch.equal(tensor.load(), b["model"][name]), f"parameter {name} differs"
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    for index, state in a["optimizer"]["state"].items():
        for key, value in state.items():
            other = b["optimizer"]["state"][index][key]
            assert torch.equal(value.load(), other) if hasattr(value, "load") else value == other


def test_plugging_in_starts_training_and_unplugging_stops_it_at_a_step_boundary(rig) -> None:
    device, config, tmp = rig
    device.unplug()
    agent = start_agent(config(training_steps_per_window=100000))
    try:
        waiting = wait_for(lambda: (s := read_status(tmp)).get("state") == "waiting" and "battery" in s["reason"]
                           and s, 60, "waiting on battery", agent)
        assert "43%" in waiting["reason"]
        assert (waiting["power_source"], waiting["charging"], waiting["battery_percent"]) == ("battery", False, 43)
        assert waiting["temperature_c"] == 45.0 and waiting["cpu_load"] >= 0
        device.plug()
        wait_for(lambda: read_status(tmp).get("steps_done", 0) >= 3, 60, "training steps", agent)
        status = read_status(tmp)
        assert status["state"] == "training" and status["schedule_id"]
        assert status["peak_bytes"] <= status["bound_bytes"]  # the agent's own memory bound held
        assert status["samples_skipped"] == 2 and "2 skipped" in status["data"]
        unplugged = time.monotonic()
        device.unplug()
        stopped = wait_for(lambda: (s := read_status(tmp)).get("state") == "waiting" and s, 30, "training stopped",
                           agent)
        elapsed = time.monotonic() - unplugged
        # a step of this model takes milliseconds: the bound is the poll interval, the step and its checkpoint
        assert elapsed < 2.0 + 1.0, f"stopped {elapsed:.2f} s after unplugging"
        assert "battery" in stopped["reason"] and "stop requested" not in stopped["reason"]  # why, at once
        steps, _ = checkpoint_state(tmp / "state")
        assert steps == stopped["steps_done"]  # the last committed step is in the checkpoint
        before = steps
        time.sleep(0.5)
        assert read_status(tmp)["steps_done"] == before  # nothing trains on battery
        device.plug()
        wait_for(lambda: read_status(tmp).get("steps_done", 0) > before, 60, "training resumed", agent)
    finally:
        assert stop(agent) == 0


def test_a_disk_that_refuses_checkpoints_backs_off_longer_each_time_and_status_shows_what_is_kept(rig) -> None:
    """A file-size limit on the agent makes the kernel refuse each checkpoint with optimizer state (EFBIG) as a
    full disk would (ENOSPC), while its small status file and the step-0 checkpoint of the initial weights (37 KB
    against 64 KB with momentum) still fit.  Steps that were never checkpointed are not progress: the waits
    grow, and the status counts only what a checkpoint holds."""
    device, config, tmp = rig
    limited = ["prlimit", "--fsize=49152", "--"]
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    agent = subprocess.Popen(limited + agent_command("agent", "run", "--config",
                                                     str(config(training_checkpoint_every=3))),
                             env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True, text=True)
    try:
        waits, saved = set(), set()

        def third_wait() -> dict | None:
            status = read_status(tmp)
            saved.add(status.get("steps_saved"))
            if status.get("state") == "backing off":
                waits.add(re.search(r"next try in (\d+) s", status["reason"]).group(1))
            return status if {"1", "2", "4"} <= waits else None

        status = wait_for(third_wait, 90, "waits of 1, 2 and 4 s", agent)
        assert status["steps_done"] == 0  # nothing reached a checkpoint
        assert saved <= {None, 0} and 0 in saved  # while steps ran, the status never said they were saved
        assert "cannot write checkpoint" in status["last_error"] and "trained again" in status["reason"]
    finally:
        assert stop(agent) == 0


def paging_budget(state: Path, config_path: Path) -> int:
    """Halfway between the smallest whole-step budget with a schedule and the plain step's, on the profile in
    ``state``: the schedule must page or recompute, and it exists (the edge moves with the workspaces a process
    measures)."""
    (directory,) = (state / "prepared").glob("*")
    graph, device = TrainingGraph.load(directory / "graph.json"), DeviceProfile.load(directory / "device.json")
    spec = training_spec(load_config(config_path))
    smallest = smallest_feasible_budget(graph, lambda b, t: plan(graph, device, memory_budget=b, time_limit=t,
                                                                 training=spec), training=spec)
    assert smallest.budget is not None
    return (smallest.budget + store_all_peak(graph, spec)) // 2


def test_kill9_at_any_moment_resumes_to_bit_identical_parameters(rig, template: Path) -> None:
    device, config, tmp = rig
    # below the MLP's plain step: the schedule pages or recomputes (dropout masks replayed) or keeps state on flash
    budget = paging_budget(template, config())
    path = config(training_steps_per_window=24, training_checkpoint_every=2, training_memory_budget=budget)
    kills = 0
    for at_least in (3, 9, 14):  # kill in three windows, each further along
        agent = start_agent(path)
        wait_for(lambda: read_status(tmp).get("steps_done", 0) >= at_least, 120, f"step {at_least}", agent)
        time.sleep(0.013 * at_least)  # some moment between or inside steps and checkpoints
        stop(agent, signal.SIGKILL)
        kills += 1
    agent = start_agent(path)
    try:
        wait_for(lambda: (s := read_status(tmp)).get("state") == "waiting" and "window done" in s["reason"], 120,
                 "a whole window", agent)
    finally:
        stop(agent)
    steps, state = checkpoint_state(tmp / "state")
    assert steps >= 24
    (schedule_file,) = (tmp / "state/prepared").glob(f"*/schedule-{budget}-*.json")
    schedule = Schedule.load(schedule_file)
    instructions = schedule.instructions
    computes = sum(op == "compute" for op, _ in instructions)
    # below the plain step's memory the plan pages activations, recomputes them, or keeps momentum on flash
    assert any(op == "page_out" for op, _ in instructions) or computes > len({n for _, n in instructions}) \
        or schedule.step.paged_state_bytes > 0
    assert_bit_identical(state, reference_training(path, steps, tmp))


def test_sigterm_checkpoints_every_committed_step_and_exits(rig) -> None:
    device, config, tmp = rig
    agent = start_agent(config(training_steps_per_window=100000, training_checkpoint_every=1000))
    wait_for(lambda: read_status(tmp).get("steps_done", 0) >= 4, 60, "training steps", agent)
    started = time.monotonic()
    assert stop(agent) == 0
    assert time.monotonic() - started < 10
    status = read_status(tmp)
    assert status["state"] == "stopped"
    steps, _ = checkpoint_state(tmp / "state")
    assert steps == status["steps_done"] >= 4


def test_a_damaged_newest_checkpoint_is_passed_over_in_the_open_and_the_good_one_kept(rig) -> None:
    device, config, tmp = rig
    path = config(training_steps_per_window=6, training_checkpoint_every=3)
    agent = start_agent(path)
    wait_for(lambda: "window done" in read_status(tmp).get("reason", ""), 60, "a whole window", agent)
    assert stop(agent) == 0
    (directory,) = (tmp / "state" / "checkpoints").iterdir()
    newest = directory / "step-000000006.ckpt"
    newest.write_bytes(newest.read_bytes()[:-10])  # the disk lost the end of the last write
    agent = start_agent(path)
    try:
        status = wait_for(lambda: (s := read_status(tmp)).get("checkpoints_passed_over") and s, 60,
                          "the damaged checkpoint passed over", agent)
        assert "step-000000006.ckpt" in status["checkpoints_passed_over"][0]
        wait_for(lambda: "window done" in read_status(tmp).get("reason", ""), 60, "the window after", agent)
        shown = subprocess.run(agent_command("agent", "status", "--config", str(path)), capture_output=True,
                               text=True, env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
        assert "passed over" in shown and "step-000000006.ckpt" in shown
    finally:
        assert stop(agent) == 0
    kept = sorted(p.name for p in directory.iterdir())
    assert kept == ["step-000000006.ckpt", "step-000000006.ckpt.damaged", "step-000000009.ckpt"]


def test_a_budget_found_infeasible_is_not_solved_again_until_something_changes(rig, monkeypatch) -> None:
    import sys

    from schedules.errors import InfeasibleBudgetError

    device, config, tmp = rig
    solves = []
    planner = sys.modules["schedules.plan"]  # the module: the package exports its `plan` under the same name
    real_plan = planner.plan
    monkeypatch.setattr(planner, "plan", lambda *a, **k: solves.append(k.get("memory_budget")) or
                        real_plan(*a, **k))  # a spy: every solve still runs for real
    tiny = load_config(config(training_memory_budget="2kB"))
    with pytest.raises(InfeasibleBudgetError, match="smallest budget that fits is") as first:
        prepare(tiny)
    assert solves and "earlier solve" not in str(first.value)
    solves.clear()
    with pytest.raises(InfeasibleBudgetError, match="found by an earlier solve") as again:
        prepare(tiny)  # as the daemon does after each backoff
    assert not solves and str(first.value) in str(again.value)
    prepare(load_config(config(training_memory_budget="15MB")))  # another budget is solved as ever
    assert solves


def test_a_worker_whose_daemon_died_checkpoints_and_exits_quietly(rig) -> None:
    import psutil

    device, config, tmp = rig
    agent = start_agent(config(training_steps_per_window=100000, training_checkpoint_every=1000))
    try:
        wait_for(lambda: read_status(tmp).get("steps_done", 0) >= 3, 60, "training steps", agent)
        (worker,) = psutil.Process(agent.pid).children()
        os.kill(agent.pid, signal.SIGKILL)  # the daemon dies; its training process lives on, orphaned
        worker.wait(30)  # not our child: its exit code is the daemon's to read, and the daemon is gone
        output = agent.stdout.read()  # the worker wrote to the daemon's standard error: ends when it exits
    finally:
        try:
            os.killpg(agent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        agent.wait()
    assert "the agent daemon is gone" in output
    assert "Traceback" not in output and "BrokenPipe" not in output
    steps, _ = checkpoint_state(tmp / "state")
    assert steps >= read_status(tmp)["steps_done"] >= 3  # every step it reported, and any after, is kept


def test_a_window_stops_at_its_wall_clock_cap_and_every_window_is_in_the_history(rig) -> None:
    device, config, tmp = rig
    path = config(training_steps_per_window=100000, training_checkpoint_every=1000, training_max_window_seconds=12,
                  training_window_gap_seconds=3600)
    agent = start_agent(path)
    try:
        status = wait_for(lambda: (s := read_status(tmp)).get("state") == "waiting" and "cap of 12 s" in s["reason"]
                          and "next window in" in s["reason"] and s, 60, "the window's cap, then its gap", agent)
        assert status["steps_done"] > 0
    finally:
        assert stop(agent) == 0
    steps, _ = checkpoint_state(tmp / "state")
    shown = subprocess.run(agent_command("agent", "status", "--config", str(path), "--history", "--json"),
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    (window,) = json.loads(shown.stdout)
    assert window["outcome"] == "stopped" and "cap of 12 s" in window["reason"]
    assert (window["steps_from"], window["steps_to"]) == (0, steps) and 12 <= window["seconds"] < 40
    assert window["energy_j"] > 0 and window["loss"] is not None
    table = subprocess.run(agent_command("agent", "status", "--config", str(path), "--history"),
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    assert f"0->{steps}" in table and "stopped: the window reached its cap" in table


def test_a_disk_with_too_little_room_keeps_the_device_waiting(rig) -> None:
    device, config, tmp = rig
    agent = start_agent(config(eligibility_min_free_storage="1000TB"))
    try:
        status = wait_for(lambda: (s := read_status(tmp)).get("state") == "waiting" and "storage low" in s["reason"]
                          and s, 30, "storage low", agent)
        assert status["steps_done"] == 0
    finally:
        assert stop(agent) == 0


def test_start_jitter_spreads_a_fleet_and_is_the_same_for_one_device() -> None:
    from agent.daemon.supervisor import start_jitter

    waits = [start_jitter(f"pi-{i}", 600.0) for i in range(1000)]
    assert min(waits) < 30 and max(waits) > 570 and all(0 <= w < 600 for w in waits)
    assert start_jitter("pi-7", 600.0) == waits[7] and start_jitter("pi-7", 0.0) == 0.0


def test_an_eligible_device_waits_its_start_jitter_before_training(rig) -> None:
    from agent.daemon.supervisor import start_jitter

    device, config, tmp = rig
    most = 4.0 / start_jitter("test-device", 1.0)  # this device's share of it is 4 s
    agent = start_agent(config(eligibility_start_jitter_seconds=most))
    try:
        waiting = wait_for(lambda: (s := read_status(tmp)).get("state") == "waiting" and "start jitter" in s["reason"]
                           and s, 30, "the start jitter", agent)
        seen = time.monotonic()
        assert re.search(r"starting in [1-4] s", waiting["reason"])
        wait_for(lambda: read_status(tmp).get("state") in ("preparing", "training"), 30, "the window", agent)
        assert time.monotonic() - seen <= 4.0 + 2.0  # no later than the jitter and a poll or two
    finally:
        assert stop(agent) == 0


def test_notify_socket_gets_ready_status_watchdog_and_stopping(rig) -> None:
    device, config, tmp = rig
    address = str(tmp / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        sock.settimeout(30)
        agent = start_agent(config(), env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "400000"})
        messages: list[str] = []
        try:
            while not any("WATCHDOG=1" in m for m in messages) or len(messages) < 4:
                messages.append(sock.recv(4096).decode())
        finally:
            stop(agent)
        while True:
            try:
                sock.settimeout(1)
                messages.append(sock.recv(4096).decode())
            except TimeoutError:
                break
    assert messages[0].startswith("READY=1\nSTATUS=waiting")
    assert any(m.startswith("STATUS=") for m in messages[1:])
    assert any("STOPPING=1" in m for m in messages)


def test_a_tampered_or_foreign_schedule_is_refused_with_the_reason_in_status(rig, template: Path) -> None:
    device, config, tmp = rig
    private, public = generate_keypair(tmp / "keys")
    (prepared_dir,) = (template / "prepared").iterdir()
    from schedules.graph import TrainingGraph
    from tests.schedules.graphs import linear_graph

    graph = TrainingGraph.load(prepared_dir / "graph.json")
    spec = training_spec(load_config(config()))
    budget = load_config(config()).training.memory_budget
    good = sign(plan(graph, "rpi4", memory_budget=budget, training=spec).schedule, load_private_key(private))
    tampered = json.loads(good.to_json())
    tampered["memory_budget"] = 1  # changed after signing
    (tmp / "tampered.json").write_text(json.dumps(tampered))
    foreign = sign(plan(linear_graph(4), "rpi4", memory_budget=None).schedule, load_private_key(private))
    foreign.save(tmp / "foreign.json")
    other_budget = sign(plan(graph, "rpi4", memory_budget=budget + 1_000_000, training=spec).schedule,
                        load_private_key(private))
    other_budget.save(tmp / "other-budget.json")
    for name, expected in (("tampered.json", "signature does not verify"), ("foreign.json", "planned for graph"),
                           ("other-budget.json", "not this device's training.memory_budget of")):
        agent = start_agent(config(schedule_file=str(tmp / name), schedule_public_key=str(public)))
        try:
            status = wait_for(lambda: (s := read_status(tmp)).get("state") == "backing off" and s, 60,
                              "backing off", agent)
        finally:
            stop(agent)
        assert expected in status["last_error"], status["last_error"]
        assert status["steps_done"] == 0


def test_missing_data_is_a_clear_error_in_status(rig) -> None:
    device, config, tmp = rig
    agent = start_agent(config(data_path=str(tmp / "nowhere.npz")))
    try:
        status = wait_for(lambda: (s := read_status(tmp)).get("state") == "backing off" and s, 60, "backing off",
                          agent)
    finally:
        stop(agent)
    assert "nowhere.npz" in status["last_error"]
    assert "next try in" in status["reason"]


def test_the_waiting_agent_has_not_loaded_torch(rig) -> None:
    device, config, tmp = rig
    device.unplug()
    agent = start_agent(config())
    try:
        wait_for(lambda: read_status(tmp).get("state") == "waiting", 60, "waiting", agent)
        maps = Path(f"/proc/{agent.pid}/maps").read_text()
        assert "libtorch" not in maps
    finally:
        stop(agent)


def test_status_command_prints_stable_json_keys_and_says_when_the_agent_is_not_running(rig) -> None:
    device, config, tmp = rig
    path = config()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    never = subprocess.run(agent_command("agent", "status", "--config", str(path), "--json"), env=env,
                           capture_output=True, text=True)
    assert never.returncode == 0
    assert json.loads(never.stdout)["state"] == "stopped"
    device.unplug()
    agent = start_agent(path)
    try:
        wait_for(lambda: read_status(tmp).get("state") == "waiting", 60, "waiting", agent)
        shown = subprocess.run(agent_command("agent", "status", "--config", str(path), "--json"), env=env,
                               capture_output=True, text=True)
        status = json.loads(shown.stdout)
        assert status["state"] == "waiting" and "battery" in status["reason"] and status["steps_done"] == 0
        text = subprocess.run(agent_command("agent", "status", "--config", str(path)), env=env,
                              capture_output=True, text=True).stdout
        assert "waiting: " in text and "power" in text
    finally:
        stop(agent)
    after = json.loads(subprocess.run(agent_command("agent", "status", "--config", str(path), "--json"), env=env,
                                      capture_output=True, text=True).stdout)
    assert after["state"] == "stopped"


def test_config_problems_are_reported_all_at_once(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('[device]\nstate_dir = 3\n[training]\nmemory_budget = "-1MB"\noptimizer = "rmsprop"\n'
                    'steps_per_window = 1.5\n[eligibility]\nquiet_hours = "25:00-06:00"\n[nonsense]\n')
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    for expected in ("device.name is required", "device.state_dir must be a path", "negative", "rmsprop",
                     "steps_per_window must be a whole number", "quiet_hours", "unknown section [nonsense]",
                     "workload.model is required", "data.path is required"):
        assert expected in message
    code = subprocess.run(agent_command("agent", "run", "--config", str(path)), capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert code.returncode == 3 and "Traceback" not in code.stderr and "rmsprop" in code.stderr


def test_a_mains_powered_device_without_a_power_supply_class_runs_when_charging_is_not_required(
        tmp_path: Path) -> None:
    from agent.monitors.power import PowerMonitor

    root = tmp_path / "pi4-root"  # a Raspberry Pi 4 on mains: no sys/class/power_supply at all
    (root / "sys" / "class" / "thermal").mkdir(parents=True)
    written = {"workload_model": "resnet18", "workload_input": "8x3x64x64", "device_sysfs_root": str(root)}
    path = write_config(tmp_path, FakeDevice(tmp_path / "root"), write_csv(tmp_path / "data.csv"), **written,
                        eligibility_require_charging=False)
    config = load_config(path)  # accepted: nothing it checks depends on the supplies
    verdict = PowerMonitor(sysfs_root=config.device.sysfs_root, require_charging=False,
                           min_battery_percent=0).check(0.0)
    assert verdict.eligible, verdict.reason
    with pytest.raises(ConfigError, match="or set eligibility.require_charging = false"):
        load_config(write_config(tmp_path, FakeDevice(tmp_path / "root"), write_csv(tmp_path / "data.csv"),
                                 **written))  # charging required: the mistyped root is still refused


@pytest.mark.parametrize("change, expected", [
    ({"device_sysfs_root": "/no/such/root"}, "has no sys/class/power_supply"),  # would read as "no battery"
    ({"workload_input": "8x3x64"}, "resnet18 takes a 4-dimensional input"),
    ({"workload_input": "8x3x64x64x2", "workload_model": "bert"}, "bert takes a 2-dimensional input"),
    ({"workload_model": "resnet81"}, "'resnet81' is not a zoo model"),
    ({"workload_model": "my models:build"}, "package.module:factory"),
    ({"eligibility_idle_seconds": -0.5}, "idle_seconds must be >= 0"),
    ({"data_path": "corpus.txt"}, "corpus.txt' is text: set data.tokenizer to the tokenizer that splits it"),
    ({"data_tokenizer": "missing/tokenizer.json"}, "missing/tokenizer.json': no such file or folder"),
    ({"workload_chunked_loss": True}, "resnet18 is not a language model"),
])
def test_a_config_the_device_could_not_run_is_refused_at_start(tmp_path: Path, change: dict, expected: str) -> None:
    written = {"workload_model": "resnet18", "workload_input": "8x3x64x64", **change}
    path = write_config(tmp_path, FakeDevice(tmp_path / "root"), write_csv(tmp_path / "data.csv"), **written)
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_config(path)


def test_a_text_data_path_reads_its_tokenizer_relative_to_the_config(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")  # the config checks that it exists; opening the data reads it
    path = write_config(tmp_path, FakeDevice(tmp_path / "root"), tmp_path / "corpus.txt", workload_model="gpt2",
                        workload_input="8x128", data_tokenizer="tokenizer.json")
    data = load_config(path).data
    assert (data.path, data.tokenizer) == (tmp_path / "corpus.txt", tmp_path / "tokenizer.json")
    csv = write_config(tmp_path, FakeDevice(tmp_path / "root"), write_csv(tmp_path / "data.csv"))
    assert load_config(csv).data.tokenizer is None  # optional: the other layouts need none


def test_a_config_naming_a_zoo_model_and_its_input_right_loads(tmp_path: Path) -> None:
    from agent.zoo import ZOO
    from agent.zoo_names import ZOO_INPUTS

    assert {name: len(entry.default_input) for name, entry in ZOO.items()} == \
        {name: rank for name, (rank, _) in ZOO_INPUTS.items()}  # the torch-free list is the zoo's
    for name, (_, example) in ZOO_INPUTS.items():
        path = write_config(tmp_path, FakeDevice(tmp_path / "root"), write_csv(tmp_path / "data.csv"),
                            workload_model=name, workload_input=example)
        assert load_config(path).workload.model == name


def test_the_example_config_is_valid_and_documents_every_key(tmp_path: Path) -> None:
    import tomllib
    from dataclasses import fields

    from agent import config as module

    example = (REPO / "deploy/agent.example.toml").read_text()
    document = tomllib.loads(example)
    for section, cls in module._SECTIONS.items():
        for f in fields(cls):
            key = "meter" if (section, f.name) == ("energy", "kind") else f.name
            if (section, key) in {("energy", "serial_baudrate"), ("energy", "serial_timeout_s"),
                                  ("energy", "interval_s")}:
                continue  # meter port settings: their defaults suit every supported meter
            assert f"{key} =" in example, f"[{section}] {key} is not documented in agent.example.toml"
    assert document["device"]["name"]


def test_the_prometheus_endpoint_follows_the_status(rig) -> None:
    device, config, tmp = rig
    port = free_port()
    device.unplug()
    agent = start_agent(config(metrics_prometheus=f"127.0.0.1:{port}"))
    try:
        wait_for(lambda: read_status(tmp).get("state") == "waiting", 60, "waiting", agent)
        text = wait_for(lambda: _scrape(f"http://127.0.0.1:{port}/metrics"), 30, "the metrics endpoint", agent)
    finally:
        stop(agent)
    assert 'poet_agent_state{state="waiting"} 1.0' in text
    assert 'poet_agent_state{state="training"} 0.0' in text
    assert "poet_agent_eligible 0.0" in text
    assert "_created" not in text


def _scrape(url: str) -> str | None:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.read().decode()
    except OSError:
        return None


@pytest.mark.slow
def test_the_agent_trains_vgg11_bn_in_a_third_of_plain_pytorchs_training_memory(tmp_path: Path) -> None:
    """vgg11_bn's plain step needs its 515 MB of gradients and 515 MB of momentum beside its activations; the
    agent trains it in a third of what plain PyTorch takes, and its progress survives a restart."""
    import numpy as np

    from benchmarks.memory import plain_training_memory

    plain = plain_training_memory("vgg11_bn", "4x3x32x32")
    rng = np.random.default_rng(0)
    data = tmp_path / "images.npz"
    np.savez(data, x=rng.normal(size=(48, 3, 32, 32)).astype(np.float32), y=rng.integers(0, 10, 48))
    device = FakeDevice(tmp_path / "root")
    budget = plain // 3
    path = write_config(tmp_path, device, data, workload_model="vgg11_bn", workload_input="4x3x32x32",
                        training_memory_budget=budget, training_steps_per_window=4, training_checkpoint_every=2,
                        training_learning_rate=0.01, training_momentum=0.9, schedule_solve_time_limit=60)
    agent = start_agent(path)
    try:
        status = wait_for(lambda: (s := read_status(tmp_path)).get("state") == "waiting"
                          and "window done" in s.get("reason", "") and s, 900, "a whole window", agent)
    finally:
        stop(agent)
    assert status["memory_budget_bytes"] == budget and status["last_error"] is None
    assert status["peak_bytes"] <= status["bound_bytes"] == budget + 8_000_000
    assert status["peak_bytes"] < plain / 2.5  # what the step really took, beyond the loaded model
    steps, state = checkpoint_state(tmp_path / "state")
    assert steps == status["steps_done"] >= 4  # durable: in the newest checkpoint
    restarted = start_agent(path)
    try:
        wait_for(lambda: read_status(tmp_path).get("steps_done", 0) > steps, 900, "training resumed", restarted)
    finally:
        stop(restarted)
