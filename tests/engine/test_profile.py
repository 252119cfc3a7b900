"""The profiler: real swap-path and overlap measurements, labelled power figures, output planner and executor take."""

from __future__ import annotations

import os

import time

import pytest
import torch
import torch.nn as nn

from engine.energy import EstimatedMeter, NominalPowers
from engine.executor import Executor
from agent.zoo import Workload, cross_entropy, load_workload
from engine.pagefile import OperatingSystem
from schedules import DeviceProfile, Schedule, TrainingGraph
from schedules.budgets import memory_lower_bound, store_all_peak
from common.cli import main
from common.exit_codes import ExitCode
from engine.extract import extract
from schedules.graph import Node
from engine.profile import (
    ComputeLoop,
    TransferSample,
    fit_transfer,
    graph_page_sizes,
    measure_overlap,
    measure_power,
    measure_swap_path,
    generic_host_estimate,
    profile_workload,
)

KIB, MIB = 1024, 1024 * 1024


def tiny_mlp() -> Workload:
    """A factory for ``--module``: four segments, a graph the MILP solves in a blink."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 10)).train()
    return Workload("tiny_mlp", model, torch.randn(32, 64), torch.randint(0, 10, (32,)), cross_entropy)


class BenchSupply(EstimatedMeter):
    """Stands in for a real meter (a lab supply): board power follows what the device does."""

    name = "bench"
    source = "bench supply (test)"
    is_estimate = False


# -- the swap path ---------------------------------------------------------------------
def test_fit_recovers_latency_and_bandwidth():
    samples = [TransferSample("out", n, 0.002 + n / 100e6) for n in (4 * KIB, MIB, 8 * MIB)]
    latency, bandwidth = fit_transfer(samples)
    assert latency == pytest.approx(0.002, rel=1e-6)
    assert bandwidth == pytest.approx(100e6, rel=1e-6)
    # one size only: no latency can be told apart, the plain ratio is the bandwidth
    assert fit_transfer([TransferSample("in", MIB, 0.01)]) == (0.0, pytest.approx(MIB / 0.01))


def test_page_sizes_span_the_graph():
    nodes = tuple(Node(f"n{i}", "forward", str(i), 1.0, b) for i, b in enumerate([0, 10, 20, 30, 40, 50, 60, 70, 70]))
    graph = TrainingGraph(nodes=nodes, edges=tuple((i, i + 1) for i in range(len(nodes) - 1)))
    sizes = graph_page_sizes(graph, max_sizes=4)
    assert sizes[0] == 10 and sizes[-1] == 70 and len(sizes) == 4 and sizes == sorted(set(sizes))
    assert 0 not in graph_page_sizes(graph)


def test_swap_path_measured_on_a_real_directory(tmp_path):
    sizes = [64 * KIB, MIB, 4 * MIB]
    swap = measure_swap_path(tmp_path, sizes, repeats=2)
    assert swap.pageout_bandwidth_bps > 0 and swap.pagein_bandwidth_bps > 0
    assert swap.pageout_latency_s >= 0 and swap.pagein_latency_s >= 0
    assert sorted({s.nbytes for s in swap.samples}) == sizes
    assert len(swap.samples) == len(sizes) * 2 * 2 and all(s.seconds > 0 for s in swap.samples)
    assert list(tmp_path.iterdir()) == []  # no page file left behind


class FlashWithAOnePageCache(OperatingSystem):
    """A device whose write cache holds one page: a write while other pages sit on it runs at 50 MB/s."""

    def __init__(self, directory) -> None:
        super().__init__()
        self.directory = directory

    def pwrite(self, fd, data, position):
        written = super().pwrite(fd, data, position)
        if len(list(self.directory.glob("*.page"))) > 1:
            time.sleep(written / 50e6)
        return written


def test_sustained_rate_caps_the_bandwidth_where_lone_transfers_ran_faster(tmp_path):
    swap = measure_swap_path(tmp_path, [256 * KIB, MIB], repeats=2, sustained_bytes=8 * MIB,
                             system=FlashWithAOnePageCache(tmp_path))
    assert swap.sustained_out_bps <= 50e6
    assert swap.pageout_bandwidth_bps == swap.sustained_out_bps  # the step's stream, not the lone bursts
    assert swap.burst_bps is not None and swap.burst_bps[0] > 2 * swap.sustained_out_bps
    assert swap.pagein_bandwidth_bps == min(swap.burst_bps[1], swap.sustained_in_bps)
    assert list(tmp_path.iterdir()) == []  # the stream's eight page files are gone too


def test_sustained_rate_is_measured_and_never_raises_the_bandwidth(tmp_path):
    lone = measure_swap_path(tmp_path, [MIB, 2 * MIB], repeats=2)
    swap = measure_swap_path(tmp_path, [MIB, 2 * MIB], repeats=2, sustained_bytes=6 * MIB)
    assert lone.sustained_out_bps is None and swap.sustained_out_bps > 0 and swap.sustained_in_bps > 0
    assert swap.pageout_bandwidth_bps <= swap.sustained_out_bps
    assert swap.pagein_bandwidth_bps <= swap.sustained_in_bps
    assert list(tmp_path.iterdir()) == []


def test_overlap_measured_beside_a_compute_loop(tmp_path):
    overlap = measure_overlap(tmp_path, MIB, pages=2, trials=3)
    assert overlap.compute_s > 0 and overlap.io_s > 0
    # together cannot be much faster than the longer job alone (clock noise aside)
    assert overlap.together_s >= 0.7 * max(overlap.compute_s, overlap.io_s)
    assert 0.0 <= overlap.hidden_fraction <= 1.0
    assert overlap.overlaps == (overlap.hidden_fraction >= 0.5)
    assert list(tmp_path.iterdir()) == []


# -- power -----------------------------------------------------------------------------
def test_power_without_a_meter_is_the_labelled_estimate():
    estimate = generic_host_estimate(threads=2)
    with EstimatedMeter(estimate.powers) as meter:
        power = measure_power(meter, estimate, ComputeLoop(n=64))
    assert (power.idle_w, power.compute_w, power.memory_w) == (10.0, 12.0, 2.0)
    assert not power.measured
    assert all(source.startswith("estimate") for source in power.sources.values())


def test_power_from_a_measuring_meter_is_above_idle_and_labelled_measured():
    supply = BenchSupply(NominalPowers(idle_w=4.0, compute_w=20.0, memory_w=3.0))
    with supply:
        power = measure_power(supply, generic_host_estimate(), ComputeLoop(n=64).calibrate(0.05),
                              io=lambda: __import__("time").sleep(0.05), idle_s=0.05)
    assert power.measured
    assert power.idle_w == pytest.approx(4.0, rel=0.05)
    assert power.compute_w == pytest.approx(20.0, rel=0.05)   # the board drew 24 W; 4 W of it is idle
    assert power.memory_w == pytest.approx(3.0, rel=0.05)
    assert all(source.startswith("measured") for source in power.sources.values())


@pytest.fixture
def one_thread():
    """One compute thread: on a loaded machine a pool of two stalls for whole scheduler slices."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_node_energy_measured_with_a_meter(tmp_path, one_thread):
    workload = tiny_mlp()
    supply = BenchSupply(NominalPowers(idle_w=4.0, compute_w=20.0, memory_w=3.0))
    with supply:
        profile, _ = profile_workload(workload.model, workload.example, workload.loss_fn, tmp_path, repeats=1,
                                      meter=supply, idle_s=0.05)
    assert "measured" in profile.sources["compute_j"]
    assert profile.device.compute_power_w == pytest.approx(20.0, rel=0.05)
    measured = [n.compute_j for n in profile.graph.nodes]
    priced = [n.compute_ms / 1000 * profile.device.compute_power_w for n in profile.graph.nodes]
    assert measured != priced and all(j >= 0 for j in measured)  # read off the meter, not priced from times
    # 20 W above idle over the step's compute time; the meter's runs and extraction's are timed apart
    assert 0.2 * sum(priced) < sum(measured) < 5 * sum(priced)
    assert all(g.grad is None for g in workload.model.parameters())


# -- the whole command -------------------------------------------------------------------
def test_profile_output_loads_in_the_planner_and_its_plan_runs_in_the_executor(tmp_path, capsys):
    graph_path, device_path, schedule_path = tmp_path / "g.json", tmp_path / "d.json", tmp_path / "s.json"
    swap = tmp_path / "swap"
    code = main(["profile", "--module", "tests.engine.test_profile:tiny_mlp", "--swap-dir", str(swap),
                 "-o", str(graph_path), "--device-out", str(device_path), "--repeats", "2"])
    out, _ = capsys.readouterr()
    assert code == ExitCode.OK, out
    assert "estimate: generic host" in out and "measured: engine.pagefile" in out  # each figure's source
    assert out.count("estimate: generic host") == 1 and out.count("measured: engine.pagefile") == 1  # said once
    graph, device = TrainingGraph.load(graph_path), DeviceProfile.load(device_path)
    assert graph.has_energy and device.pageout_bandwidth_bps > 0 and device.source.startswith("measured on")
    assert device.sources["pageout_bandwidth_bps"].startswith("measured: engine.pagefile")  # each figure's own
    assert device.sources["idle_power_w"].startswith("estimate") and "paging_hidden_fraction" in device.sources
    assert all(n.compute_ms > 0 for n in graph.nodes[1:])
    # every profile times the common optimizers' updates: a byte of AdamW's costs more than one of SGD's
    costs = device.update_costs
    assert set(costs) == {"sgd:0:0", "sgd:1:0", "adamw:2:2"} and "optimizer update" in out
    assert costs["adamw:2:2"][1] > costs["sgd:0:0"][1] > 0

    budget = memory_lower_bound(graph) + (store_all_peak(graph) - memory_lower_bound(graph)) // 4
    assert main(["solve", str(graph_path), "--memory", str(budget), "-o", str(schedule_path)]) == ExitCode.OK
    schedule = Schedule.load(schedule_path)

    workload = tiny_mlp()
    fresh, segments = extract(workload.model, workload.example, workload.loss_fn, repeats=0, refine=False)
    assert fresh.fingerprint == graph.fingerprint
    with Executor(workload.model, segments, graph, schedule, swap_dir=swap) as executor:
        executor.step(*workload.example)
        stats = executor.last_stats
    assert stats.ledger_peak_bytes <= budget < store_all_peak(graph)
    assert stats.ledger == stats.predicted

    code = main(["validate", "--module", "tests.engine.test_profile:tiny_mlp", "--schedule", str(schedule_path),
                 "--graph", str(graph_path), "--device", str(device_path), "--swap-dir", str(swap), "--steps", "1",
                 "--warmup", "0"])
    out, _ = capsys.readouterr()
    assert code == ExitCode.OK and "ledger peak" in out and "+0.0%" in out


def test_zoo_model_by_name_and_unusable_names_are_usage_errors(tmp_path, capsys):
    assert main(["profile", "--model", "no_such_net", "--swap-dir", str(tmp_path)]) == 2
    assert "zoo models: resnet18" in capsys.readouterr().err
    assert main(["profile", "--model", "resnet18", "--input", "32x3", "--swap-dir", str(tmp_path)]) == 2
    workload = load_workload("unet", (1, 3, 8, 8))
    assert workload.model.training and workload.targets.shape == (1, 8, 8)


def test_the_commands_load_without_torch():
    """``poet-edge --help`` must stay fast: the profile and validate handlers import torch, not the module."""
    import subprocess
    import sys

    code = "import sys, common.cli as c; c.build_parser(); import agent.cli; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=os.getcwd()).returncode == 0


def test_progress_display_draws_on_a_terminal_and_prints_lines_elsewhere():
    import io

    from agent.cli import StageProgress

    terminal = io.StringIO()
    with StageProgress("profile m", stream=terminal, live=True) as progress:
        for done in range(4):
            progress("swap path", done, 3)
    plain = io.StringIO()
    with StageProgress("profile m", stream=plain, live=False) as progress:
        for done in range(4):
            progress("swap path", done, 3)
    assert plain.getvalue().count("\n") == 2 and "swap path done" in plain.getvalue()
    assert "Traceback" not in terminal.getvalue()


BLOB = 8 * MIB


class _KeepsABlob(torch.autograd.Function):
    """Doubles its input, and keeps bytes no tensor owns from its forward to its backward (as a library's
    context object may): memory no node's value counts."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.blob = bytes(range(256)) * (BLOB // 256)  # every page written: resident
        return x * 2

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2


class _Blob(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _KeepsABlob.apply(x)


def _wide_after(blob: bool) -> Workload:
    """Small values before the blob, 16 MB of them after: a store-all step peaks with the blob still kept."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), *([_Blob()] if blob else [nn.Identity()]), nn.Linear(64, 8192),
                          nn.ReLU(), nn.Linear(8192, 10)).train()
    return Workload("wide", model, torch.randn(256, 64), torch.randint(0, 10, (256,)), cross_entropy)


def test_what_a_step_keeps_outside_every_value_is_measured_as_the_executors_own_memory(tmp_path):
    from engine.profile import measure_executor_bytes

    measured = {}
    for blob in (True, False):
        work = _wide_after(blob)
        graph, segments = extract(work.model, work.example, work.loss_fn)
        measured[blob] = measure_executor_bytes(work.model, segments, graph, work.example, tmp_path, "rpi4")
    # held from the forward to the backward, in no value's bytes (less the part the plan takes for its node's
    # workspace at the stage that computes it)
    assert measured[True] >= BLOB / 2
    assert measured[False] < BLOB / 4  # the executor's own objects and code: small beside it
