"""The fallback estimate: nominal powers times measured time, labelled as such."""

from __future__ import annotations

import math

import pytest

from engine.energy.estimate import EstimatedMeter, NominalPowers
from engine.energy.meter import Activity
from tests.engine.energy.fakes import FakeClock

# idle 2 W; computing adds 3 W, paging adds 1 W (the device profile's above-idle convention)
POWERS = NominalPowers(idle_w=2.0, compute_w=3.0, memory_w=1.0)


def test_each_activity_is_charged_its_whole_board_power(clock: FakeClock) -> None:
    meter = EstimatedMeter(POWERS, clock=clock)
    meter.start()
    meter.set_activity(Activity.COMPUTE)
    clock.advance(2.0)  # 2 s x 5 W
    meter.set_activity(Activity.PAGE_IN)
    clock.advance(1.0)  # 1 s x 3 W
    meter.set_activity(Activity.PAGE_OUT)
    clock.advance(0.5)  # 0.5 s x 3 W
    meter.set_activity(Activity.IDLE)
    clock.advance(4.0)  # 4 s x 2 W
    assert meter.read_joules() == pytest.approx(10.0 + 3.0 + 1.5 + 8.0)


def test_measure_is_labelled_an_estimate(clock: FakeClock) -> None:
    meter = EstimatedMeter(POWERS, clock=clock)
    with meter, meter.measure() as m:
        clock.advance(1.5)
    assert (m.joules, m.seconds, m.is_estimate, m.source) == (3.0, 1.5, True, "estimate from device profile")
    assert meter.is_estimate and meter.name == "estimate"


def test_activity_names_from_the_executor_are_accepted(clock: FakeClock) -> None:
    meter = EstimatedMeter(POWERS, clock=clock)
    meter.set_activity("compute")  # type: ignore[arg-type]  # plain strings from a stats dict
    clock.advance(1.0)
    assert meter.read_joules() == pytest.approx(5.0)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_nonsense_powers_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="compute_w"):
        NominalPowers(idle_w=1.0, compute_w=bad, memory_w=1.0)
