"""Threads follow the configuration, and the profile follows the threads."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch

from agent.config import load_config
from agent.errors import ConfigError
from agent.prepare import prepare, workload_key
from schedules.device import DeviceProfile
from tests.agent.daemon_helpers import FakeDevice, write_config, write_csv


def config_with(tmp_path: Path, threads) -> Path:
    return write_config(tmp_path, FakeDevice(tmp_path / "root"), write_csv(tmp_path / "data.csv"),
                        workload_threads=threads)


def test_all_means_every_core_this_process_may_run_on(tmp_path: Path) -> None:
    config = load_config(config_with(tmp_path, "all"))
    assert config.workload.compute_threads == len(os.sched_getaffinity(0))
    assert load_config(config_with(tmp_path, 3)).workload.compute_threads == 3


@pytest.mark.parametrize("threads, expected", [("many", 'workload.threads must be "all"'),
                                               (0, "workload.threads must be positive"),
                                               (True, 'workload.threads must be "all"')])
def test_a_thread_count_that_is_not_one_is_refused(tmp_path: Path, threads, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_config(config_with(tmp_path, threads))


def test_a_profile_is_measured_at_the_configured_count_and_another_count_profiles_again(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    one, two = load_config(config_with(tmp_path, 1)), load_config(config_with(tmp_path, 2))
    assert workload_key(one) != workload_key(two)
    prepared = prepare(two)
    assert "2 threads" in prepared.device.description  # measured at two, though this process computes with one
    assert torch.get_num_threads() == 1  # and left as it was
    assert prepare(one).profiled  # the one-thread windows get a profile of their own
    assert not prepare(two).profiled  # ... and each count keeps its own


def test_a_profile_that_has_not_timed_the_configured_optimizers_update_times_it_and_keeps_it(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    config = load_config(config_with(tmp_path, 1))
    kind = prepare(config).schedule.step.training.update_kind
    (device_path,) = (config.device.state_dir / "prepared").glob("*/device.json")
    device = DeviceProfile.load(device_path)
    assert kind in device.update_costs
    dataclasses.replace(device, update_costs={}).save(device_path)  # as an earlier release wrote it
    said: list[str] = []
    again = prepare(config, say=said.append)
    assert not again.profiled and any("timing the update" in line for line in said)
    assert kind in again.device.update_costs and kind in DeviceProfile.load(device_path).update_costs
    assert again.schedule.step.update_ms > 0  # the plan now counts the update in its step time
