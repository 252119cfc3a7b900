"""Energy per step in the executor's stats, per node class, and in ``poet-edge validate``'s table.

The meters are the real ones; only the outside world is faked: a clock that
moves a millisecond at every reading drives the nominal-power estimate (so
every tracked instruction costs exactly one tick at its class's power), and
a RAPL counter in a fake sysfs tree that nothing advances.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from engine.energy import EstimatedMeter, NominalPowers, RaplMeter
from engine.executor import Executor
from agent.zoo import load_workload
from common.cli import main
from common.exit_codes import ExitCode
from engine.extract import extract
from schedules.plan import plan
from tests.engine.energy.fakes import make_rapl_zone
from tests.engine.models import page_everything, schedule_for

TICK_S = 1e-3
POWERS = NominalPowers(idle_w=1.0, compute_w=10.0, memory_w=100.0)


class TickingClock:
    """Time that passes only when read: each reading is ``tick`` seconds after the last."""

    def __init__(self, tick: float = TICK_S) -> None:
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


@pytest.fixture(scope="module")
def extracted():
    """The zoo's U-Net at the input ``poet-edge validate --model unet --input 1x3x8x8`` builds."""
    work = load_workload("unet", (1, 3, 8, 8))
    return work, *extract(work.model, work.example, work.loss_fn, repeats=1, refine=False)


def _step(extracted, instructions, tmp_path: Path, meter=None):
    work, graph, segments = extracted
    schedule = schedule_for(graph, instructions)
    with Executor(work.model, segments, graph, schedule, swap_dir=tmp_path / "swap", meter=meter,
                  measure_rss=False) as ex:
        ex.step(work.inputs, work.targets)
        prefetches = sum(len(nodes) for nodes in ex.prefetch.values())
        written_behind = len(ex.io_plan.release_by)
    work.model.zero_grad(set_to_none=True)
    return ex.last_stats, prefetches, written_behind


def _frees_after_page_out(instructions) -> int:
    paged, count = set(), 0
    for op, node in instructions:
        if op == "page_out":
            paged.add(node)
        count += op == "free" and node in paged
    return count


def test_paging_step_charges_each_instruction_to_its_class(extracted, tmp_path):
    instructions = page_everything(extracted[1])
    stats, prefetches, behind = _step(extracted, instructions, tmp_path, EstimatedMeter(POWERS, clock=TickingClock()))
    energy = stats.energy
    assert energy is not None and energy.is_estimate and energy.source == "estimate from device profile"
    computes = sum(op == "compute" for op, _ in instructions)
    page_ins = sum(op == "page_in" for op, _ in instructions) + prefetches
    # a free whose value is written behind waits later, and only if its write is not done by then
    page_outs = sum(op == "page_out" for op, _ in instructions) + _frees_after_page_out(instructions) - behind
    assert page_ins > 0 and page_outs > 0
    # One tick per tracked instruction, at the power of its class: plain frees are charged to none.
    assert energy.joules["compute"] == pytest.approx(computes * TICK_S * 11.0)
    assert energy.joules["page_in"] == pytest.approx(page_ins * TICK_S * 101.0)
    ticks = energy.joules["page_out"] / (TICK_S * 101.0)
    assert ticks == pytest.approx(round(ticks)) and page_outs <= round(ticks) <= page_outs + behind
    assert energy.seconds["page_in"] > 0 and energy.seconds["page_out"] > 0  # wall time of the real waits
    assert sum(energy.joules.values()) + energy.untracked_joules == pytest.approx(energy.total_joules)
    assert 0 < energy.untracked_joules  # the executor's own work between instructions, at idle power at least
    assert energy.total_seconds > 0 and stats.bytes_paged > 0


def test_step_without_paging_has_no_paging_energy(extracted, tmp_path):
    graph = extracted[1]
    store_all = list(plan(graph, "rpi4", method="store-all").schedule.instructions)
    stats, _, _ = _step(extracted, store_all, tmp_path, EstimatedMeter(POWERS))
    energy = stats.energy
    assert energy.joules["page_in"] == energy.joules["page_out"] == 0.0
    assert energy.seconds["page_in"] == energy.seconds["page_out"] == 0.0
    assert energy.joules["compute"] > 0 and energy.seconds["compute"] > 0
    assert sum(energy.joules.values()) <= energy.total_joules
    assert energy.total_seconds >= stats.step_seconds  # the account's window holds the step's
    unmetered, _, _ = _step(extracted, store_all, tmp_path)
    assert unmetered.energy is None  # no meter, no figures: StepStats as before


def test_energy_travels_with_the_stats_as_json(extracted, tmp_path):
    stats, _, _ = _step(extracted, page_everything(extracted[1]), tmp_path, EstimatedMeter(POWERS))
    plain = json.loads(json.dumps(asdict(stats)))
    assert plain["energy"] == stats.energy.to_dict()
    assert set(plain["energy"]["joules"]) == {"compute", "page_in", "page_out"}


def test_a_counter_meter_that_does_not_move_reports_zero_everywhere(extracted, tmp_path):
    make_rapl_zone(tmp_path / "sys", "intel-rapl:0", "package-0", energy_uj=5_000_000)
    stats, _, _ = _step(extracted, page_everything(extracted[1]), tmp_path, RaplMeter(tmp_path / "sys"))
    energy = stats.energy
    assert not energy.is_estimate and "RAPL" in energy.source
    assert energy.total_joules == 0.0 and set(energy.joules.values()) == {0.0}
    assert energy.seconds["page_in"] > 0  # the classes' time is measured all the same


def test_validate_prints_energy_per_class_with_its_source(extracted, tmp_path, capsys):
    graph = extracted[1]
    graph_path, schedule_path = tmp_path / "g.json", tmp_path / "s.json"
    graph.save(graph_path)
    schedule_for(graph, page_everything(graph)).save(schedule_path)
    code = main(["validate", "--model", "unet", "--input", "1x3x8x8", "--schedule", str(schedule_path),
                 "--graph", str(graph_path), "--device", "rpi4", "--swap-dir", str(tmp_path / "swap"),
                 "--steps", "1", "--warmup", "0", "--meter", "estimate"])
    out = capsys.readouterr().out
    assert code == ExitCode.OK, out
    rows = {line.split("  ")[0].strip(): line for line in out.splitlines()}
    for name in ("energy", "energy compute", "energy page-in", "energy page-out"):
        predicted, measured, error = rows[name][len(name):].split()[:6:2]
        assert float(predicted) > 0 and float(measured) > 0 and error.endswith("%"), rows[name]
    assert "estimate from device profile" in rows["energy"]
    assert "energy source: estimate from device profile (estimate from nominal powers" in out
