"""Energy per step and per node class, with a counter meter, the estimate and a sampled meter."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.energy.account import StepEnergyAccount
from engine.energy.estimate import EstimatedMeter, NominalPowers
from engine.energy.meter import Activity
from engine.energy.rapl import RaplMeter
from tests.engine.energy.fakes import FakeClock, make_rapl_zone, write


def test_estimated_step_splits_by_node_class(clock: FakeClock) -> None:
    meter = EstimatedMeter(NominalPowers(idle_w=2.0, compute_w=3.0, memory_w=1.0), clock=clock)
    with StepEnergyAccount(meter, clock=clock) as account:
        with account.track(Activity.COMPUTE):
            clock.advance(2.0)  # 10 J
        clock.advance(0.5)  # executor overhead at idle power: 1 J
        with account.track(Activity.PAGE_OUT):
            clock.advance(1.0)  # 3 J
        with account.track(Activity.COMPUTE):
            clock.advance(1.0)  # 5 J
        with account.track(Activity.PAGE_IN):
            clock.advance(0.25)  # 0.75 J
    energy = account.result
    assert energy is not None
    assert energy.joules == {"compute": 15.0, "page_in": 0.75, "page_out": 3.0}
    assert energy.seconds == {"compute": 3.0, "page_in": 0.25, "page_out": 1.0}
    assert (energy.total_joules, energy.total_seconds) == (pytest.approx(19.75), 4.75)
    assert energy.untracked_joules == pytest.approx(1.0)
    assert energy.is_estimate and energy.to_dict()["source"] == "estimate from device profile"


def test_rapl_step_charges_counter_increments_to_their_class(tmp_path: Path, clock: FakeClock) -> None:
    counter = make_rapl_zone(tmp_path, "intel-rapl:0", "package-0", energy_uj=0) / "energy_uj"
    with StepEnergyAccount(RaplMeter(tmp_path, clock=clock), clock=clock) as account:
        with account.track(Activity.COMPUTE):
            write(counter, 4_000_000)
        write(counter, 4_500_000)  # between instructions
        with account.track(Activity.PAGE_IN):
            write(counter, 5_500_000)
    energy = account.result
    assert energy is not None
    assert energy.joules == pytest.approx({"compute": 4.0, "page_in": 1.0, "page_out": 0.0})
    assert (energy.total_joules, energy.untracked_joules, energy.is_estimate) == (5.5, pytest.approx(0.5), False)


def test_overlapping_or_non_node_tracks_are_refused(clock: FakeClock) -> None:
    meter = EstimatedMeter(NominalPowers(1.0, 1.0, 1.0), clock=clock)
    with StepEnergyAccount(meter, clock=clock) as account:
        with account.track(Activity.COMPUTE), pytest.raises(RuntimeError, match="twice"):
            with account.track(Activity.PAGE_OUT):
                pass
        with pytest.raises(ValueError, match="node class"):
            with account.track(Activity.IDLE):
                pass


def test_a_failed_step_still_reports_its_energy(clock: FakeClock) -> None:
    meter = EstimatedMeter(NominalPowers(idle_w=1.0, compute_w=1.0, memory_w=0.0), clock=clock)
    account = StepEnergyAccount(meter, clock=clock)
    with pytest.raises(MemoryError), account:
        with account.track(Activity.COMPUTE):
            clock.advance(3.0)
            raise MemoryError("page-in failed")
    assert account.result is not None and account.result.joules["compute"] == pytest.approx(6.0)
