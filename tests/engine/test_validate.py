"""Validation: error figures computed from real measurements, a known slowdown reported, paging counted, plot drawn."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch
import torch.nn as nn

from engine.energy import EstimatedMeter, NominalPowers
from engine.ledger import StepStats
from engine.validate import (
    RSS_GROWTH_NOTE,
    Figure,
    Prediction,
    ValidationReport,
    gradient_bytes_per_node,
    memory_figure,
    memory_labels,
    plot_memory,
    predict,
    validate,
)
from schedules.timeline import timeline_step_ms
from agent.zoo import Workload, cross_entropy
from schedules import DeviceProfile, TrainingGraph
from common.cli import main
from common.exit_codes import ExitCode
from engine.extract import extract
from schedules.plan import plan
from tests.engine.models import page_everything, schedule_for
from tests.schedules.graphs import linear_graph


class Sleepy(nn.Module):
    """A layer whose forward sleeps ``delay`` seconds: a slowdown of known size."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 32)
        self.delay = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return self.linear(x)


def sleepy_workload() -> Workload:
    torch.manual_seed(0)
    # GELU saves its input: Sleepy's value is read by a backward node, so a schedule can recompute it for that
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), Sleepy(), nn.GELU(), nn.Linear(32, 4)).train()
    return Workload("sleepy", model, torch.randn(8, 16), torch.randint(0, 4, (8,)), cross_entropy)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One compute thread: on a loaded machine a pool of two stalls for whole scheduler slices."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def extracted(one_thread):
    workload = sleepy_workload()
    graph, segments = extract(workload.model, workload.example, workload.loss_fn, repeats=3, refine=False)
    return workload, graph, segments


def test_error_is_measured_minus_predicted_over_predicted():
    assert Figure("step time", "ms", 100.0, 115.0).error_pct == pytest.approx(15.0)
    assert Figure("bytes paged", "B", 0, 0).error_pct == 0.0
    assert Figure("bytes paged", "B", 0, 10).error_pct is None
    assert Figure("energy", "J", 2.0, None).error_pct is None


def test_a_known_slowdown_is_reported(extracted):
    workload, graph, segments = extracted
    schedule = plan(graph, "rpi4", method="store-all").schedule
    base = validate(workload, graph, segments, schedule, steps=3, warmup=1).figure("step time")
    sleepy = workload.model[2]
    sleepy.delay = 0.05  # one forward call of the sleepy unit per step under store-all
    try:
        slow = validate(workload, graph, segments, schedule, steps=3, warmup=1).figure("step time")
    finally:
        sleepy.delay = 0.0
    assert slow.predicted == base.predicted  # the graph did not change; only the model got slower
    assert slow.measured >= 50.0 + slow.predicted * 0.5  # the sleep, plus at least half the real work
    added_ms = slow.measured - base.measured
    assert 30.0 <= added_ms <= 50.0 + 60.0  # the 50 ms sleep, give or take scheduling noise in either run
    assert slow.error_pct == pytest.approx(100 * (slow.measured - slow.predicted) / slow.predicted)
    assert slow.error_pct >= 100 * (50.0 - 0.5 * slow.predicted) / slow.predicted


def test_recomputation_is_predicted_and_measured_per_node(extracted):
    workload, graph, segments = extracted
    sleepy_node = next(i for i, n in enumerate(graph.nodes) if n.segment == "2" and n.kind == "forward")
    schedule = schedule_for(graph, _recompute_sleepy(graph, sleepy_node))
    workload.model[2].delay = 0.02
    try:
        report = validate(workload, graph, segments, schedule, steps=2, warmup=0)
    finally:
        workload.model[2].delay = 0.0
    node, predicted_ms, measured_ms = report.node_time_errors()[sleepy_node]
    assert predicted_ms == pytest.approx(2 * graph.nodes[sleepy_node].compute_ms)  # computed twice
    assert measured_ms >= 2 * 20.0  # both computations slept


def _recompute_sleepy(graph, node):
    """Store-all, except ``node`` is freed after its consumer and recomputed for the first backward reading it."""
    store_all = list(plan(graph, "rpi4", method="store-all").schedule.instructions)
    consumer = min(c for c in graph.successors[node] if not graph.is_backward(c))
    at = store_all.index(("compute", consumer)) + 1
    backward = min(c for c in graph.successors[node] if graph.is_backward(c))
    out = store_all[:at] + [("free", node)] + store_all[at:]
    before_backward = out.index(("compute", backward))
    return out[:before_backward] + [("compute", node)] + out[before_backward:]


def test_paging_counts_match_and_the_prediction_includes_paging_time(extracted, tmp_path):
    workload, graph, segments = extracted
    schedule = schedule_for(graph, page_everything(graph))
    serial = replace(DeviceProfile.builtin("rpi4"), paging_overlaps_compute=False)
    report = validate(workload, graph, segments, schedule, swap_dir=tmp_path / "swap", steps=2, warmup=0,
                      device=serial)
    paged = report.figure("bytes paged")
    assert paged.predicted > 0 and paged.error_pct == 0.0
    assert report.figure("ledger peak").error_pct == 0.0
    p = report.prediction
    assert p.paging_ms > 0 and p.planner_step_ms == pytest.approx(p.compute_ms + p.paging_ms)
    # the timeline waits only where I/O is behind (sums in another order: equal up to rounding)
    assert p.compute_ms < p.step_ms <= p.planner_step_ms * (1 + 1e-12)
    # writes slower than the whole step's compute, so no measured node time can hide them
    slow_writes = replace(serial, paging_overlaps_compute=True, pageout_latency_s=10 * p.compute_ms / 1e3)
    overlapped = predict(graph, schedule, slow_writes)
    assert overlapped.planner_step_ms == pytest.approx(p.compute_ms)
    assert overlapped.step_ms > p.compute_ms  # frees still wait for their writes
    assert all(s.io_seconds > 0 for s in report.stats)


def test_energy_is_compared_with_a_meter_and_an_estimate_says_so(extracted):
    workload, graph, segments = extracted
    schedule = plan(graph, "rpi4", method="store-all").schedule
    device = replace(DeviceProfile.builtin("rpi4"), idle_power_w=10.0)

    class BenchSupply(EstimatedMeter):  # a constant 30 W board standing in for a real meter
        is_estimate = False
        source = "bench supply (test)"

    with BenchSupply(NominalPowers(idle_w=30.0, compute_w=0.0, memory_w=0.0)) as supply:
        report = validate(workload, graph, segments, schedule, steps=2, warmup=0, device=device, meter=supply)
    energy = report.figure("energy")
    assert energy.predicted == pytest.approx(predict(graph, schedule, device).energy_j)
    assert len(report.energy) == 2
    assert all(s >= stats.step_seconds for (_, s), stats in zip(report.energy, report.stats))
    # 30 W measured minus 10 W idle over each step (the median of two is their mean)
    assert energy.measured == pytest.approx(sum(20.0 * s for _, s in report.energy) / 2, rel=0.01)
    assert not report.energy_is_estimate and "bench supply (test)" in energy.note
    with EstimatedMeter(NominalPowers(1.0, 1.0, 1.0)) as estimate:
        estimated = validate(workload, graph, segments, schedule, steps=1, warmup=0, meter=estimate)
    # No device profile: nothing predicted, idle taken as 0 W, so the row is the estimate's whole step.
    assert estimated.figure("energy").measured == pytest.approx(estimated.energy[0][0])
    assert estimated.energy_is_estimate and "estimate" in estimated.figure("energy").note
    unmetered = validate(workload, graph, segments, schedule, steps=1, warmup=0)
    assert unmetered.figure("energy").measured is None and "no energy meter" in unmetered.figure("energy").note


def test_plot_draws_predicted_and_measured_memory(extracted, tmp_path):
    workload, graph, segments = extracted
    schedule = schedule_for(graph, page_everything(graph))
    report = validate(workload, graph, segments, schedule, swap_dir=tmp_path / "swap", steps=1, warmup=0)
    path = plot_memory(report, tmp_path / "memory.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def _memory_report(rss_measured: float | None = 68.0e6) -> ValidationReport:
    """A report as :func:`validate` writes it: activations peak at 9 MB under a 12.3 MB budget, RSS far above."""
    resident = (1_000_000, 5_000_000, 9_000_000, 4_000_000, 0)
    prediction = Prediction(step_ms=1.0, planner_step_ms=1.0, compute_ms=1.0, paging_ms=0.0, peak_bytes=9_000_000,
                            bytes_paged=0, energy_j=None, resident=resident, node_compute_ms=(),
                            rss_peak_bytes=60_000_000)
    stats = StepStats(ledger=resident, predicted=resident, budget=12_300_000, peak_with_inflight_bytes=9_000_000,
                      step_seconds=0.01, node_seconds=())
    rss = Figure("RSS growth", "B", 60_000_000, rss_measured)
    return ValidationReport((rss,), prediction, (stats,), (), 12_300_000)


def test_memory_plot_names_the_budget_and_says_why_rss_sits_above_it():
    labels = memory_labels(_memory_report())
    assert labels["budget"] == "activation budget 12.30 MB"
    assert "parameter gradients" in labels["rss_predicted"] and "60.00 MB" in labels["rss_predicted"]
    assert "68.00 MB" in labels["rss_measured"] and "working memory" in labels["rss_measured"]
    assert labels["gap"].startswith("+51.00 MB above the activation peak")  # 60 MB RSS - 9 MB activations
    assert "parameter gradients" in labels["gap"] and "outside the activation budget" in labels["gap"]
    fig = memory_figure(_memory_report(), "t")
    ax = fig.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels["budget"] in legend and labels["rss_predicted"] in legend and RSS_GROWTH_NOTE in legend
    on_axes = [t.get_text() for t in ax.texts]
    assert labels["budget"] in on_axes and labels["gap"] in on_axes  # on the figure itself, not only in the legend
    assert ax.get_xlabel() and "(MB)" in ax.get_ylabel() and ax.get_title() == "t"


def test_memory_plot_without_an_rss_measurement_leaves_that_line_out(tmp_path):
    labels = memory_labels(_memory_report(rss_measured=None))
    assert "rss_measured" not in labels and "rss_predicted" in labels
    path = plot_memory(_memory_report(rss_measured=None), tmp_path / "m.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_validate_refuses_a_graph_of_another_input_shape(tmp_path, capsys):
    graph_path, schedule_path = tmp_path / "g.json", tmp_path / "s.json"
    assert main(["profile", "--model", "unet", "--input", "1x3x8x8", "--swap-dir", str(tmp_path / "swap"),
                 "-o", str(graph_path), "--device-out", str(tmp_path / "d.json"), "--repeats", "1"]) == ExitCode.OK
    assert main(["solve", str(graph_path), "--baseline", "store-all", "-o", str(schedule_path)]) == ExitCode.OK
    capsys.readouterr()
    code = main(["validate", "--model", "unet", "--input", "1x3x16x16", "--schedule", str(schedule_path),
                 "--graph", str(graph_path), "--steps", "1"])
    assert code == ExitCode.REJECTED
    assert "was not extracted from this model and input" in capsys.readouterr().err


def test_a_chunked_loss_profile_validates_exact_on_its_loss_and_only_with_it(tmp_path, capsys):
    pytest.importorskip("transformers")
    graph_path, schedule_path = tmp_path / "g.json", tmp_path / "s.json"
    model = ["--model", "gpt2", "--input", "2x16", "--swap-dir", str(tmp_path / "swap")]
    assert main(["profile", *model, "--chunked-loss", "--no-refine", "-o", str(graph_path),
                 "--device-out", str(tmp_path / "d.json"), "--repeats", "1"]) == ExitCode.OK
    assert TrainingGraph.load(graph_path).model == "gpt2 (chunked loss)"
    assert main(["solve", str(graph_path), "--baseline", "checkpoint-all", "-o", str(schedule_path)]) == ExitCode.OK
    capsys.readouterr()
    run = ["validate", *model, "--schedule", str(schedule_path), "--graph", str(graph_path), "--steps", "1"]
    assert main([*run, "--chunked-loss", "--check-exact"]) == ExitCode.OK
    assert ("bit-identical to plain autograd (" in (out := capsys.readouterr().out)
            and "on the chunked loss, which is not bit-identical to plain cross-entropy" in out)
    assert main(run) == ExitCode.REJECTED
    assert "it is of 'gpt2 (chunked loss)', this is 'gpt2'" in capsys.readouterr().err


# -- the I/O timeline model ------------------------------------------------------------
def _paging_device(seconds_per_page: float) -> DeviceProfile:
    """Every transfer takes ``seconds_per_page`` (latency only): easy to count."""
    return replace(DeviceProfile.builtin("rpi4"), pagein_bandwidth_bps=1e18, pageout_bandwidth_bps=1e18,
                   pagein_latency_s=seconds_per_page, pageout_latency_s=seconds_per_page)


def test_timeline_without_paging_is_the_compute_time():
    graph = linear_graph(5)
    schedule = schedule_for(graph, list(plan(graph, "rpi4", method="store-all").schedule.instructions))
    for hidden in (0.0, 1.0):
        assert timeline_step_ms(graph, schedule, _paging_device(1.0), hidden) == pytest.approx(graph.total_compute_ms)


def test_timeline_waits_for_writes_before_freeing_and_charges_unhidden_io():
    graph = linear_graph(5)
    instructions = page_everything(graph)
    schedule = schedule_for(graph, instructions)
    writes = sum(op == "page_out" for op, _ in instructions)
    reads = sum(op == "page_in" for op, _ in instructions)
    slow = _paging_device(1.0)  # 1000 ms a page, far above any node's compute
    hidden = timeline_step_ms(graph, schedule, slow, 1.0)
    exposed = timeline_step_ms(graph, schedule, slow, 0.0)
    # page_everything frees each page right after writing it: every write is waited for
    assert hidden >= graph.total_compute_ms + 1000.0 * writes
    assert hidden <= graph.total_compute_ms + 1000.0 * (writes + reads)  # never worse than strictly serial
    assert exposed >= hidden
    fast = _paging_device(1e-9)
    assert timeline_step_ms(graph, schedule, fast, 0.0) == pytest.approx(graph.total_compute_ms, rel=1e-6)


def test_rss_prediction_adds_the_gradients_allocated_so_far(extracted):
    workload, graph, segments = extracted
    grads = gradient_bytes_per_node(workload.model, segments)
    params = sum(p.nbytes for p in workload.model.parameters())
    assert sum(grads) == params and all(grads[i] == 0 for i in range(segments.loss_node + 1))
    schedule = plan(graph, "rpi4", method="store-all").schedule
    p = predict(graph, schedule, None, grads)
    assert p.peak_bytes < p.rss_peak_bytes <= p.peak_bytes + params
    assert predict(graph, schedule).rss_peak_bytes == p.peak_bytes  # no gradients given: activations only
